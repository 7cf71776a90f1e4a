"""The demo and benchmark tests drive the CLI a user types, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def nvrx_eks() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`nvrx-eks ARGS...` from the repository root; output captured, wide enough that tables never wrap."""

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from infra.cli import main; main()", *args],
            cwd=REPO,
            env=os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run
