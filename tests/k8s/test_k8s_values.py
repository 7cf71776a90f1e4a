"""Each bad-values case ends in one message naming the field (and exit code 2 from the CLI)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "k8s" / "values" / "local-cpu.yaml"
P5 = LOCAL.with_name("p5-2.yaml")


@pytest.mark.parametrize(
    ("values", "overrides", "message"),
    [
        (LOCAL, ["num_nodes=0"], "num_nodes: Input should be greater than or equal to 1"),
        (LOCAL, ["spares=-1"], "spares: Input should be greater than or equal to 0"),
        (LOCAL, ["instance_profile=p9.huge"], "instance_profile: unknown instance type 'p9.huge'"),
        (LOCAL, ["mode=elastic"], "mode: Input should be 'baseline', 'inprocess', 'ft_launcher' or 'both'"),
        (LOCAL, ["name=Bad_Name"], "name: 'Bad_Name' must be a DNS label"),
        (
            LOCAL,
            ["budgets.inprocess_max_iterations=10"],
            "inprocess_max_iterations (10) must be below launcher_max_restarts (10)",
        ),
        (
            LOCAL,
            ["budgets.job_backoff_limit_per_index=10"],
            "launcher_max_restarts (10) must be below job_backoff_limit_per_index (10)",
        ),
        (
            LOCAL,
            ["budgets.expected_node_losses=11", "budgets.job_backoff_limit_per_index=13"],
            "launcher_max_restarts (10) must cover expected_node_losses (11)",
        ),
        (
            LOCAL,
            ["storage.memory_tier_gib=3"],
            "storage.memory_tier_gib: /dev/shm (1 GiB) + memory tier (3 GiB) exceed the pod's memory (3 GiB",
        ),
        (
            LOCAL,
            ["trainer.checkpoint.memory_dir=/dev/shm/x"],
            "trainer.checkpoint.memory_dir: set by the chart",
        ),
        (LOCAL, ["timeouts.rdzv_join_s=30"], "rdzv_join_s (30) must exceed pod_reschedule_s (60)"),
        # NVRx refuses these only once every pod's agent starts (a zero last call), or truncates them.
        (
            LOCAL,
            ["timeouts.rdzv_last_call_s=0"],
            "rdzv_last_call_s: Input should be greater than or equal to 1",
        ),
        (LOCAL, ["timeouts.rdzv_close_s=0.5"], "rdzv_close_s: Input should be a valid integer"),
        # A restart round must wait for a node that is only stopping its workers, or a spare takes it.
        (
            LOCAL,
            ["spares=1", "timeouts.rdzv_last_call_s=2"],
            "rdzv_last_call_s (2) must be at least workers_stop_s (5) with spares",
        ),
        (LOCAL, ["timeouts.rdzv_poll_s=0"], "timeouts.rdzv_poll_s: Extra inputs are not permitted"),
        (
            LOCAL,
            ["timeouts.launcher_initial_heartbeat_s=3"],
            "launcher_initial_heartbeat_s (3) must be at least launcher_heartbeat_s (3.5)",
        ),
        # One supported range: the pin's minor and newer (older launchers take other flags).
        (P5, ["nvrx_version=0.6.0"], "nvrx_version 0.6.0: the kit supports NVRx 0.7 and newer"),
        (LOCAL, ["nvrx_version=0.4.1"], "nvrx_version 0.4.1: the kit supports NVRx 0.7 and newer"),
        (LOCAL, ["nvrx_version=banana"], "nvrx_version 'banana' is not a version number"),
        (LOCAL, ["instance_profile=p5.48xlarge"], "image: local runs on this machine's CPUs"),
        (LOCAL, ["env.AWS_SECRET_ACCESS_KEY=x"], "AWS_SECRET_ACCESS_KEY looks like a secret"),
        (LOCAL, ["trainer.run_dir=/tmp/x"], "trainer.run_dir: set by the chart"),
        # A script's own setting in the kit's section: named, with where it goes.
        (
            LOCAL,
            ["trainer.model=gigantic"],
            (
                "trainer.model: not one of the kit's fields (mode, seed, run_dir, dist, checkpoint, "
                "inprocess, ft, faults, metrics, parallel, shrink); a script's own setting is its argument: "
                "entrypoint.args, e.g. [--model, gigantic]"
            ),
        ),
        (LOCAL, ["trainer.no_such_flag=1"], "entrypoint.args, e.g. [--no-such-flag, 1]"),
        (
            LOCAL,
            ["timeouts.launcher_heartbeat_s=3"],
            "launcher_heartbeat_s (3) must exceed the longest silence of a rank recovering in process",
        ),
        (LOCAL, ["storage.fsx_mount_path=fsx"], "storage.fsx_mount_path: 'fsx' must be an absolute path"),
        # Names the API server, the registry or S3 would refuse (after the job is rendered and applied).
        (P5, ["image=ECR/Repo:v1"], "image: 'ECR/Repo:v1' is not an image reference"),
        (P5, ["image=repo:tag with space"], "is not an image reference"),
        (P5, ["image=repo@sha256:abc"], "is not an image reference"),
        (P5, ["storage.s3_bucket=My_Bucket"], "storage.s3_bucket: 'My_Bucket' is not an S3 bucket name"),
        (P5, ["storage.s3_bucket=a..b"], "no two adjacent periods"),
        (P5, ["storage.s3_bucket=192.168.0.1"], "not formatted as an IP address"),
        (P5, ["storage.s3_bucket=ckpt--ol-s3"], "not a reserved prefix"),
        # The trainer's AWS SDK learns its Region only from the job values (no instance metadata).
        (P5, ["aws_region=us-east"], "aws_region: 'us-east' is not an AWS Region code (e.g. us-east-1)"),
        (P5, ["aws_region=US-EAST-1"], "aws_region: 'US-EAST-1' is not an AWS Region code"),
        (
            P5,
            ["aws_region=null"],
            "aws_region is missing: the durable tier writes to s3://nvrx-eks-checkpoints-",
        ),
        (LOCAL, ["storage.s3_bucket=ckpt-bucket"], "aws_region is missing"),
        (P5, ["env.AWS_REGION=eu-west-1"], "AWS_REGION is set by the chart from aws_region"),
        (LOCAL, ["env.AWS_DEFAULT_REGION=eu-west-1"], "move it there: aws_region: eu-west-1"),
        # Shrink: a minimum the job cannot go down to, a layout that cannot run there, a setting that
        # cannot shrink, a wait the rendezvous would not last, a restart budget it would spend.
        (LOCAL, ["shrink.min_nodes=2"], "shrink.min_nodes (2) must be below num_nodes (2)"),
        (LOCAL, ["shrink.min_nodes=0"], "shrink.min_nodes: Input should be greater than or equal to 1"),
        (
            LOCAL,
            ["shrink.min_nodes=1", "mode=baseline"],
            "shrink.min_nodes is set with mode baseline, which has no ft_launcher",
        ),
        (
            P5,
            ["shrink.min_nodes=1", "trainer.parallel.mesh={dp: -1, tp: 16}"],
            "trainer.parallel.mesh {dp: -1, tp: 16} cannot run on 1 node(s) of 8 ranks",
        ),
        (
            P5,
            ["shrink.min_nodes=1", "trainer.parallel.mesh={dp: 2, tp: 8}"],
            "give the mesh one size -1 (data parallelism)",
        ),
        (
            LOCAL,
            ["shrink.min_nodes=1"],
            "shrink.pending_limit_s (600) must be below timeouts.rdzv_join_s (300)",
        ),
        (
            LOCAL,
            ["shrink.min_nodes=1", "shrink.pending_limit_s=5", "trainer.checkpoint.durable_every=0"],
            "without it the job would start over; set durable_every",
        ),
        (
            LOCAL,
            ["shrink.min_nodes=1", "shrink.pending_limit_s=5", "budgets.launcher_max_restarts=3"],
            "must cover two restart rounds per expected node loss (2)",
        ),
        (LOCAL, ["service_account=Trainer_SA"], "service_account: 'Trainer_SA' is not a Kubernetes name"),
        (LOCAL, ["storage.fsx_pvc=FSx"], "storage.fsx_pvc: 'FSx' is not a Kubernetes name"),
        (LOCAL, ["priority_class=-x"], "priority_class: '-x' is not a Kubernetes name"),
        (LOCAL, ["env.1BAD=x"], "env: '1BAD' is not an environment variable name"),
        (LOCAL, ["env.HAS SPACE=x"], "'HAS SPACE' is not an environment variable name"),
        (LOCAL, ["secret_env.9X={secret: s, key: k}"], "'9X' is not an environment variable name"),
        (LOCAL, ["secret_env.HF_TOKEN={secret: Bad_Name, key: k}"], "secret: 'Bad_Name' is not a Kubernetes"),
        (LOCAL, ["gpu_node_selector.health=not ok"], "health: 'not ok' is not a Kubernetes label value"),
        (LOCAL, ["gpu_node_selector.bad key=x"], "label key 'bad key'"),
        (
            LOCAL,
            ["system_node_selector.Bad_Prefix/x=y"],
            "the prefix 'Bad_Prefix' must be a lowercase DNS subdomain",
        ),
        (LOCAL, ["kueue_queue=" + "q" * 64], "is not a Kubernetes label value"),
        # Devices the instance profile cannot give the pod.
        (
            LOCAL,
            ["trainer.dist.device=cuda"],
            "trainer.dist.device is cuda, but instance_profile local-cpu has no GPUs",
        ),
        (
            LOCAL,
            ["env.FI_PROVIDER=efa"],
            "FI_PROVIDER ask for EFA, but instance_profile local-cpu has 0 EFA devices",
        ),
        (LOCAL, ["env.FI_EFA_USE_DEVICE_RDMA=1"], "has 0 EFA devices"),
        # A rank the job lacks, two faults on one rank and step (a fault past the script's steps is its
        # ranks' to refuse: only they know the steps).
        (
            LOCAL,
            ["trainer.faults.plan=sigkill@5:4"],
            "faults.plan: 'sigkill@5:4' targets rank 4, but the job has ranks 0..3",
        ),
        (LOCAL, ["trainer.faults.plan=hang@5:1,oom@5:1"], "hit rank 1 at the same step"),
        (
            LOCAL,
            ["trainer.faults.count=1", "trainer.faults.target_rank=9"],
            "faults.target_rank (9) is not a rank",
        ),
    ],
)
def test_bad_values_message(values, overrides, message):
    with pytest.raises(UserError) as info:
        load_values(values, overrides)
    assert message in str(info.value)


def test_all_example_values_load():
    for path in sorted(LOCAL.parent.glob("*.yaml")):
        assert load_values(path).num_nodes >= 1


def test_local_image_uses_installed_nvrx_and_p5_uses_pin():
    installed = metadata.version("nvidia-resiliency-ext")
    assert load_values(LOCAL).resolved_nvrx_version == installed
    assert load_values(P5).resolved_nvrx_version == IMAGE.nvrx_version


def test_the_local_install_is_the_images_nvrx_pin():
    """`make setup` installs constraints.txt's NVRx: it must be the image's (one pin, run where tested)."""
    pins = dict(
        line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line
    )
    assert pins["nvidia-resiliency-ext"] == IMAGE.nvrx_version
    assert metadata.version("nvidia-resiliency-ext") == IMAGE.nvrx_version


def test_cli_bad_values_exit_2_without_traceback(tmp_path, nvrx_eks):
    render = ("job", "render", "-f", str(LOCAL), "-o", str(tmp_path))
    proc = nvrx_eks(*render, "--set", "num_nodes=0", timeout=120)
    assert proc.returncode == 2
    assert "num_nodes" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_render_onto_a_file_is_one_message(tmp_path, nvrx_eks):
    target = tmp_path / "manifests.yaml"
    target.write_text("keep me\n")
    for out, message in ((target, "is a file"), (target / "sub", f"is below {target}, which is a file")):
        proc = nvrx_eks("job", "render", "-f", str(LOCAL), "-o", str(out), timeout=120)
        assert proc.returncode == 2, proc.stderr
        # The error as one line: typer's error box and its line wrapping removed.
        assert message in re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", proc.stderr))
        assert "'-o' / '--out'" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert "jsii" not in proc.stderr
    assert target.read_text() == "keep me\n"


def test_values_without_a_collective_timeout_use_the_trainers_default():
    """dist.timeout_s unset: the heartbeat check uses the trainer's default for the mode (was a TypeError)."""
    values = load_values(LOCAL, ["trainer.dist.timeout_s=null"])
    assert values.mode == "both"
    with pytest.raises(UserError, match=r"must exceed the longest silence .* = 3\)"):
        load_values(LOCAL, ["trainer.dist.timeout_s=null", "timeouts.launcher_heartbeat_s=3"])


@pytest.mark.parametrize(
    "region", ["us-east-1", "eu-central-2", "us-gov-west-1", "cn-northwest-1", "ap-southeast-5"]
)
def test_every_rendered_pod_carries_the_region_of_the_values(region, tmp_path):
    """Both variables the SDKs read, in the trainer and its self-check, from `aws_region` alone."""
    import yaml  # noqa: PLC0415

    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415

    files = render(load_values(P5, [f"aws_region={region}"]), str(tmp_path))
    docs = [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    # The folder owner and the topology reader call no AWS API (the reader calls Kubernetes').
    containers = [
        c for c in pod["containers"] + pod["initContainers"] if c["name"] not in {"own-dirs", "topology"}
    ]
    assert [c["name"] for c in containers] == ["trainer", "selfcheck"]
    for container in containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["AWS_REGION"], env["AWS_DEFAULT_REGION"]) == (region, region)


def test_a_job_without_s3_needs_no_region(tmp_path):
    values = load_values(P5, ["aws_region=null", "storage.s3_bucket=null"])
    assert values.aws_region is None
