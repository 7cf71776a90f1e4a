"""`nvrx-eks demo` end to end: the rendered local job under every fault class, each recovered right."""

from __future__ import annotations

import json

import pytest

from nvrx_eks.localrun.demo import DEMO_FAULTS


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_recovers_every_fault_class_bit_identically(tmp_path, nvrx_eks, references):
    # Into a pipe, as a user saving the output would: every table cell whole (tests/test_console.py).
    # The fault-free reference from the checkout's cache, shared with every demo run and the image
    # check here (keyed by the values, the trainer's code and the torch and NVRx releases).
    cache = ("--cache", str(references))
    result = nvrx_eks("demo", "--skip-synth", "--runs", str(tmp_path), *cache, timeout=560, piped=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (summary_path,) = tmp_path.glob("demo-*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["final_params_sha256"] == summary["fault_free_params_sha256"]
    expected_classes = {item.split("@")[0] for item in DEMO_FAULTS}
    assert {f["class"] for f in summary["faults"]} == expected_classes
    for fault in summary["faults"]:
        assert fault["layer"] == fault["expected_layer"], fault
        if fault["layer"] == "inprocess":
            assert fault["steps_lost"] <= 1, fault
    assert (summary_path.parent / "timeline.png").stat().st_size > 10_000
    assert "Run totals" in result.stdout
    assert "…" not in result.stdout
    page = (summary_path.parent / "report.html").read_text()
    assert page.count("<tr class='phase-row'>") == len(summary["faults"])
