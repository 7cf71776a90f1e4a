"""`python -m nvrx_eks.training.node.selfcheck`: CPU mode on this machine; GPU/EFA nodes from faked device
trees; the job's checkpointer started on real folders."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import get_profile
from nvrx_eks.training.node import selfcheck
from nvrx_eks.training.node.selfcheck import NODE_PROBLEM_EXIT_CODE, Node, Status, TorchInfo
from nvrx_eks.training.resilience import nvrx_compat
from nvrx_eks.training.resilience.config import CONFIG_ENV

if TYPE_CHECKING:
    from nvrx_eks.training.checkpoint.config import CheckpointConfig

REPO = Path(__file__).resolve().parents[2]
P5 = get_profile("p5.48xlarge")
INSTALLED_NVRX = metadata.version("nvidia-resiliency-ext")


def _selfcheck(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m nvrx_eks.training.node.selfcheck ARGS` in a fresh interpreter, without this shell's
    NVRX_EKS_* env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVRX_EKS_")}
    return subprocess.run(
        [sys.executable, "-m", "nvrx_eks.training.node.selfcheck", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env=env | {"COLUMNS": "200"},
    )


def _job_config(tmp_path: Path, **checkpoint: str) -> str:
    """A job's configuration as the chart hands it to the self-check: the run folder and the tiers."""
    tiers = {"memory_dir": "memory", "local_dir": "nvme", "durable_dir": "fsx"} | checkpoint
    document = {
        "run_dir": str(tmp_path / "run"),
        "checkpoint": {field: str(tmp_path / folder) for field, folder in tiers.items()},
    }
    return json.dumps(document)


def _checkpoint(tmp_path: Path, **checkpoint: str) -> CheckpointConfig:
    return selfcheck.checkpoint_config(
        selfcheck.parse_args(["--config", _job_config(tmp_path, **checkpoint)], {}), {}
    )


