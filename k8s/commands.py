"""Subcommands this part adds to `nvrx-eks` (assembled in nvrx_eks/cli.py): `job render`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.options import Overrides, path_option

if TYPE_CHECKING:
    import typer

_VALUES = paths.read_file("job values YAML file", "k8s/values/p5-2.yaml")
_OUT = paths.write_folder("rendered manifests", "dist/")
ValuesFile = Annotated[Path, path_option("-f", "--values", path=_VALUES, help="Job values YAML file.")]
OutFolder = Annotated[Path, path_option("-o", "--out", path=_OUT, help="Output folder for the manifests.")]


def render_cmd(values_file: ValuesFile, out: OutFolder = Path("dist"), overrides: Overrides = None) -> None:
    """Render the job's manifests (rendezvous store, headless Service, Indexed Job) as plain YAML."""
    from nvrx_eks.k8s.durable_cost import durable_cadence_warning  # noqa: PLC0415
    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415 - heavy (jsii)
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

    values = load_values(values_file, overrides or [])
    warning = durable_cadence_warning(values.trainer.checkpoint, hints=values.plan)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    # What the memory tier holds per node, against what it and the node have (stderr: stdout
    # lists the files written). A script's state size is known only to its ranks.
    budget = values.memory_budget
    needed = budget.describe() if budget else "what your script's state needs (its ranks log state_bytes)"
    print(
        f"host memory for checkpoints per node: {needed} of the "
        f"{values.memory_tier_gib} GiB memory tier ({values.instance_profile}: "
        f"{values.profile.memory_gib} GiB; peer replicas: {values.peer_replicas})",
        file=sys.stderr,
    )
    for path in render(values, str(out)):
        print(path)


def register(*, job: typer.Typer, **_: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
    job.command("render")(render_cmd)
