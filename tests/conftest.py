from __future__ import annotations

import os

import pytest

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
