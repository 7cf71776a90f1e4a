"""Subcommands this part adds to `nvrx-eks` (see infra/cli.py)."""

from __future__ import annotations

import typer


def register(**groups: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
