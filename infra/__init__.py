"""The CDK app: the cluster stack from its typed config (infra/config.py).

`DEFAULT_CONFIG` is the default cluster config (infra/configs/default.yaml), read from beside this package
wherever the kit is installed: `nvrx-eks synth`'s and the demo's default."""

from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"
