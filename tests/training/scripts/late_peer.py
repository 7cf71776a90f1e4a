"""One of two ranks of an attempt's process groups (`parallel.init_group`, then a 2x1 device mesh), rank
1 arriving `LATE_S` after rank 0, far past the 1 s collective timeout; then rank 0 all-reduces alone.

Run as `python late_peer.py RANK STORE_FILE`. Rank 0 prints one JSON line: whether each group connected,
and how long its lone collective waited before it failed."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from nvrx_eks.training import parallel

LATE_S = 3.0
COLLECTIVE_TIMEOUT_S = 1.0


def main() -> None:
    rank, store = int(sys.argv[1]), dist.FileStore(sys.argv[2], 2)
    world = parallel.World(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"))
    if rank == 1:
        time.sleep(LATE_S)
    report: dict[str, object] = {}
    try:
        parallel.init_group(world, store, attempt=0, timeout_s=COLLECTIVE_TIMEOUT_S)
        report["default group"] = "connected"
        mesh = parallel.device_mesh(world, ("dp", "tp"), (2, 1), timeout_s=COLLECTIVE_TIMEOUT_S)
        report["mesh"] = "connected"
    except RuntimeError as exc:
        report["failed"] = str(exc).splitlines()[0][:200]
        print(json.dumps(report), flush=True)
        return
    if rank == 0:
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=mesh.get_group("dp"))
        except RuntimeError:
            report["lone collective failed after s"] = round(time.monotonic() - started, 2)
        print(json.dumps(report), flush=True)
    else:
        time.sleep(COLLECTIVE_TIMEOUT_S * 4)  # connected, but never joins rank 0's collective
    parallel.release_retired_groups()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
