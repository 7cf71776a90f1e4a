"""`load_values`: job values from a file and `key=value` overrides, checked in full before any render.

One pass over one model (k8s/values.py), the `trainer` section included as the trainer's own typed
configuration: every bad field, with its path, in one message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvrx_eks.k8s.values import JobValues
from nvrx_eks.kitcore.configio import load_model

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path


def load_values(path: Path | None, overrides: Iterable[str] = ()) -> JobValues:
    """Load and fully check job values."""
    return load_model(JobValues, path, overrides, source=str(path) if path else "job values")
