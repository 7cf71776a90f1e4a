"""`python -m training.control`, the module path the store Deployment and the store image run
(k8s/launcher.py `NVRX_CONTROL`): NVRx's control process with the kit's mends
(training/resilience/control.py)."""

from training.resilience.control import main

if __name__ == "__main__":
    main()