def test_cpu_mode_on_this_machine(tmp_path):
    done = _selfcheck("--config", _job_config(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU mode: local-cpu" in done.stdout
    assert "node can train" in done.stdout
    # The local NVRx lacks the compiled straggler extension (tools/nvrx-wheel.sh): said, not failed.
    extension = nvrx_compat.straggler_extension_available()
    assert ("no CUPTI straggler extension" in done.stdout) is not extension
    # Every tier made where the ranks will write it, and nothing left in it: no probe, no rank folder.
    for folder in ("memory", "nvme", "fsx"):
        assert (tmp_path / folder).is_dir()
        assert not list((tmp_path / folder).iterdir()), folder


def test_a_checkpointer_that_cannot_start_fails_the_pod_with_one_line(tmp_path):
    """The durable folder is a file: every pod would fail alike (exit 2), before the launcher starts."""
    (tmp_path / "fsx").write_text("a file where the durable tier's folder should be")
    done = _selfcheck("--config", _job_config(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]  # the pod's termination message ends with it
    assert verdict.startswith("cannot train (configuration/image problem, exit 2): checkpoint durable: ")
    assert str(tmp_path / "fsx") in verdict  # where
    assert "File exists" in verdict  # why
    assert "remove the file that stands in its path, or point checkpoint.durable_dir" in verdict  # the fix


def test_unknown_profile_is_a_configuration_error():
    done = _selfcheck("--profile", "p9.huge")
    assert done.returncode == 2
    assert "unknown instance type 'p9.huge'" in done.stderr
    assert "Traceback" not in done.stderr


def _gpu_torch(count: int = 8, nccl: tuple[int, ...] = (2, 27, 7)) -> TorchInfo:
    return TorchInfo(version="2.9.0a0", cuda="13.0", cuda_available=True, device_count=count, nccl=nccl)


@pytest.fixture
def p5_node(tmp_path) -> Node:
    """A healthy p5.48xlarge as the pod sees it: 8 GPUs, 32 EFA devices, the chart's env, the plugin."""
    sys_root, dev = tmp_path / "sys", tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    drivers = sys_root / "bus" / "pci" / "drivers"
    (drivers / "efa").mkdir(parents=True)
    (drivers / "mlx5_core").mkdir()
    for i in range(8):
        (dev / f"nvidia{i}").touch()
    (dev / "nvidiactl").touch()  # not a GPU
    for i in range(P5.efa_devices):
        device = sys_root / "class" / "infiniband" / f"rdmap{i}s0" / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(drivers / "efa")
        (dev / "infiniband" / f"uverbs{i}").touch()
    plugin_dir = tmp_path / "opt" / "aws-ofi-nccl" / "lib"
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "libnccl-net-ofi.so").touch()
    fi_info = tmp_path / "bin" / "fi_info"
    fi_info.parent.mkdir()
    fi_info.write_text("#!/bin/sh\necho 'provider: efa'\n")
    fi_info.chmod(fi_info.stat().st_mode | stat.S_IEXEC)
    env = {
        "JOB_COMPLETION_INDEX": "0",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_NET_PLUGIN": "ofi",
        "LD_LIBRARY_PATH": f"/nonexistent:{plugin_dir}",
        "NVRX_EKS_NVRX_VERSION": INSTALLED_NVRX,
        "NVRX_EKS_INSTANCE_PROFILE": "p5.48xlarge",
    }
    return Node(
        sys_root=sys_root,
        dev_root=dev,
        shm_path=tmp_path,
        env=env,
        torch_probe=_gpu_torch,
        which=lambda name: str(fi_info) if name == "fi_info" else None,
        memlock=lambda: resource.RLIM_INFINITY,
        load_library=lambda path: None,  # the placeholder file stands in for a plugin that loads
    )


def _by_name(node: Node, tmp_path: Path) -> dict[str, selfcheck.Check]:
    checks = selfcheck.run_checks(node, profile=P5, checkpoint=_checkpoint(tmp_path))
    return {c.name: c for c in checks}


@pytest.fixture(autouse=True)
def _shm_is_not_the_question(monkeypatch):
    # tmp dirs stand in for /dev/shm; the size rule gets its own test below.
    monkeypatch.setattr(selfcheck, "SHM_GIB_PER_GPU_WORKER", 0.0)


def test_a_healthy_p5_node_can_train(p5_node, tmp_path, capsys):
    code = selfcheck.main(["--config", _job_config(tmp_path)], node=p5_node)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "node can train" in out
    checks = _by_name(p5_node, tmp_path)
    assert checks["GPUs"].status is Status.OK
    assert checks["EFA devices"].status is Status.OK
    assert checks["EFA devices"].detail.startswith("32 of 32")
    assert checks["NCCL net plugin"].detail.endswith("libnccl-net-ofi.so (loads)")
    assert checks["NCCL"].detail == "2.27.7"
    for tier in ("memory", "local", "durable"):
        assert checks[f"checkpoint {tier}"].status is Status.OK, checks[f"checkpoint {tier}"]
    assert "for 3 staging slots per rank" in checks["checkpoint memory"].detail


def _code(node: Node, tmp_path: Path) -> int:
    return selfcheck.exit_code(list(_by_name(node, tmp_path).values()))


def test_a_missing_gpu_is_a_node_problem(p5_node, tmp_path):
    (p5_node.dev_root / "nvidia7").unlink()
    checks = _by_name(p5_node, tmp_path)
    assert checks["GPUs"].status is Status.NODE
    assert "7 of 8 GPUs usable" in checks["GPUs"].detail
    assert _code(p5_node, tmp_path) == NODE_PROBLEM_EXIT_CODE == 75


def test_cuda_failing_to_initialize_is_a_node_problem(p5_node, tmp_path):
    p5_node.torch_probe = lambda: TorchInfo(
        version="2.9", cuda="13.0", cuda_available=False, device_count=0, nccl=None, error="driver too old"
    )
    checks = _by_name(p5_node, tmp_path)
    assert checks["GPUs"].status is Status.NODE
    assert "driver too old" in checks["GPUs"].detail


def test_a_missing_efa_device_is_a_node_problem(p5_node, tmp_path):
    (p5_node.dev_root / "infiniband" / "uverbs31").unlink()
    checks = _by_name(p5_node, tmp_path)
    assert checks["EFA devices"].status is Status.NODE
    assert "requested 32" in checks["EFA devices"].detail
    assert _code(p5_node, tmp_path) == NODE_PROBLEM_EXIT_CODE


def test_rdma_devices_of_another_driver_do_not_count_as_efa(p5_node, tmp_path):
    link = p5_node.sys_root / "class" / "infiniband" / "rdmap0s0" / "device" / "driver"
    link.unlink()
    link.symlink_to(p5_node.sys_root / "bus" / "pci" / "drivers" / "mlx5_core")
    assert selfcheck.efa_devices(p5_node.sys_root).count("rdmap0s0") == 0
    assert _by_name(p5_node, tmp_path)["EFA devices"].status is Status.NODE


def test_libfabric_without_an_efa_endpoint_is_a_node_problem(p5_node, tmp_path):
    failing = tmp_path / "bin" / "fi_info"
    failing.write_text("#!/bin/sh\necho 'fi_getinfo: -61 (No data available)' >&2\nexit 61\n")
    checks = _by_name(p5_node, tmp_path)
    assert checks["libfabric efa"].status is Status.NODE
    assert "No data available" in checks["libfabric efa"].detail


@pytest.mark.parametrize(
    ("env", "check", "words"),
    [
        ({"FI_PROVIDER": "sockets"}, "environment", "FI_PROVIDER='sockets'"),
        ({"NCCL_NET": "Socket"}, "NCCL net plugin", "forces TCP sockets"),
        ({"LD_LIBRARY_PATH": "/nonexistent"}, "NCCL net plugin", "aws-ofi-nccl not found"),
        ({"JOB_COMPLETION_INDEX": None}, "environment", "JOB_COMPLETION_INDEX unset"),
        ({"NVRX_EKS_NVRX_VERSION": "0.0.1"}, "NVRx", "the image was built for 0.0.1"),
    ],
)
def test_image_or_chart_mistakes_are_configuration_problems(p5_node, tmp_path, env, check, words):
    merged = dict(p5_node.env) | env
    p5_node.env = {k: v for k, v in merged.items() if v is not None}
    checks = _by_name(p5_node, tmp_path)
    assert checks[check].status is Status.CONFIG
    assert words in checks[check].detail
    assert _code(p5_node, tmp_path) == 2


def test_nccl_in_the_range_nvrx_excludes_is_refused(p5_node, tmp_path):
    p5_node.torch_probe = lambda: _gpu_torch(nccl=(2, 28, 5))
    checks = _by_name(p5_node, tmp_path)
    assert checks["NCCL"].status is Status.CONFIG
    assert "2.28.3-2.28.8" in checks["NCCL"].detail


def test_cpu_only_torch_on_a_gpu_profile_is_the_wrong_image(p5_node, tmp_path):
    p5_node.torch_probe = lambda: TorchInfo(
        version="2.9", cuda=None, cuda_available=False, device_count=0, nccl=None
    )
    assert _by_name(p5_node, tmp_path)["torch"].status is Status.CONFIG


@pytest.mark.parametrize(
    ("tier", "field", "status", "code"),
    [
        # The node's own disk: another node may well do (the Job replaces the pod at no cost).
        ("local", "local_dir", Status.NODE, NODE_PROBLEM_EXIT_CODE),
        # The pod's memory folder and the shared durable tier: every pod would fail alike.
        ("memory", "memory_dir", Status.CONFIG, 2),
        ("durable", "durable_dir", Status.CONFIG, 2),
    ],
)
def test_a_checkpoint_tier_that_cannot_start_names_itself_the_cause_and_the_fix(
    p5_node, tmp_path, tier, field, status, code
):
    (tmp_path / "blocker").write_text("x")
    config = _checkpoint(tmp_path, **{field: f"blocker/{tier}"})
    checks = {c.name: c for c in selfcheck.run_checks(p5_node, profile=P5, checkpoint=config)}
    check = checks[f"checkpoint {tier}"]
    assert check.status is status
    assert check.detail.startswith(f"{tmp_path / 'blocker' / tier}: Not a directory"), check.detail
    assert f"point checkpoint.{field} at another folder" in check.detail
    assert selfcheck.exit_code(list(checks.values())) == code
    others = {c.status for name, c in checks.items() if name.startswith("checkpoint ") and c is not check}
    assert others == {Status.OK}


def test_a_checkpointer_the_image_cannot_import_is_an_image_problem(p5_node, tmp_path, monkeypatch):
    # The tiered implementation's modules (or one they import) missing from the image.
    monkeypatch.setitem(sys.modules, "nvrx_eks.training.checkpoint.tiered", None)
    checks = _by_name(p5_node, tmp_path)
    check = checks["checkpoint implementation"]
    assert check.status is Status.CONFIG
    assert check.detail.startswith("checkpoint.implementation=tiered: cannot be imported (")
    assert "rebuild it" in check.detail
    assert not (tmp_path / "memory").exists()  # nothing tried past the import
    assert selfcheck.exit_code(list(checks.values())) == 2


def test_a_scripts_configuration_comes_from_its_env(p5_node, tmp_path):
    """A script's ranks read NVRX_EKS_CONFIG, in the env the self-check shares with them; the
    synchronous implementation has no memory tier to prove."""
    p5_node.env = dict(p5_node.env) | {CONFIG_ENV: _job_config(tmp_path)}
    document = json.loads(p5_node.env[CONFIG_ENV])
    document["checkpoint"]["implementation"] = "sync"
    p5_node.env[CONFIG_ENV] = json.dumps(document)
    config = selfcheck.checkpoint_config(selfcheck.parse_args([], p5_node.env), p5_node.env)
    assert config is not None
    assert config.implementation == "sync"
    names = [c.name for c in selfcheck.run_checks(p5_node, profile=P5, checkpoint=config)]
    assert [n for n in names if n.startswith("checkpoint")] == ["checkpoint local", "checkpoint durable"]


def test_no_configuration_is_a_warning_and_a_bad_one_a_configuration_error(p5_node, tmp_path):
    checks = selfcheck.run_checks(p5_node, profile=P5, checkpoint=None)
    assert checks[-1] == selfcheck.Check(
        "checkpointer", Status.WARN, f"no job configuration (--config or ${CONFIG_ENV})"
    )
    with pytest.raises(UserError, match="--config is not a JSON object"):
        selfcheck.main(["--config", "memory_dir=/x"], node=p5_node)
    with pytest.raises(UserError, match=r"checkpoint\.keep"):
        selfcheck.main(["--config", json.dumps({"checkpoint": {"keep": 0}})], node=p5_node)


def test_configuration_problems_win_over_node_problems(p5_node, tmp_path):
    (p5_node.dev_root / "nvidia0").unlink()
    p5_node.env = dict(p5_node.env) | {"FI_PROVIDER": "tcp"}
    assert _code(p5_node, tmp_path) == 2  # every pod would fail: fail the Job, do not retry elsewhere


def test_shared_memory_below_one_gib_per_gpu_worker_is_refused(p5_node, tmp_path, monkeypatch):
    monkeypatch.setattr(selfcheck, "SHM_GIB_PER_GPU_WORKER", 1e9)  # more than any disk here
    shm = _by_name(p5_node, tmp_path)["/dev/shm"]
    assert shm.status is Status.CONFIG
    assert "for 8 workers" in shm.detail
    p5_node.shm_path = tmp_path / "missing"
    assert _by_name(p5_node, tmp_path)["/dev/shm"].status is Status.CONFIG


def test_the_chart_sets_what_the_selfcheck_requires():
    from nvrx_eks.k8s.env import EFA_NCCL_ENV  # noqa: PLC0415

    for key, want in selfcheck.REQUIRED_EFA_ENV.items():
        assert EFA_NCCL_ENV.get(key) == want, key


@pytest.mark.parametrize(
    ("limit", "status"),
    [
        (64 * 1024, Status.CONFIG),  # the kernel's default: NCCL's EFA setup fails on every rank
        (8 << 20, Status.CONFIG),
        (2**62, Status.OK),  # what the GPU nodes' NodeConfig sets
        (resource.RLIM_INFINITY, Status.OK),
    ],
)
def test_a_memlock_limit_below_the_nodes_memory_fails_the_job(p5_node, tmp_path, limit, status):
    p5_node.memlock = lambda: limit
    check = _by_name(p5_node, tmp_path)["memlock limit"]
    assert check.status is status, check
    # The node group's launch template gives every node the same limit: a replacement pod elsewhere
    # would meet it again, so the Job's failure policy fails the job (exit 2) with the fix.
    assert _code(p5_node, tmp_path) == (2 if status is Status.CONFIG else 0)
    if status is Status.CONFIG:
        assert "launch template" in check.detail


def _plugin(folder: Path, *, needs: str) -> Path:
    """A real ELF shared library named as the plugin, built with the system's C compiler and linked
    against lib`needs`.so, which the loader looks for beside it ($ORIGIN), as the image's plugin links
    libhwloc and libfabric."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a shared library with")
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "plugin.c"
    source.write_text("int plugin_answer(void) { return 42; }\n")

    def build(name: str, *link: str) -> Path:
        library = folder / f"lib{name}.so"
        argv = [compiler, "-shared", "-fPIC", "-o", str(library), str(source), *link]
        subprocess.run(argv, check=True, capture_output=True)
        return library

    build(needs)
    # --no-as-needed: a dependency even though the stand-in calls nothing of it.
    return build("nccl-net-ofi", f"-L{folder}", "-Wl,--no-as-needed", f"-l{needs}", "-Wl,-rpath,$ORIGIN")


def test_the_plugin_is_loaded_as_nccl_loads_it(tmp_path):
    assert selfcheck.load_problem(_plugin(tmp_path / "complete", needs="hwloc-stand-in")) is None


def test_a_library_the_plugin_needs_and_the_image_lacks_is_named(p5_node, tmp_path):
    """The plugin file is there but a library it links (libhwloc, libfabric) is not: NCCL would fall back
    to TCP sockets with one warning. The check loads it as NCCL does and names the missing library."""
    plugin = _plugin(tmp_path / "incomplete", needs="hwloc-missing")
    (plugin.parent / "libhwloc-missing.so").unlink()
    p5_node.env = {**p5_node.env, "LD_LIBRARY_PATH": str(plugin.parent)}
    p5_node.load_library = selfcheck.load_problem
    check = _by_name(p5_node, tmp_path)["NCCL net plugin"]
    assert check.status is Status.CONFIG
    assert "it needs libhwloc-missing.so, which the image lacks" in check.detail
    assert "fall back to TCP sockets" in check.detail
    assert _code(p5_node, tmp_path) == 2


def test_a_file_that_is_no_library_does_not_load(tmp_path):
    (tmp_path / "libnccl-net-ofi.so").write_text("not an ELF object")
    problem = selfcheck.load_problem(tmp_path / "libnccl-net-ofi.so")
    assert problem is not None
    assert "libnccl-net-ofi.so" in problem
