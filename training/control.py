"""`python -m nvrx_eks.training.control`, the module path the store Deployment and the store image run
(k8s/launcher.py `NVRX_CONTROL`): NVRx's control process with the kit's mends
(training/resilience/control.py)."""

from nvrx_eks.training.resilience.control import main

if __name__ == "__main__":
    main()
