"""`job submit` runs the checks `job render` runs, before it reaches for a cluster.

A bad trainer field must be named at the workstation (exit 2), not found by a pod on the cluster,
and never be masked by a kubeconfig problem: these run with no kubeconfig at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

P5_VALUES = Path(__file__).resolve().parents[2] / "k8s" / "values" / "p5-2.yaml"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("trainer.model=8b", "trainer.model: not one of the kit's fields"),
        (
            "trainer.checkpoint.no_such_field=1",
            "trainer.checkpoint.no_such_field: Extra inputs are not permitted",
        ),
        ("timeouts.launcher_heartbeat_s=30", "timeouts.launcher_heartbeat_s (30) must exceed"),
    ],
)
def test_submit_names_a_bad_trainer_field_before_touching_kubeconfig(override, field, nvrx_eks, tmp_path):
    missing = tmp_path / "no-such-kubeconfig"
    proc = nvrx_eks(
        "job", "submit", "-f", str(P5_VALUES), "--kubeconfig", str(missing), override, timeout=180
    )
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr
    assert "kubeconfig" not in proc.stderr.lower()
    assert "Traceback" not in proc.stderr
