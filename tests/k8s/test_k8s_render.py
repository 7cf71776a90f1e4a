"""Rendered manifests: schema-valid (Kubernetes 1.33, strict), golden, and parseable by the real parsers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from nvidia_resiliency_ext.fault_tolerance.control_plane import get_args_parser as control_parser
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.launcher import FT_LAUNCHER
from nvrx_eks.k8s.load import load_values
from nvrx_eks.training.config import parse_args
from nvrx_eks.training.node import selfcheck
from nvrx_eks.training.resilience.config import CONFIG_ENV, ResilienceConfig, config_from_env
from nvrx_eks.training.resilience.launch import COLLATERAL_EXIT_CODE, entry_script, launcher_argv
from nvrx_eks.training.resilience.shrink import SHRINK_ENV

ROOT = Path(__file__).resolve().parents[2]
VALUES = sorted((ROOT / "k8s" / "values").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.33"


def _render(values_file: Path, out: Path, *overrides: str) -> list[dict]:
    files = render(load_values(values_file, list(overrides)), str(out))
    return [doc for f in files for doc in yaml.safe_load_all(Path(f).read_text()) if doc]


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("render")
    return {v.stem: _render(v, out / v.stem) for v in VALUES}


def test_example_values_exist():
    assert {v.stem for v in VALUES} >= {"local-cpu", "p5-2", "p5-8", "p5-16"}


def test_every_object_validates_against_k8s_schema(rendered):
    for docs in rendered.values():
        # 3 NetworkPolicies, the store's ServiceAccount, Deployment and Service, the nodes Service, the Job
        assert len(docs) == 8
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_job_shape(rendered):
    for name, docs in rendered.items():
        (job,) = _by_kind(docs, "Job")
        spec = job["spec"]
        nodes = int(name.split("-")[-1]) if name.startswith("p5") else 2
        assert spec["completionMode"] == "Indexed"
        assert spec["completions"] == spec["parallelism"] == nodes
        assert spec["podReplacementPolicy"] == "Failed"
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        # First match wins: a config error (2) from any container fails the Job; the self-check's node
        # problem (75), a launcher whose ranks were only stopped after a peer failed (76) and a disruption
        # replace the pod without consuming the budget.
        assert spec["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 93]}},
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": "selfcheck", "operator": "In", "values": [75]},
            },
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": "trainer",
                    "operator": "In",
                    "values": [COLLATERAL_EXIT_CODE],
                },
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
        (headless,) = [
            s for s in _by_kind(docs, "Service") if s["metadata"]["name"] == job["metadata"]["name"]
        ]
        assert job["spec"]["template"]["spec"]["subdomain"] == headless["metadata"]["name"]


def test_p5_pod_resources_from_profile(rendered):
    (job,) = _by_kind(rendered["p5-16"], "Job")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    # Non-root, no capability: an added one would not reach a non-root process (k8s/job_chart.py).
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Gi"}
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    owner, check, topology = pod["initContainers"]
    assert (owner["name"], check["name"], topology["name"]) == ("own-dirs", "selfcheck", "topology")
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # NVRx's per-node identity in its rendezvous: the pod's index, stable across worker restarts.
    indexes = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert indexes["GROUP_RANK"] == indexes["NODE_RANK"]
    assert "job-completion-index" in indexes["GROUP_RANK"]
    # The self-check sees what the ranks will: the same devices, env and mounts (all but the topology
    # file, which the topology init container writes after it).
    assert check["resources"] == c["resources"]
    # ... and its node's name, under which it records a node problem for the other pods to compare.
    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert check["env"] == [*(e for e in c["env"] if e["name"] != "NVRX_EKS_TOPOLOGY_FILE"), node_name]
    assert check["volumeMounts"] == [m for m in c["volumeMounts"] if m["name"] != "topology"]
    assert env["NVRX_EKS_INSTANCE_PROFILE"] == "p5.48xlarge"
    # Host RAM tier: the pod's own tmpfs, a quarter of the profile's memory, plus /dev/shm within the limit.
    tier = next(v for v in pod["volumes"] if v["name"] == "checkpoint-memory")
    assert tier["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Gi"}
    assert c["resources"]["limits"]["memory"] == "1843Gi"


def test_memory_tier_is_a_pod_emptydir_at_the_trainers_memory_dir(rendered):
    (job,) = _by_kind(rendered["local-cpu"], "Job")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "checkpoint-memory")
    volume = next(v for v in pod["volumes"] if v["name"] == "checkpoint-memory")
    assert volume["emptyDir"]["medium"] == "Memory"
    _, config, _ = _split(c)
    assert str(config.checkpoint.memory_dir) == mount["mountPath"]
    # Set explicitly, so the trainer does not move it to a host-wide /dev/shm folder of the run.
    assert config.effective_checkpoint().memory_dir == config.checkpoint.memory_dir


def test_selfcheck_runs_first_and_is_handed_the_checkpointer_the_ranks_build(rendered):
    (job,) = _by_kind(rendered["local-cpu"], "Job")
    pod = job["spec"]["template"]["spec"]
    assert [i["name"] for i in pod["initContainers"]] == ["selfcheck", "topology"]
    check = pod["initContainers"][0]
    _, config, _ = _split(pod["containers"][0])
    # `--store`: where a node problem is compared with the other nodes' (training/node/repeats.py).
    assert check["command"] == [
        "python",
        "-m",
        "nvrx_eks.training.node.selfcheck",
        "--store=nvrx-local-rdzv:29400",
    ]
    # The self-check reads the ranks' settings from the env it shares with them (NVRX_EKS_CONFIG), and
    # proves the very tiers their checkpointer is built with.
    env = {e["name"]: e.get("value") for e in check["env"]}
    args = selfcheck.parse_args(check["command"][3:], env)
    want = config.effective_checkpoint()
    assert selfcheck.checkpoint_config(args, env) == want
    assert (want.local_dir, want.durable_dir) == (
        Path("/local/checkpoints/nvrx-local"),
        "/fsx/durable/nvrx-local",
    )
    assert env["NVRX_EKS_INSTANCE_PROFILE"] == "local-cpu"
    # A failed check's verdict line is the pod's termination message, which `job status` shows.
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_store_is_separate_and_prioritized(rendered):
    (deploy,) = _by_kind(rendered["p5-2"], "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "nvrx-rendezvous-store"
    assert pod["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "system"}
    (store,) = pod["containers"]
    # NVRx's own control process hosts the store and closes the rounds: parsed by its real parser.
    assert store["command"][:3] == ["python", "-m", "nvrx_eks.training.resilience.control"]
    control = control_parser().parse_args(store["command"][3:])
    assert control.rdzv_endpoint == "0.0.0.0:29400"
    assert control.rdzv_id == "llama-8b-p5-2"
    assert control.nnodes == "2:2"
    assert store["ports"][0]["containerPort"] == 29400
    (job,) = _by_kind(rendered["p5-2"], "Job")
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--rdzv-endpoint=llama-8b-p5-2-rdzv:29400" in cmd
    assert any(a.startswith("--rdzv-conf=is_host=0,join_timeout=1800") for a in cmd)


def _split(container: dict) -> tuple[list[str], ResilienceConfig, list[str]]:
    """A rendered trainer container's launcher args (as the launcher receives them), its ranks' kit
    section (their NVRX_EKS_CONFIG, as every script reads it) and the script's own args, from
    `torchrun ... -m MODULE ARGS` or `python -m nvrx_eks.training.resilience.launch ... -- -m MODULE ARGS`."""
    command = container["command"]
    config = config_from_env({e["name"]: e["value"] for e in container["env"] if "value" in e})
    if command[0] == "torchrun":
        return command[1:], config, command[command.index("-m") + 2 :]
    assert command[: len(FT_LAUNCHER)] == list(FT_LAUNCHER), command
    return launcher_argv(command[len(FT_LAUNCHER) :]), config, command[command.index("--") + 3 :]


@pytest.mark.parametrize("mode", ["baseline", "inprocess", "ft_launcher", "both"])
def test_args_parse_with_trainer_and_ft_launcher(tmp_path, mode):
    docs = _render(VALUES[0].parent / "local-cpu.yaml", tmp_path, f"mode={mode}")
    (job,) = _by_kind(docs, "Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    launcher, config, script = _split(c)
    assert c["command"][0] == ("torchrun" if mode == "baseline" else FT_LAUNCHER[0])
    assert parse_args(script).steps == 80
    assert config.mode == mode
    assert str(config.run_dir) == "/fsx/runs/nvrx-local"
    args = get_args_parser().parse_args(launcher)
    if mode == "baseline":
        assert args.module
        assert args.training_script == "nvrx_eks.training"
    else:  # forked from the warm forkserver, the entry point as a callable (resilience/launch.py)
        assert args.run_path
        assert args.start_method == "forkserver"
        assert args.training_script == entry_script()
        assert args.training_script_args[:2] == ["--module", "nvrx_eks.training"]
    assert args.nnodes == "2:2"
    assert args.nproc_per_node == "2"
    assert args.max_restarts == 10
    if mode != "baseline":
        assert float(args.ft_rank_heartbeat_timeout) == 3.5
        # Deadlock detection at heartbeat timeout + check interval, not + NVRx's 5 s default.
        assert float(args.ft_workload_check_interval) == 0.2
        assert config.ft.heartbeat_timeout_floor_s == 3.5
        assert args.ft_restart_policy == "any-failed"


def test_p5_args_parse_with_trainer(rendered):
    (job,) = _by_kind(rendered["p5-8"], "Job")
    _, config, script = _split(job["spec"]["template"]["spec"]["containers"][0])
    assert parse_args(script).model == "8b"
    assert config.inprocess.max_iterations == 3


def test_golden_local_cpu(rendered, request):
    """The reference configuration renders byte-for-byte as committed (update: UPDATE_GOLDEN=1)."""
    text = "---\n".join(yaml.safe_dump(d, sort_keys=True) for d in rendered["local-cpu"])
    golden = GOLDEN / "local-cpu.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.read_text() == text, "rendered manifests changed; review and rerun with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("values_name", ["local-cpu", "p5-2"])
def test_hot_spares_are_pods_of_the_job_counted_in_max_nodes(tmp_path, values_name):
    docs = _render(ROOT / "k8s" / "values" / f"{values_name}.yaml", tmp_path, "spares=1")
    (job,) = _by_kind(docs, "Job")
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 2}]}
    # NVRx's barrier rendezvous: max = active + standby, and the control process selects the actives.
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert "--nnodes=2:3" in command
    (deploy,) = _by_kind(docs, "Deployment")
    assert "--nnodes=2:3" in deploy["spec"]["template"]["spec"]["containers"][0]["command"]


def test_the_p5_16_job_with_shrink_renders_valid_and_tells_the_store_and_every_rank(tmp_path):
    """The p5-16 example's commented `shrink` block, turned on: schema-valid manifests; the store's control
    process and every rank get the node counts the layout runs at, from 15 down to the minimum."""
    docs = _render(
        ROOT / "k8s" / "values" / "p5-16.yaml", tmp_path, "shrink.min_nodes=12", "shrink.pending_limit_s=900"
    )
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (deploy,) = _by_kind(docs, "Deployment")
    store_env = {
        e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    expected = {"nodes": 16, "node_counts": [15, 14, 13, 12], "after_s": 900.0, "grow_wait_s": 1800.0}
    assert json.loads(store_env[SHRINK_ENV]) == expected
    (job,) = _by_kind(docs, "Job")
    trainer = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    rank_env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert config_from_env({CONFIG_ENV: rank_env[CONFIG_ENV]}).shrink.model_dump() == expected
    # Off by default: nothing of it reaches the store.
    plain = _render(ROOT / "k8s" / "values" / "p5-16.yaml", tmp_path / "plain")
    (deploy,) = _by_kind(plain, "Deployment")
    assert SHRINK_ENV not in {e["name"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}


def _launcher_shape(docs: list[dict]) -> dict[str, list[str]]:
    """Each container's command with values reduced to their flag names (sizes and timeouts dropped)."""
    shape = {}
    for kind in ("Job", "Deployment"):
        (obj,) = _by_kind(docs, kind)
        pod = obj["spec"]["template"]["spec"]
        # The launchers' containers (the folder owner exists for container images only).
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            if c["name"] not in {"selfcheck", "trainer", "store"}:
                continue
            command = c["command"]
            # Up to the training script: the renderer's `--` (ft_launcher), torchrun's `-m`.
            torchrun = command[0] == "torchrun"
            cut = command.index("--") if "--" in command else command.index("-m") if torchrun else None
            launcher = command[:cut]
            flags = [arg.split("=")[0] for arg in launcher]
            conf = next((a for a in launcher if a.startswith("--rdzv-conf=")), "")
            conf_keys = [item.split("=")[0] for item in conf.removeprefix("--rdzv-conf=").split(",")]
            shape[c["name"]] = [*flags, *conf_keys]
    return shape


