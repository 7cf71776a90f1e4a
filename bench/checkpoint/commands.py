"""`nvrx-eks bench checkpoint` (wired in by bench/commands.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.options import path_option

_WORKDIR = paths.write_folder("disk tiers")
_JSON = paths.write_file("figures as JSON", "runs/checkpoint-bench.json")
Workdir = Annotated[
    Path | None,
    path_option("--workdir", path=_WORKDIR, help="Folder for the disk tiers (default: system temp)."),
]
JsonOut = Annotated[
    Path | None,
    path_option(
        "--json-out", path=_JSON, help="Also write the figures as JSON (read by `nvrx-eks plan --from`)."
    ),
]


def register(bench: typer.Typer) -> None:
    @bench.command("checkpoint")
    def checkpoint(  # noqa: PLR0917 - typer maps each option to a parameter
        state_gb: Annotated[
            float, typer.Option(help="Model state per rank (>= 1 for the reported figures).")
        ] = 1.0,
        step_s: Annotated[float, typer.Option(help="Emulated forward/backward time per step.")] = 0.5,
        interval: Annotated[
            list[int] | None,
            typer.Option(help="Memory snapshot every N steps (repeat; default 2, 4, 12 steps)."),
        ] = None,
        durable_factor: Annotated[
            int, typer.Option(min=1, help="Durable cadence = this x the memory interval.")
        ] = 1,
        checkpoints: Annotated[int, typer.Option(min=2, help="Snapshots measured per row.")] = 6,
        torture_trials: Annotated[int, typer.Option(min=0, help="kill -9 trials (0 skips).")] = 100,
        workdir: Workdir = None,
        json_out: JsonOut = None,
        nvrx: Annotated[
            bool,
            typer.Option(
                help="Also run NVRx's own checkpointing on the same loop, printed beside the kit's rows."
            ),
        ] = True,
    ) -> None:
        """Loop stall vs the memcpy floor, efficiency vs sync torch.save/DCP and NVRx's own
        checkpointing, restore per tier, kill -9."""
        from nvrx_eks.bench.checkpoint.bench import bench as run  # noqa: PLC0415

        run(
            state_gb=state_gb,
            step_s=step_s,
            intervals=interval or [2, 4, 12],
            durable_factor=durable_factor,
            checkpoints=checkpoints,
            torture_trials=torture_trials,
            workdir=workdir,
            json_out=json_out,
            nvrx=nvrx,
        )
