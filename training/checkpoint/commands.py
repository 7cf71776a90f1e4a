"""`nvrx-eks bench checkpoint` (wired in by training/commands.py)."""

from __future__ import annotations

from pathlib import Path  # noqa: TC003 - typer reads the annotations at runtime
from typing import Annotated

import typer


def register(bench: typer.Typer) -> None:
    @bench.command("checkpoint")
    def checkpoint(
        state_gb: Annotated[
            float, typer.Option(help="Model state per rank (>= 1 for the reported figures).")
        ] = 1.0,
        step_s: Annotated[float, typer.Option(help="Emulated step time.")] = 0.25,
        interval: Annotated[
            list[int] | None, typer.Option(help="Checkpoint every N steps (repeat; 3 values).")
        ] = None,
        torture_trials: Annotated[int, typer.Option(help="kill -9 trials (0 skips).")] = 100,
        workdir: Annotated[
            Path | None, typer.Option(help="Folder for the disk tiers (default: system temp).")
        ] = None,
    ) -> None:
        """Loop stall vs the memcpy floor, efficiency vs sync torch.save/DCP, restore per tier, kill -9."""
        from training.checkpoint.bench import bench as run  # noqa: PLC0415

        run(
            state_gb=state_gb,
            step_s=step_s,
            intervals=interval or [2, 8, 40],
            torture_trials=torture_trials,
            workdir=workdir,
        )
