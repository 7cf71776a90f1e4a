"""One console line, one write.

The ranks of a node share their launcher's stdout, and the pods run Python unbuffered
(`PYTHONUNBUFFERED=1`, so a line reaches `kubectl logs` the moment it is said). Unbuffered, `print`
writes its text and its newline in two calls, and two ranks that speak at once run their lines
together: "...; next step 1rank 1: resumed after ...". `say` hands the line and its newline to the
stream in one write, which a pipe keeps whole up to PIPE_BUF (4 KiB on Linux). Every line the kit's
processes say on a console shared with others goes through it.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, *, stream: TextIO | None = None) -> None:
    """`line` and its newline on `stream` (stdout) in one write, flushed."""
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()
