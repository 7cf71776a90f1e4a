"""`python -m nvrx_eks.training.resilience.control`: the job's rendezvous store, NVRx's control process,
patched.

The command line is `nvrx-control`'s own (NVRx's external control process: it hosts the TCPStore every
launcher connects to, and closes each rendezvous round). What this adds, before NVRx's `main` runs:
a restart round ranks the previous round's active nodes first, so a hot spare takes only the place of
a node that did not come back (training/resilience/nvrx_compat.py `keep_previous_actives_first`), the
round waits for a missing previous active node only while its launcher still beats
(`wait_only_for_live_previous_actives`, the beat: training/resilience/launcher_liveness.py), and the
round closes at a 0.1 s poll instead of NVRx's 1 s floor (`poll_rendezvous_faster`).
"""

from __future__ import annotations

import sys

from nvrx_eks.training.resilience.launcher_liveness import gone_launcher_age
from nvrx_eks.training.resilience.nvrx_compat import (
    check_supported_nvrx,
    keep_previous_actives_first,
    poll_rendezvous_faster,
    wait_only_for_live_previous_actives,
)


def main() -> None:
    check_supported_nvrx()
    keep_previous_actives_first()
    wait_only_for_live_previous_actives(gone_launcher_age)
    poll_rendezvous_faster()
    from nvidia_resiliency_ext.fault_tolerance.control_plane import main as nvrx_control  # noqa: PLC0415

    nvrx_control(sys.argv[1:])


if __name__ == "__main__":
    main()
