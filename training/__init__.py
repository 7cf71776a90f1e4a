"""What a rank runs, and all the training image ships besides kitcore/.

- The loop, at the top: `python -m training` (__main__.py, run.py, trainer.py), its config, data, model,
  parallel layout, metrics, events and injected faults.
- resilience/: every seam with NVRx (in-process restart, ft_launcher, the rendezvous store's process).
- node/: can this node train (the pod's self-check, the node-check DaemonSet), and where it sits (the
  pod's topology init container).
- checkpoint/: the multi-tier asynchronous checkpointer.
- launch.py, control.py, selfcheck.py, topology.py, nodecheck.py: the module paths the manifests and
  images run.

Offline tools (the run report, the checkpoint benchmark) live in localrun/.
"""
