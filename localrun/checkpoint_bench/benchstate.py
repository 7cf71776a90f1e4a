"""What every `bench checkpoint` row shares: the model-like state, the floor's rate, the emulated step.

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


def state_bytes(state: dict[str, Any]) -> int:
    from nvrx_eks.training.checkpoint.shard import flatten  # noqa: PLC0415

    return flatten(state)[2].data_bytes


def memcpy_bandwidth(nbytes: int) -> float:
    """Bytes/s of one contiguous copy into a reused, pre-faulted buffer (best of 3): the floor's rate."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return nbytes / best


def forward_backward(kind: str, seconds: float, work: torch.Tensor) -> None:
    """One emulated forward/backward: `device` sleeps (a GPU host's cores are idle while the device
    computes), `cpu` multiplies on the cores the copy and the writers also need."""
    if kind == "device":
        time.sleep(seconds)
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work @ work
