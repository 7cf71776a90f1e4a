"""This project's own package, named `training` as many projects name theirs.

The kit installs as one package, `nvrx_eks` (its trainer is `nvrx_eks.training`), so this package keeps
its name beside it: on the Python path, in the forkserver that preloads it and in an image built on the
kit's (`nvrx-eks image build --project examples/own_package --base KIT_IMAGE`).
"""
