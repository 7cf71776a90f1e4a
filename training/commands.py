"""Subcommands this part adds to `nvrx-eks` (see infra/cli.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer


def register(**groups: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
