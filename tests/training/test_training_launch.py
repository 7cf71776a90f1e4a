"""training/launch.py: ft_launcher's command line rewritten for workers forked from a warm forkserver.

The speed-up itself is measured by `make demo` (the recovery phases table) and proven in the fault
tests (tests/training/test_training_faults.py: a restarted worker used a fraction of the CPU a fresh
interpreter does). Here: the rewrite, and the condition that makes a fork safe to share.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.launch import WARM_MODULES, launcher_argv, trainer_script

REPO = Path(__file__).resolve().parents[2]


def test_the_trainer_module_becomes_the_run_path_of_its_main_in_a_forkserver():
    argv = ["--nnodes=2:2", "--max-restarts=3", "-m", "training", "--mode", "both", "-m", "x"]
    assert launcher_argv(argv) == [
        "--nnodes=2:2",
        "--max-restarts=3",
        "--start-method=forkserver",
        "--run-path",
        trainer_script(),
        "--mode",
        "both",
        "-m",
        "x",
    ]
    assert Path(trainer_script()) == REPO / "training" / "__main__.py"


def test_an_explicit_start_method_is_kept():
    argv = ["--start-method=spawn", "-m", "training", "--steps", "3"]
    assert launcher_argv(argv)[:3] == ["--start-method=spawn", "--run-path", trainer_script()]


def test_a_command_without_the_trainer_module_is_refused():
    with pytest.raises(SystemExit, match="must end in `-m training ARGS`"):
        launcher_argv(["--nnodes=1", "train.py"])


# The variables ft_launcher sets per worker (torch.distributed.elastic's worker env and NVRx's rank
# monitor sockets): a forked worker gets them only after the fork, so nothing may read them at import.
_PROBE = r"""
import json, os, sys
read = set()
class Env(dict):
    def __getitem__(self, k):
        read.add(k); return super().__getitem__(k)
    def get(self, k, d=None):
        read.add(k); return super().get(k, d)
    def __contains__(self, k):
        read.add(k); return super().__contains__(k)
os.environ = Env(os.environ)
for name in sys.argv[1].split(","):
    __import__(name)
print(json.dumps(sorted(read)))
"""
PER_WORKER = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
}


def _probe(script: str, modules: tuple[str, ...], cwd: Path) -> list[str]:
    """What `script` (a probe above) saw while a fresh interpreter imported `modules`: its last line."""
    done = subprocess.run(
        [sys.executable, "-c", script, ",".join(modules)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=cwd,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _read_at_import(modules: tuple[str, ...], cwd: Path) -> set[str]:
    return set(_probe(_PROBE, modules, cwd))


def test_the_probe_sees_a_module_that_reads_the_rank_at_import(tmp_path):
    (tmp_path / "rank_at_import.py").write_text("import os\nRANK = int(os.environ.get('RANK', '0'))\n")
    assert "RANK" in _read_at_import(("rank_at_import",), tmp_path)


def test_nothing_the_forkserver_imports_reads_a_per_worker_variable():
    read = _read_at_import(WARM_MODULES, REPO)
    assert read, "the probe saw no reads at all: it does not watch the environment"
    assert not (read & PER_WORKER), sorted(read & PER_WORKER)
    assert not {k for k in read if k.startswith(("FT_", "TORCHELASTIC_"))}, sorted(read)


_CUDA_PROBE = r"""
import json, sys, torch
calls = []
for name in ("is_available", "device_count", "_lazy_init", "init", "current_device", "set_device"):
    original = getattr(torch.cuda, name)
    def watch(*args, _original=original, _name=name, **kwargs):
        calls.append(_name)
        return _original(*args, **kwargs)
    setattr(torch.cuda, name, watch)
for name in sys.argv[1].split(","):
    __import__(name)
print(json.dumps(calls))
"""


def _cuda_calls(modules: tuple[str, ...], cwd: Path) -> list[str]:
    return _probe(_CUDA_PROBE, modules, cwd)


def test_the_cuda_probe_sees_a_module_that_counts_devices_at_import(tmp_path):
    (tmp_path / "counts_gpus.py").write_text("import torch\nGPUS = torch.cuda.device_count()\n")
    assert "device_count" in _cuda_calls(("counts_gpus",), tmp_path)


def test_nothing_the_forkserver_imports_touches_cuda():
    # A process that initialised CUDA (even only to count devices, without PyTorch's NVML-based
    # check) forks children that cannot use it: the forkserver must never ask.
    assert _cuda_calls(WARM_MODULES, REPO) == []
