"""`python -m nvrx_eks.training.topology`, the module path each trainer pod's topology init container runs:
this
node's zone and network-node labels, for the peer replica's partners (training/node/topology.py)."""

from nvrx_eks.training.node.topology import cli

if __name__ == "__main__":
    cli()
