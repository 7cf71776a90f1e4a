"""What every `bench checkpoint` row shares: the model-like state and the emulated step.

The kit's rows (bench.py) and NVRx's rows (nvrx_bench.py) build their state and run their step from
here, so both measure the same bytes in the same tensors on the same loop.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def make_state(total_bytes: int) -> dict[str, Any]:
    """A model-like state: several large float32 tensors plus optimizer moments and small values."""
    per = total_bytes // 4 // 12
    return {
        "model": {f"layer{i}.weight": torch.randn(per) for i in range(4)},
        "optim": {
            "exp_avg": [torch.randn(per) for _ in range(4)],
            "exp_avg_sq": [torch.rand(per) for _ in range(4)],
        },
        "data": {"step": 0, "epoch": 0},
    }


def forward_backward(kind: str, seconds: float, work: torch.Tensor) -> None:
    """One emulated forward/backward: `device` sleeps (a GPU host's cores are idle while the device
    computes), `cpu` multiplies on the cores the copy and the writers also need."""
    if kind == "device":
        time.sleep(seconds)
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work @ work
