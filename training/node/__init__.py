"""Node health: can this node train? And where does it sit?

- selfcheck.py: the first thing each training pod runs (`python -m nvrx_eks.training.node.selfcheck`).
- nodecheck.py: the node-check DaemonSet's loop, which labels and taints the Node
  (`python -m nvrx_eks.training.node.nodecheck`).
- topology.py: the trainer pod's init container that reads its Node's zone and network-node labels for
  the peer replica's partners (`python -m nvrx_eks.training.node.topology`).
- kubeapi.py: the few Kubernetes API calls both make, with the standard library.
"""
