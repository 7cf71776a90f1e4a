"""`cdk8s synth` entry point (cdk8s.yaml: `.venv/bin/python -m nvrx_eks.k8s.app`): render one values file to
dist/.

The values file is k8s/values/local-cpu.yaml unless NVRX_EKS_VALUES names another; NVRX_EKS_SET takes
space-separated `key=value` overrides. `nvrx-eks job render -f FILE -o DIR` does the same for any file.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvrx_eks.k8s import DEFAULT_VALUES
from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import exit_on_user_error


def main() -> None:
    with exit_on_user_error():
        values = load_values(
            Path(os.environ.get("NVRX_EKS_VALUES", DEFAULT_VALUES)),
            os.environ.get("NVRX_EKS_SET", "").split(),
        )
        for path in render(values, os.environ.get("NVRX_EKS_OUT", "dist")):
            print(path)


if __name__ == "__main__":
    main()
