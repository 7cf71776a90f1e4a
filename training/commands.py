"""Subcommands this part adds to `nvrx-eks` (see nvrx_eks/cli.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer


def register(**groups: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
    from training.checkpoint import commands as ckpt_commands  # noqa: PLC0415 - keeps the CLI import light

    if "bench" in groups:
        ckpt_commands.register(groups["bench"])
