"""Regression batches from a fixed random teacher: the same for a given seed on every rank."""

from __future__ import annotations

from typing import Any

import torch


class Batches:
    """This rank's share of each step's batch; its position is its state (`Stateful`)."""

    def __init__(self, *, features: int, batch_size: int, rank: int, world_size: int, seed: int) -> None:
        self.features, self.batch_size, self.rank, self.world_size, self.seed = (
            features,
            batch_size,
            rank,
            world_size,
            seed,
        )
        self.teacher = torch.randn(features, 1, generator=torch.Generator().manual_seed(seed))
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        # A function of the position alone, so a restart that rewinds it replays the same batches.
        generator = torch.Generator().manual_seed(self.seed + 1 + self.position * self.world_size + self.rank)
        inputs = torch.randn(self.batch_size, self.features, generator=generator)
        self.position += 1
        return inputs, inputs @ self.teacher

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]
