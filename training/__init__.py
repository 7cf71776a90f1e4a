"""What a rank runs, and all the training image ships besides kitcore/.

- api.py: the public API any training script uses (docs/your-script.md); everything below is behind it.
- The reference trainer, its first client: `python -m nvrx_eks.training` (__main__.py, trainer.py, config.py,
  model.py, data.py, shapes.py); it imports nothing of the kit but api.py (an import contract).
- What the API composes: the parallel layout, metrics, events and injected faults; entry.py runs a
  script of your own in a launcher's worker.
- resilience/: every seam with NVRx (in-process restart, ft_launcher, the rendezvous store's process).
- node/: can this node train (the pod's self-check, the node-check DaemonSet), and where it sits (the
  pod's topology init container).
- checkpoint/: the multi-tier asynchronous checkpointer.
- launch.py, control.py, selfcheck.py, topology.py, nodecheck.py: the module paths the manifests and
  images run.

Offline tools (the run report, the checkpoint benchmark) live in localrun/.
"""
