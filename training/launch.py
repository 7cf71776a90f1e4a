"""`python -m nvrx_eks.training.launch`, the module path the job's manifests run (k8s/launcher.py
`FT_LAUNCHER`):
ft_launcher whose restarted workers fork from a warm process (training/resilience/launch.py)."""

from nvrx_eks.training.resilience.launch import main

if __name__ == "__main__":
    main()
