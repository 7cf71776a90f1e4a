"""Node health: can this node train?

- selfcheck.py: the first thing each training pod runs (`python -m training.selfcheck`).
- nodecheck.py: the node-check DaemonSet's loop, which labels and taints the Node
  (`python -m training.nodecheck`).
"""
