"""`python -m nvrx_eks` is the `nvrx-eks` command."""

from nvrx_eks.cli import main

main()
