"""What `nvrx-eks bench checkpoint` and every rank import print nothing of their dependencies."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import torch

from nvrx_eks.bench.checkpoint.bench import _timed_dcp_save

REPO = Path(__file__).resolve().parents[2]


def test_importing_torch_cuda_warns_nothing_in_a_fresh_process():
    """Each rank and each checkpoint writer process imports torch.cuda (which imports pynvml): with
    pynvml 13's import hook that printed a FutureWarning per process."""
    probe = "import torch.cuda, nvidia_resiliency_ext.checkpointing.async_ckpt.core"
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not result.stderr.strip(), result.stderr


def test_the_sync_dcp_baseline_saves_without_a_warning(tmp_path):
    state = {"model": {"w": torch.arange(1024, dtype=torch.float32)}, "data": {"step": 3}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seconds = _timed_dcp_save(state, tmp_path / "dcp")
    assert seconds > 0
    assert (tmp_path / "dcp" / ".metadata").exists()
    assert not torch.distributed.is_initialized(), "the one-rank group must not outlive the save"
