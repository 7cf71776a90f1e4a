"""Subcommands this part adds to `nvrx-eks` (see nvrx_eks/cli.py)."""

from __future__ import annotations

from pathlib import Path  # noqa: TC003 - typer reads the annotation at run time
from typing import Annotated

import typer

from kitcore import paths


def register(**groups: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
    from training.checkpoint import commands as ckpt_commands  # noqa: PLC0415 - keeps the CLI import light

    if "bench" in groups:
        ckpt_commands.register(groups["bench"])
    if "app" in groups:
        _register_report(groups["app"])


def _register_report(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        run_dir: Annotated[
            Path,
            typer.Argument(
                metavar="RUN_DIR",
                parser=paths.update_folder("run folder", "runs/demo-YYYYMMDD-HHMMSS"),
                help="A run folder (make demo's, a bench mode's, a trainer run).",
            ),
        ],
    ) -> None:
        """Write RUN_DIR/report.html: fault table, totals, timeline and bit-identity verdict, one page."""
        from training.report import report_run  # noqa: PLC0415 - keeps the CLI import light

        print(report_run(run_dir))
