"""One rank of a two-rank job under the kit's in-process layer (NVRx's real Wrapper, its monitor process
and thread): three steps, then the kit's last barrier as `AttemptRun.finish` makes it. Then rank 1 is
found unresponsive, as a rank's sibling monitor records it when that rank has finished and left the
Wrapper first (its monitor process falls silent), while rank 1 is still in its training function. NVRx
decides a restart after every rank has finished training.

Run as `python silent_after_the_last_barrier.py RUN_DIR WRAPPER_PORT` with RANK, WORLD_SIZE=2 and
MASTER_ADDR set. Prints one JSON line: the rank, what its call returned, and the Wrapper iteration of
each call of the training function."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from nvidia_resiliency_ext.inprocess.attribution import Interruption, InterruptionRecord
from nvidia_resiliency_ext.inprocess.store import PrefixStore

from nvrx_eks.training.events import EventLog
from nvrx_eks.training.parallel import store_barrier, store_barrier_reached
from nvrx_eks.training.resilience.config import ResilienceConfig
from nvrx_eks.training.resilience.layers import InProcessLayer, Resilience

STILL_IN_THE_CALL_S = 2.0
"""How long rank 1 stays in its training function after the record: NVRx's monitor threads look for
records every `inprocess.interval_s` (0.2 s here)."""


def main() -> None:
    run_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = ResilienceConfig.model_validate(
        {
            "mode": "inprocess",
            "run_dir": str(run_dir),
            "dist": {"timeout_s": 0.5},
            "inprocess": {
                "store_port": port,
                "soft_timeout_s": 5,
                "hard_timeout_s": 15,
                "heartbeat_timeout_s": 3,
                "interval_s": 0.2,
                "barrier_timeout_s": 20,
                "completion_timeout_s": 20,
            },
        }
    )
    events = EventLog(run_dir=run_dir, rank=rank)
    layer = InProcessLayer(cfg, events, store=None, world=None)  # type: ignore[arg-type]  # a fixed store port
    resilience = Resilience([layer])
    kit_store = dist.FileStore(str(run_dir / "kit-store"), world_size)
    iterations: list[int] = []

    def train() -> str:
        iterations.append(layer.call_wrapper.iteration)
        for step in range(3):
            resilience.step_done(step)
            time.sleep(0.1)
        key = f"finished-{len(iterations)}"
        resilience.finished_when(lambda: store_barrier_reached(kit_store, key, world_size))
        store_barrier(kit_store, key, world_size, timeout_s=20)
        if rank == 1:
            iteration = PrefixStore(layer.call_wrapper.iteration, layer.call_wrapper.base_store)
            iteration.record_interrupted([InterruptionRecord(rank, Interruption.UNRESPONSIVE)])
            time.sleep(STILL_IN_THE_CALL_S)
        return "returned"

    result = resilience.wrap(train)()
    events.close()
    print(json.dumps({"rank": rank, "result": result, "iterations": iterations}), flush=True)


if __name__ == "__main__":
    main()
