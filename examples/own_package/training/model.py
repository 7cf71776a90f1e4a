"""A small MLP regressor."""

from __future__ import annotations

import torch


def build(features: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1))
