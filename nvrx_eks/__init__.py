"""nvrx-eks, the kit: one package whose parts are the repository's top-level folders.

- `nvrx_eks.training` (training/): what a rank runs; `nvrx_eks.training.api` is the front door for a
  training script, and the reference trainer (`python -m nvrx_eks.training`) is a client of it like any.
- `nvrx_eks.k8s` (k8s/): the job and cluster charts. `nvrx_eks.infra` (infra/): the CDK app.
- `nvrx_eks.images` (images/), `nvrx_eks.localrun` (localrun/), `nvrx_eks.bench` (bench/),
  `nvrx_eks.planner` (planner/), `nvrx_eks.kitcore` (kitcore/), and the `nvrx-eks` CLI (`nvrx_eks.cli`).

Installed, the kit adds this one name to a user's imports (pyproject.toml's package-dir maps each folder
under it; nvrx_eks/layout.py reads that one declaration), so a project's own `training` or `k8s`
package keeps its name. A source checkout on `PYTHONPATH`, without an install, resolves the same parts
and no other folder: `layout.CheckoutFinder`, added below, maps them from the same declaration.
"""

import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and not (Path(__file__).parent / "kitcore").is_dir():
    from nvrx_eks.layout import CheckoutFinder

    if not any(isinstance(finder, CheckoutFinder) for finder in sys.meta_path):
        # Last: an install's own finder (an editable install's) answers first where there is one.
        sys.meta_path.append(CheckoutFinder(_CHECKOUT))
