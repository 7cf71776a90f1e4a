"""What a rank runs, and all the training image ships besides kitcore/.

- api.py: the public API any training script uses (docs/your-script.md); everything below is behind it.
- The reference trainer, a client of it like any script: `python -m nvrx_eks.training` (__main__.py,
  trainer.py, config.py, model.py, data.py, shapes.py); it imports nothing of the kit but api.py (an
  import contract), and gets the kit's settings as any script does (NVRX_EKS_CONFIG).
- What the API composes: the parallel layout, metrics, events and injected faults; entry.py runs the
  job's training script in a launcher's worker.
- resilience/: every seam with NVRx (in-process restart, ft_launcher, the rendezvous store's process)
  and what each mode runs (modes.py); the manifests run `resilience.launch` and `resilience.control`.
- node/: can this node train (the pod's self-check, `node.selfcheck`; the node-check DaemonSet,
  `node.nodecheck`), and where it sits (the pod's topology init container, `node.topology`).
- checkpoint/: the multi-tier asynchronous checkpointer.

Offline tools (the run's summary and report) live in localrun/, the benchmarks in bench/.
"""
