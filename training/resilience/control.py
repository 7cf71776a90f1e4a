"""`python -m nvrx_eks.training.resilience.control`: the job's rendezvous store, NVRx's control process,
patched.

The command line is `nvrx-control`'s own (NVRx's external control process: it hosts the TCPStore every
launcher connects to, and closes each rendezvous round). What this adds, before NVRx's `main` runs:
a restart round ranks the previous round's active nodes first, so a hot spare takes only the place of
a node that did not come back (training/resilience/nvrx_compat.py `keep_previous_actives_first`), the
round waits for a missing previous active node only while its launcher still beats
(`wait_only_for_live_previous_actives`, the beat: training/resilience/launcher_liveness.py), and the
round closes at a 0.1 s poll instead of NVRx's 1 s floor (`poll_rendezvous_faster`). With the job's
`shrink` section (`SHRINK_ENV`, set by the chart), a restart round whose lost node's replacement stays
away closes below the job's full size (`shrink_when_replacements_stay_away`), and a watch over the
launchers' beats opens the next round once the job can grow back (launcher_liveness.py `GrowBack`).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from nvrx_eks.kitcore.lines import say
from nvrx_eks.training.resilience.launcher_liveness import GrowBack, gone_launcher_age, live_launchers
from nvrx_eks.training.resilience.nvrx_compat import (
    check_supported_nvrx,
    keep_previous_actives_first,
    poll_rendezvous_faster,
    shrink_when_replacements_stay_away,
    wait_only_for_live_previous_actives,
)
from nvrx_eks.training.resilience.shrink import SHRINK_ENV, ShrinkConfig

GROW_CHECK_S = 0.5
"""How often the control process looks whether a shrunk job can grow back."""
STORE_CONNECT_S = 60.0


def watch_for_growth(argv: list[str], policy: ShrinkConfig) -> None:
    """A daemon thread over this process's own store: `GrowBack` every `GROW_CHECK_S`."""
    from datetime import timedelta  # noqa: PLC0415

    from nvidia_resiliency_ext.fault_tolerance.control_plane import parse_args  # noqa: PLC0415
    from torch.distributed import TCPStore  # noqa: PLC0415

    args = parse_args(argv)  # nvrx-control's own parser: the flags as NVRx will read them
    run_id, port = args.rdzv_id, int(args.rdzv_endpoint.rpartition(":")[2])
    max_nodes = int(str(args.nnodes).rpartition(":")[2])

    def run() -> None:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=STORE_CONNECT_S))
        grow = GrowBack(store, run_id=run_id, policy=policy, max_nodes=max_nodes)
        while True:
            time.sleep(GROW_CHECK_S)
            try:
                grown = grow.check()
            except Exception as exc:  # noqa: BLE001 - a store read between rounds; the next check retries
                say(f"grow-back check skipped: {type(exc).__name__}: {exc}")
                continue
            if grown is not None:
                opened, size, target, why = grown
                say(
                    f"the job can grow back from {size} to {target} nodes: opened restart round {opened} "
                    f"{why}, at {time.time():.3f}"
                )

    threading.Thread(target=run, name="grow-back", daemon=True).start()


def main() -> None:
    check_supported_nvrx()
    keep_previous_actives_first()
    wait_only_for_live_previous_actives(gone_launcher_age)
    poll_rendezvous_faster()
    shrink = os.environ.get(SHRINK_ENV)
    if shrink:
        policy = ShrinkConfig.model_validate_json(shrink)
        shrink_when_replacements_stay_away(policy, live_launchers)
        watch_for_growth(sys.argv[1:], policy)
    from nvidia_resiliency_ext.fault_tolerance.control_plane import main as nvrx_control  # noqa: PLC0415

    nvrx_control(sys.argv[1:])


if __name__ == "__main__":
    main()
