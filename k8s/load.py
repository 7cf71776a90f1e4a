"""`load_values`: job values from a file and `key=value` overrides, checked in full before any render.

Two passes, each ending in one message that names the field: the values' own model (k8s/values.py),
then the trainer's own parser on the command line the chart would render (k8s/trainer_args.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvrx_eks.k8s.trainer_args import check_trainer_args
from nvrx_eks.k8s.values import JobValues
from nvrx_eks.kitcore.configio import load_model

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from nvrx_eks.training.resilience.config import ResilienceConfig


def load_values(path: Path | None, overrides: Iterable[str] = ()) -> JobValues:
    """Load and fully check job values: the model's rules, then the trainer's own parser."""
    return load_checked(path, overrides)[0]


def load_checked(path: Path | None, overrides: Iterable[str] = ()) -> tuple[JobValues, ResilienceConfig]:
    """`load_values`, and the configuration the ranks will get (the reference trainer's `TrainConfig`, or
    a script's `ResilienceConfig`)."""
    values = load_model(JobValues, path, overrides, source=str(path) if path else "job values")
    return values, check_trainer_args(values)
