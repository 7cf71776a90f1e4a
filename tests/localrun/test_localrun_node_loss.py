"""Node loss restored from a partner's RAM: the rendered local job (2 nodes x 2 CPU ranks, the default
one peer replica) run by the executor, which plays the Job controller and replaces the deleted pod.

The replacement pod starts with an empty memory tier and no node-local disk; its ranks must take their
shards from the surviving node's RAM (tier `peer_memory`), lose no more than two memory snapshot
intervals (every snapshot is replicated, but its exchange starts once its copy is done and takes about
a step here: a loss one step after a snapshot may find only the one before), and end bit-identical to a
fault-free run.
With both nodes lost at once (a node and its only partner), the job falls back to the durable tier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.events import read_events

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import LocalJobRunner

pytestmark = pytest.mark.slow

STEPS = 40
MEMORY_EVERY = 2
STEP_S = 0.1
"""Each step waits this long as on a device: the durable write of step 10 has the fifteen steps before
the loss at step 25 to commit even on a slow disk (disk writes run behind the loop)."""


OVERRIDES = [
    *reference_trainer(steps=STEPS, emulated_device_step_s=STEP_S),
    f"trainer.checkpoint.memory_every={MEMORY_EVERY}",
]


def _run(local_job: LocalJobRunner, run_dir: Path, plan: str) -> Path:
    return local_job.run(run_dir, [*OVERRIDES, f"trainer.faults.plan={plan}"], timeout_s=240)[1]


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory, local_job: LocalJobRunner) -> str:
    return local_job.fault_free_hash(tmp_path_factory.mktemp("reference"), OVERRIDES, timeout_s=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [0, 3], ids=["node-of-rank-0", "node-of-rank-3"])
def test_a_lost_node_comes_back_from_its_partners_ram(tmp_path, local_job, fault_free_hash, rank):
    events = _run(local_job, tmp_path, f"node_loss@21:{rank}")
    (fault,) = summarize(events).faults
    assert fault.layer == "job_controller", fault
    assert fault.tier == "peer_memory", fault
    assert fault.steps_lost is not None, fault
    assert fault.steps_lost <= 2 * MEMORY_EVERY, fault
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(300)
def test_a_node_and_its_only_partner_lost_together_fall_back_to_durable(tmp_path, local_job, fault_free_hash):
    run_dir = _run(local_job, tmp_path, "node_loss@25:0,node_loss@25:3")
    faults = summarize(run_dir).faults
    assert {f.tier for f in faults} == {"durable"}, faults
    # The job resumes from the newest durable step (every 10 steps in the local-cpu values) that every
    # rank had committed when the nodes went, or a newer one whose commit was on disk before its event
    # was written.
    events = read_events(run_dir)
    lost_at = min(e["t"] for e in events if e["kind"] == "fault_injected")
    newest = local_job.newest_step_on_disk(events, "durable", before_t=lost_at)
    restored = {e["restored_step"] for e in events if e["kind"] == "startup_done" and e["t"] > lost_at}
    (step,) = restored  # every rank the same step
    assert newest <= step <= 25, (newest, step)
    assert step % 10 == 0, step
    assert local_job.final_hash(run_dir) == fault_free_hash
