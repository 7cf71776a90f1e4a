"""`python -m nvrx_eks.training.nodecheck`, the module path the node-check DaemonSet runs
(k8s/node_verification.py): is this GPU node fit to train? (training/node/nodecheck.py)."""

from nvrx_eks.training.node.nodecheck import cli

if __name__ == "__main__":
    cli()
