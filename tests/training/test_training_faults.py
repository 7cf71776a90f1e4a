"""The trainer under injected faults: real processes, 2 local nodes x 2 CPU ranks under ft_launcher.

One run folds every fault class in (mode `both`); a fault-free torchrun run with the same config is
the reference for bit-exact resume. Each job runs under a hard time bound and its process trees are
killed in the fixture's teardown.
"""

from __future__ import annotations

import json

import pytest

from training.metrics import summarize

pytestmark = pytest.mark.slow

STEPS = 40
PLAN = "exception@4:1,hang@8:0,skip_collective@12:3,oom@16:2,sigkill@20:1,deadlock@26:2,node_loss@32:3"


def _args(tmp_name: str, *, plan: str) -> list[str]:
    return [
        "--mode",
        "both",
        "--steps",
        str(STEPS),
        "--faults-plan",
        plan,
        "--log-every",
        "10",
        "--checkpoint-implementation",
        "sync",
        "--checkpoint-durable-every",
        "2",
        "--checkpoint-memory-dir",
        f"/dev/shm/nvrx-eks-test-{tmp_name}",
    ]


@pytest.mark.timeout(330)
def test_every_fault_class_recovers_through_its_layer_and_resumes_bit_exactly(local_job, tmp_path):
    faulty = local_job("faulty", _args(f"{tmp_path.name}-f", plan=PLAN))
    assert faulty.run(timeout_s=240) == {0: 0, 1: 0}
    reference = local_job("reference", _args(f"{tmp_path.name}-r", plan=""), launcher="torchrun")
    assert reference.run(timeout_s=60) == {0: 0}

    summary = summarize(faulty.run_dir)
    assert summary.completed, summary
    by_class = {f.cls: f for f in summary.faults}
    assert set(by_class) == {
        "exception",
        "hang",
        "skip_collective",
        "oom",
        "sigkill",
        "deadlock",
        "node_loss",
    }
    for fault in summary.faults:
        assert fault.layer == fault.expected_layer, fault
        assert fault.recovery_s is not None, fault
        if fault.expected_layer == "inprocess":
            assert fault.steps_lost is not None
            assert fault.steps_lost <= 1, fault
    assert len(faulty.replaced) == 1  # the harness played the Job controller once

    final = json.loads((faulty.run_dir / "final.json").read_text())
    expected = json.loads((reference.run_dir / "final.json").read_text())
    assert final["final_params_sha256"] == expected["final_params_sha256"]
