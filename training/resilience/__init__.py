"""Every seam between the trainer and NVRx, in one place.

- layers.py: the in-process restart and ft_launcher's rank monitor around one attempt of the loop.
- launch.py: ft_launcher with workers forked from a warm forkserver (run as `python -m
  nvrx_eks.training.resilience.launch`).
- control.py: NVRx's control process, the job's rendezvous store (run as `python -m
  nvrx_eks.training.resilience.control`).
- nvrx_compat.py: the kit's patches to NVRx's internals (and torch's), grouped by the process that applies
  them, each checked against the installed release (the table: docs/nvrx-seam.md).
- launcher_liveness.py: the kit's own launcher beat in the rendezvous store, and its readers.

Importing this package imports nothing: the store image ships only control.py, nvrx_compat.py and
launcher_liveness.py of it.
"""
