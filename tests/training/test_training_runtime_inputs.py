"""Trainer input that only fails once the run is under way, checked before anything starts.

Each case is `python -m nvrx_eks.training` as a user starts it (no launcher unless the case says so), its
kit section in NVRX_EKS_CONFIG as the chart hands it to any script: exit 2,
the field and the fix, no traceback, and no step trained; never a traceback at the first persist or
heartbeat, a checkpoint_failed warning every due step, or an input silently ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from children import run_python

from nvrx_eks.kitcore.configio import merge

if TYPE_CHECKING:
    import subprocess

REPO = Path(__file__).resolve().parents[2]
PROMPT_S = 90
BASE = ["-m", "nvrx_eks.training", "--steps", "4", "--log-every", "1"]
BASE_KIT = {"checkpoint": {"memory_every": 2}}


def _kit(run_dir: Path, *sections: dict[str, object]) -> dict[str, str]:
    """NVRX_EKS_CONFIG: BASE_KIT, the run folder and `sections`, merged in order."""
    document: dict[str, object] = {**BASE_KIT, "run_dir": str(run_dir)}
    for section in sections:
        document = merge(document, section)
    return {"NVRX_EKS_CONFIG": json.dumps(document)}


def _env(tmp_path: Path) -> dict[str, str]:
    dropped = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(("AWS_", "FT_"))}
    # No credentials from anywhere: files, instance metadata.
    return env | {
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def _file(tmp_path: Path) -> str:
    path = tmp_path / "afile"
    path.write_text("keep me\n")
    return str(path)


CASES = {
    "durable dir is a file": (
        lambda t: {"checkpoint": {"durable_dir": _file(t), "durable_every": 2}},
        "checkpoint.durable_dir",
        "is a file; pass a folder for the durable tier",
    ),
    "local tier is the durable tier": (
        lambda t: {
            "checkpoint": {
                "local_dir": str(t / "same"),
                "local_every": 2,
                "durable_dir": str(t / "same"),
                "durable_every": 2,
            }
        },
        "checkpoint.local_dir and checkpoint.durable_dir are both",
        "give each tier its own folder",
    ),
    "s3 durable tier without credentials": (
        lambda t: {"checkpoint": {"durable_dir": "s3://nvrx-eks-test/ckpt", "durable_every": 2}},
        "checkpoint.durable_dir s3://nvrx-eks-test/ckpt: no AWS credentials",
        "set AWS_PROFILE",
    ),
    "inprocess mode without a launcher's variables": (
        lambda t: {"mode": "inprocess"},
        "mode inprocess needs a launcher's RANK and WORLD_SIZE",
        "or use mode baseline to run alone",
    ),
    "ft_launcher mode without the launcher": (
        lambda t: {"mode": "ft_launcher"},
        "mode ft_launcher runs under ft_launcher",
        "start it with `python -m nvrx_eks.training.resilience.launch`",
    ),
    "run dir name too long": (
        lambda t: {"run_dir": str(t / ("x" * 300))},
        "run_dir has a name part of 300 bytes",
        "shorten it",
    ),
    "peer replicas on a single node": (
        lambda t: {"checkpoint": {"implementation": "tiered", "peer_replicas": 1}},
        "checkpoint.peer_replicas=1 keeps copies on other nodes, and this job has 1 node(s)",
        "set it to 0",
    ),
    "cuda on a machine without one": (
        lambda t: {"dist": {"device": "cuda"}},
        "dist.device is cuda, but torch",
        "use dist.device auto",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_runtime_input_is_refused_before_the_first_step(case, tmp_path):
    build, field, fix = CASES[case]
    if case.startswith("cuda"):
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA device")
    proc = run_python(
        *BASE, timeout=PROMPT_S, cwd=tmp_path, env=_env(tmp_path) | _kit(tmp_path / "run", build(tmp_path))
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    assert field in out
    assert fix in out
    assert "step 1/4" not in out
    if case == "durable dir is a file":
        assert (tmp_path / "afile").read_text() == "keep me\n"


ONE_RANK = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}
# In-process timeouts far above a loaded 2-core machine's step of the small preset.
SLOW_STEPS = {
    "inprocess": {
        "soft_timeout_s": 60,
        "hard_timeout_s": 90,
        "heartbeat_timeout_s": 70,
        "barrier_timeout_s": 120,
    }
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["baseline", "inprocess"])
def test_resuming_with_another_model_preset_is_one_message_and_keeps_the_checkpoints(
    mode, tmp_path, reserve_port
):
    """The second run's preset cannot load the first's checkpoint: exit 2 naming --model, not a
    load_state_dict traceback (or, in process, a restart per attempt until the budget is spent)."""

    env = _env(tmp_path) | (ONE_RANK | {"MASTER_PORT": str(reserve_port())} if mode == "inprocess" else {})
    kit = {"mode": mode, "checkpoint": {"durable_every": 2, "local_every": 0}}
    env |= _kit(tmp_path / "run", kit, SLOW_STEPS if mode == "inprocess" else {})

    def train(model: str) -> subprocess.CompletedProcess[str]:
        return run_python(*BASE, "--model", model, timeout=240, cwd=tmp_path, env=env)

    first = train("tiny")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    checkpoints = tmp_path / "run" / "checkpoints"
    kept = {p: p.read_bytes() for p in checkpoints.rglob("*") if p.is_file()}
    assert kept
    second = train("small")
    out = second.stdout + second.stderr
    assert second.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    assert "model: the newest checkpoint was written with model 'tiny', this run has 'small'" in out
    assert "run with model 'tiny' to resume it" in out
    assert {p: p.read_bytes() for p in kept} == kept
