"""The executor's two ways to run a container: as a process, or in podman as the rendered pod would."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nvrx_eks.kitcore.pins import TRAINER_UID
from nvrx_eks.localrun.runtimes import RUNC, ContainerSpec, Podman, Processes

POD_SPEC = {
    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    "containers": [{"name": "trainer", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
}
CONTAINER = {
    "name": "trainer",
    "securityContext": {
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    },
}


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_processes_run_the_command_as_prepared_with_the_project_on_the_path(tmp_path):
    argv, env = Processes(project_dir=tmp_path).command(
        ["python", "-m", "training"], {"A": "1"}, ContainerSpec(container=CONTAINER)
    )
    assert (argv, env) == (["python", "-m", "training"], {"A": "1", "PYTHONPATH": str(tmp_path)})


def test_podman_runs_the_same_command_in_the_image_as_the_pod_would(tmp_path):
    volume, tmp, chaos = tmp_path / "fsx", tmp_path / "tmp", tmp_path / "chaos"
    memory = Path("/dev/shm/nvrx-eks-local/test-run") / tmp_path.name / "checkpoint-memory"
    env = {**os.environ, "TMPDIR": str(tmp), "NVRX_EKS_LOCAL_POD": "run/pod", "NODE_RANK": "1"}
    env["PATH"] = "/venv/bin:" + os.environ["PATH"]
    runtime = Podman(trainer_image="train:x", store_image="store:x")
    argv, _ = runtime.command(
        ["python", "-m", "nvrx_eks.training.resilience.launch", f"--run-dir={volume}/runs"],
        env,
        ContainerSpec(container=CONTAINER, pod_spec=POD_SPEC, folders=[volume, chaos, memory], run_key="run"),
    )
    shutil.rmtree(memory.parents[1], ignore_errors=True)
    assert argv[:4] == ["podman", "--runtime", RUNC, "run"]
    assert _pairs(argv, "--user") == [f"{TRAINER_UID}:{TRAINER_UID}"]
    assert {"--read-only", "--read-only-tmpfs=false"} <= set(argv)
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert _pairs(argv, "--network") == ["host"]  # the executor's loopback names and ports hold inside
    # Each folder at its own path, so the executor's rewritten paths hold inside, the memory tier's
    # under the machine's /dev/shm too; /dev/shm itself is the container's own, as a pod's is (the
    # machine's kept the semaphores of every resource tracker a container's end killed).
    assert set(_pairs(argv, "--volume")) == {f"{p}:{p}:rw" for p in (volume, chaos, tmp, memory)}
    assert "/dev/shm:/dev/shm:rw" not in _pairs(argv, "--volume")
    assert _pairs(argv, "--shm-size") == ["1g"]
    # Only what the pod and the executor set: never this machine's PATH or environment.
    inner = dict(item.split("=", 1) for item in _pairs(argv, "--env"))
    assert inner == {"TMPDIR": str(tmp), "NVRX_EKS_LOCAL_POD": "run/pod", "NODE_RANK": "1", "HOME": str(tmp)}
    image_at = argv.index("train:x")
    assert argv[image_at + 1 :] == [
        "python",
        "-m",
        "nvrx_eks.training.resilience.launch",
        f"--run-dir={volume}/runs",
    ]


def test_podman_runs_the_store_pod_from_the_store_image(tmp_path):
    argv, _ = Podman(trainer_image="train:x", store_image="store:x").command(
        ["python", "-m", "nvrx_eks.training.resilience.control"],
        {"TMPDIR": str(tmp_path)},
        ContainerSpec(
            container={"name": "store", "securityContext": {"runAsUser": 65534}}, store=True, run_key="run"
        ),
    )
    assert "store:x" in argv
    assert "train:x" not in argv
    assert _pairs(argv, "--user") == ["65534:65534"]


def test_local_run_names_its_runtimes_and_refuses_others(tmp_path):
    import typer  # noqa: PLC0415
    from typer.testing import CliRunner  # noqa: PLC0415

    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415
    from nvrx_eks.localrun.commands import register  # noqa: PLC0415

    app, local, bench = typer.Typer(), typer.Typer(), typer.Typer()
    app.add_typer(local, name="local")
    register(app=app, local=local, bench=bench)
    result = CliRunner().invoke(app, ["local", "run", str(tmp_path), "--runtime", "docker"])
    assert isinstance(result.exception, UserError)
    assert "--runtime 'docker': one of processes, warm, podman" in str(result.exception)
