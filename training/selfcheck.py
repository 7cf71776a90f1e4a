"""`python -m nvrx_eks.training.selfcheck`, the module path each training pod's init container and the image's
default command run: can this node train? (training/node/selfcheck.py)."""

from nvrx_eks.training.node.selfcheck import cli

if __name__ == "__main__":
    cli()
