"""The one way the kit makes a Rich console: tables are never cut when stdout is not a terminal.

Rich cannot ask a file or a pipe how wide it is, so it lays out for 80 columns (or $COLUMNS), and a
table wider than that shrinks its cells until they end in "…": "good…", "youn…". Whoever saves the
output or pastes it into a ticket loses the figures. A console from `make_console` printing to
anything but a terminal widens itself, for the one print, to the natural width of the widest table in
it; rules and plain text keep the usual width. In a terminal nothing changes: the window's width is
known, and the reader can widen it.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

_UNBOUNDED = 1_000_000


class _WholeTableConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: ANN401 - Rich's own signature
        """Console.print, at least as wide as the widest table printed when the output is no terminal."""
        need = 0 if self.is_terminal else natural_width(self, objects)
        if need <= self.width:
            super().print(*objects, **kwargs)
            return
        saved = self._width
        self.width = need
        try:
            super().print(*objects, **kwargs)
        finally:
            self._width = saved


def natural_width(console: Console, objects: tuple[Any, ...]) -> int:
    """The columns the widest table among `objects` takes with no cell cut or wrapped (0: no table)."""
    options = console.options.update_width(_UNBOUNDED)
    return max(
        (Measurement.get(console, options, obj).maximum for obj in objects if isinstance(obj, Table)),
        default=0,
    )


def make_console(*, stderr: bool = False, file: IO[str] | None = None, record: bool = False) -> Console:
    """A Rich console for the CLI (see the module docstring)."""
    return _WholeTableConsole(stderr=stderr, file=file, record=record)
