from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[1]

# jsii (aws-cdk-lib, cdk8s) prints a banner on Node 20 unless told not to; `make test` exports these,
# this covers a bare `pytest` run and the subprocesses tests start.
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


def _cuda_available() -> bool:
    try:
        import torch  # noqa: PLC0415 - optional at collection time
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def nvrx_eks() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`nvrx-eks ARGS...` as a user types it, in a child process from the repository root; output
    captured, wide enough that tables never wrap."""

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from nvrx_eks.cli import main; main()", *args],
            cwd=REPO,
            env=os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run
