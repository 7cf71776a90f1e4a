"""The cdk8s charts: the training job from its typed values (k8s/values.py), the cluster's own objects.

`DEFAULT_VALUES` is the local job (k8s/values/local-cpu.yaml), read from beside this package wherever the
kit is installed: the demo's and the benchmarks' default values file."""

from pathlib import Path

DEFAULT_VALUES = Path(__file__).resolve().parent / "values" / "local-cpu.yaml"
