"""Every seam between the trainer and NVRx, in one place.

- layers.py: the in-process restart and ft_launcher's rank monitor around one attempt of the loop.
- launch.py: ft_launcher with workers forked from a warm forkserver (run as `python -m
  nvrx_eks.training.resilience.launch`).
- control.py: NVRx's control process, the job's rendezvous store (run as `python -m
  nvrx_eks.training.resilience.control`).
- nvrx_compat.py: the NVRx internals the kit patches or reads, each checked against the installed release.

Importing this package imports nothing: the store image ships only control.py and nvrx_compat.py of it.
"""
