"""Store loss: the rendezvous store's pod deleted mid-run, and the Deployment's replacement started (the
executor plays both), on the rendered local job (2 nodes x 2 CPU ranks).

NVRx 0.7 does not reconnect a launcher to a restarted store: every launcher ends with a DistNetworkError,
each pod's failure cause names the store, the Job's budget (backoffLimitPerIndex) starts every pod
again, the new pods rendezvous on the empty replacement store and resume from the newest checkpoint
their node still holds (the host-RAM tier dies with the processes; the node-local disk survives a pod
restart on the same node). The run ends bit-identical to a fault-free run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from nvrx_eks.k8s.termination import failure_cause, log_tail
from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.events import read_events

if TYPE_CHECKING:
    from conftest import LocalJobRunner

pytestmark = pytest.mark.slow

STEPS = 40
LOCAL_EVERY = 10
FAULT_STEP = 25
STEP_S = 0.1
"""Each step waits this long as on a device: the node-local write of step 10 has the fifteen steps
before the fault to commit even on a slow disk (writes run behind the loop, and one that outlasts the
cadence only delays the next)."""


@pytest.mark.timeout(600)
def test_a_lost_store_restarts_every_pod_from_the_newest_checkpoint(tmp_path, local_job: LocalJobRunner):
    overrides = [
        *reference_trainer(steps=STEPS, emulated_device_step_s=STEP_S),
        f"trainer.checkpoint.local_every={LOCAL_EVERY}",
    ]
    reference = local_job.fault_free_hash(tmp_path / "reference", overrides, timeout_s=240)
    plan = f"trainer.faults.plan=store_loss@{FAULT_STEP}"
    _, events_dir = local_job.run(tmp_path / "run", [*overrides, plan], timeout_s=300)
    log = [json.loads(line) for line in (tmp_path / "run" / "executor.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in log]
    assert "delete_store" in kinds
    assert kinds.index("store_restart") > kinds.index("delete_store")
    # Every launcher lost its store connection: each pod's first attempt failed, naming the store.
    failed = [e for e in log if e["kind"] == "pod_end" and e["reason"] == "Failed"]
    assert sorted(e["index"] for e in failed) == [0, 1]
    for end in failed:
        message = log_tail((tmp_path / "run" / "pods" / f"{end['pod']}.log").read_text())
        assert failure_cause(message).text.startswith("the rendezvous store was lost"), message[-500:]
    (fault,) = summarize(events_dir).faults
    assert fault.cls == "store_loss"
    assert fault.layer == "job_controller"
    # Restored from a disk tier (the RAM tier went with the processes): each rank reads the newest step
    # from the fastest tier holding its shard, the node-local disk or the durable tier (the summary
    # names the slowest tier any rank read), and nothing the node-local disks held at the loss is lost.
    events = read_events(events_dir)
    (injected,) = [e for e in events if e["kind"] == "fault_injected"]
    on_disk = local_job.newest_step_on_disk(events, "local", before_t=injected["t"])
    assert fault.tier in {"local", "durable"}
    after = [e for e in events if e["t"] > injected["t"]]
    restored = min(e["restored_step"] for e in after if e["kind"] == "startup_done")
    assert restored >= on_disk, (on_disk, restored)
    assert fault.steps_lost is not None
    assert fault.steps_lost <= FAULT_STEP - 1 - on_disk  # the last step done before the fault is 24
    assert fault.recovery_s is not None
    assert fault.recovery_s < 60
    assert local_job.final_hash(events_dir) == reference
