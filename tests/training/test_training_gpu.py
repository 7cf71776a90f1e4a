"""The CUDA path: NCCL + FSDP2 (fully_shard) with save and load through the checkpointer.

Skipped without a GPU (tests/conftest.py). Runs the trainer with torchrun on every visible GPU of one
host: a first run stops after 4 steps with checkpoints every 2; a second run in the same folder, asked
for 8 steps, must restore step 3 from the durable tier and finish; a fresh 8-step run is the reference.
NCCL reductions and the attention kernels are not bit-deterministic, so the losses are compared
within a tolerance, not the parameter hashes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _train(run_dir: Path, steps: int) -> None:
    import torch  # noqa: PLC0415

    cmd = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        f"--nproc-per-node={torch.cuda.device_count()}",
        "-m",
        "training",
        "--dist-device",
        "cuda",
        "--mode",
        "baseline",
        "--model",
        "small",
        "--steps",
        str(steps),
        "--run-dir",
        str(run_dir),
        "--checkpoint-implementation",
        "sync",
        "--checkpoint-durable-every",
        "2",
        "--checkpoint-memory-dir",
        f"/dev/shm/nvrx-eks-gpu-test-{run_dir.parent.name}-{run_dir.name}",
    ]
    subprocess.run(cmd, cwd=REPO, check=True, timeout=300, start_new_session=True)


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events" / "rank-0.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


@pytest.mark.timeout(900)
def test_fsdp2_saves_and_resumes_through_the_checkpointer(tmp_path):
    resumed, reference = tmp_path / "resumed", tmp_path / "reference"
    _train(resumed, 4)
    _train(resumed, 8)
    _train(reference, 8)

    starts = _events(resumed, "startup_done")
    assert starts[-1]["restored_step"] == 3
    assert starts[-1]["tier"] == "durable"
    last = {e["step"]: e["loss"] for e in _events(resumed, "step")}
    expected = {e["step"]: e["loss"] for e in _events(reference, "step")}
    assert sorted(last) == list(range(8))
    assert last[7] == pytest.approx(expected[7], rel=1e-3)
