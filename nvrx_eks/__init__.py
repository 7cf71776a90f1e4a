"""nvrx-eks, the kit: one package whose parts are the repository's top-level folders.

- `nvrx_eks.training` (training/): what a rank runs; `nvrx_eks.training.api` is the front door for a
  training script, and the reference trainer (`python -m nvrx_eks.training`) is its first client.
- `nvrx_eks.k8s` (k8s/): the job and cluster charts. `nvrx_eks.infra` (infra/): the CDK app.
- `nvrx_eks.images` (images/), `nvrx_eks.localrun` (localrun/), `nvrx_eks.planner` (planner/),
  `nvrx_eks.kitcore` (kitcore/), and the `nvrx-eks` CLI (`nvrx_eks.cli`).

Installed, the kit adds this one name to a user's imports (pyproject.toml maps each folder under it), so
a project's own `training` or `k8s` package keeps its name. A source checkout on `PYTHONPATH`, without
an install, resolves the same names: its root joins this package's search path below.
"""

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "training" / "api.py").is_file():
    __path__.append(str(_CHECKOUT))
