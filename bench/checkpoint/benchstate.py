"""What every `bench checkpoint` row shares: the model-like state, the emulated step and the tiers.

The kit's rows (bench.py) and NVRx's rows (nvrx_bench.py) build their state and run their step from
here, so both measure the same bytes in the same tensors on the same loop. The kit's rows, its kill -9
trials (torture.py) and the checkpoint tests lay their tiers out with `every_tier`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from pathlib import Path

    from nvrx_eks.training.checkpoint.config import CheckpointConfig


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


def every_tier(
    memory_dir: Path,
    disk: Path,
    *,
    memory_every: int,
    local_every: int,
    durable_every: int,
    **options: Any,  # noqa: ANN401 - the config's own fields, checked by it
) -> CheckpointConfig:
    """A checkpoint config with all three tiers on: the RAM slots in `memory_dir`, the local tier in
    `disk`/local and the durable one in `disk`/durable (a folder standing in for the shared file
    system). `options`: the config's other fields."""
    from nvrx_eks.training.checkpoint.config import CheckpointConfig  # noqa: PLC0415

    return CheckpointConfig(
        memory_dir=memory_dir,
        memory_every=memory_every,
        local_dir=disk / "local",
        local_every=local_every,
        durable_dir=str(disk / "durable"),
        durable_every=durable_every,
        **options,
    )
