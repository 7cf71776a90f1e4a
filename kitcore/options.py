"""Options several `nvrx-eks` commands share, declared once as typer's Annotated types, and
`path_option`: an option whose value is checked as one of kitcore/paths.py's kinds.

Only the CLI's command modules import this (typer at import time); the trainer never does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from nvrx_eks.kitcore.paths import PathType


def path_option(*names: str, path: PathType, help: str, **options: Any) -> Any:  # noqa: A002, ANN401
    """A typer option (`names`, `help`, typer's other `options`) whose value is checked as `path`."""
    return typer.Option(*names, parser=path, help=help, **options)


Overrides = Annotated[
    list[str] | None, typer.Option("--set", help="Override a value: key.sub=value (repeatable).")
]
"""`--set key.sub=value`, repeatable: overrides of a YAML file's fields (kitcore/configio.py)."""