def test_the_local_job_runs_the_p5_jobs_launcher_flags(tmp_path):
    """The local job is the p5 job with only sizes and timeouts changed: the same NVRx (the image's pin
    is installed here), the same flags for the store, the self-check and the launcher."""
    local = load_values(ROOT / "k8s" / "values" / "local-cpu.yaml")
    p5 = load_values(ROOT / "k8s" / "values" / "p5-2.yaml")
    assert local.resolved_nvrx_version == p5.resolved_nvrx_version
    local_shape = _launcher_shape(_render(ROOT / "k8s" / "values" / "local-cpu.yaml", tmp_path / "l"))
    p5_shape = _launcher_shape(_render(ROOT / "k8s" / "values" / "p5-2.yaml", tmp_path / "p"))
    assert local_shape == p5_shape


def test_the_peer_replicas_failure_domain_is_the_nodes_zone_and_network_nodes_and_the_job_says_so(
    rendered, tmp_path
):
    (job,) = _by_kind(rendered["p5-16"], "Job")
    template = job["spec"]["template"]
    pod = template["spec"]
    (trainer,) = pod["containers"]
    (domain,) = [e for e in trainer["env"] if e["name"] == "NVRX_EKS_FAILURE_DOMAIN"]
    # The fallback: the zone, copied onto the pod from its node by PodTopologyLabels (1.35: beta, on).
    assert domain["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}
    }
    assert template["metadata"]["annotations"]["nvrx-eks.io/peer-failure-domain-labels"].split(",") == [
        "topology.kubernetes.io/zone",
        *(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4)),
    ]
    # The network-node labels are the Node's only: the last init container reads its own Node (by the
    # downward API's spec.nodeName) and writes them where the trainer reads them, read-only.
    topology = pod["initContainers"][-1]
    assert topology["command"][:3] == ["python", "-m", "nvrx_eks.training.node.topology"]
    args = dict(a.removeprefix("--").split("=", 1) for a in topology["command"][3:])
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in topology["env"]} == {
        "NODE_NAME": "spec.nodeName"
    }
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["NVRX_EKS_TOPOLOGY_FILE"] == args["out"]
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in [topology, trainer]}
    written = next(m for m in mounts["topology"].values() if args["out"].startswith(m["mountPath"] + "/"))
    assert not written.get("readOnly")
    assert mounts["trainer"][written["name"]]["mountPath"] == written["mountPath"]
    assert mounts["trainer"][written["name"]]["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == written["name"])
    assert "emptyDir" in volume
    # Its token and the cluster's CA, where --token-dir points, from the pod's service account.
    token = next(m for m in mounts["topology"].values() if m["mountPath"] == args["token-dir"])
    sources = next(v for v in pod["volumes"] if v["name"] == token["name"])["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 600} in [s.get("serviceAccountToken") for s in sources]
    assert {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]} in [
        s.get("configMap") for s in sources
    ]
    assert pod["serviceAccountName"] == "nvrx-trainer"
    # No replica, no domain: nothing to choose partners for, no reader, no token.
    docs = _render(ROOT / "k8s" / "values" / "p5-2.yaml", tmp_path, "storage.peer_replicas=0")
    (job,) = _by_kind(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert not {"NVRX_EKS_FAILURE_DOMAIN", "NVRX_EKS_TOPOLOGY_FILE"} & {e["name"] for e in trainer["env"]}
    assert [c["name"] for c in pod["initContainers"]] == ["own-dirs", "selfcheck"]
    assert not any("projected" in v for v in pod["volumes"])
