"""`nvrx-eks bench api` runs both loops and prints their medians and ratio (bench/api.py)."""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_api_prints_both_loops_and_their_ratio(nvrx_eks):
    result = nvrx_eks("bench", "api", "--steps", "20", "--blocks", "1", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plain = re.search(r"plain PyTorch loop\s+median step ([\d.]+) ms", result.stdout)
    api = re.search(r"through training.api median step ([\d.]+) ms", result.stdout)
    ratio = re.search(r"api / plain\s+([\d.]+)", result.stdout)
    assert plain, result.stdout
    assert api, result.stdout
    assert ratio, result.stdout
    # The medians are printed to 0.01 ms, the ratio from the unrounded ones.
    assert float(ratio[1]) == pytest.approx(float(api[1]) / float(plain[1]), rel=5e-3)
    assert "part: rng capture" in result.stdout
