"""What ranks and launchers say on a console they share arrives one whole line at a time.

The ranks of a node write to their launcher's stdout, unbuffered in the pods. `print` writes a line's
text and its newline in two calls there, so two ranks that speak at once ran their lines together
("...; next step 1rank 1: resumed after ..."), which a reader, and a log search for either line,
misses. Everything the trainer and the launcher say goes through `kitcore.lines.say`, one write a line.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from nvrx_eks.kitcore.lines import say

REPO = Path(__file__).resolve().parents[2]
LINES = 400
SPEAKER = """
import sys
from nvrx_eks.kitcore.lines import say
for i in range({lines}):
    say(f"rank {{sys.argv[1]}}: line {{i}} " + "x" * 200)
"""


def _two_at_once() -> list[str]:
    """The lines two unbuffered processes said at the same time on one pipe."""
    env = os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    read, write = os.pipe()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SPEAKER.format(lines=LINES), str(rank)], stdout=write, env=env
        )
        for rank in (0, 1)
    ]
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    return out.splitlines()


def _whole(lines: list[str]) -> bool:
    return len(lines) == 2 * LINES and all(
        line.count("rank ") == 1 and line.endswith("x" * 200) for line in lines
    )


def test_two_processes_saying_lines_at_once_never_run_them_together():
    assert _whole(_two_at_once())


class _Writes:
    """A stream that keeps each write call apart, as an unbuffered pipe does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_line_is_one_write_where_print_makes_two():
    stream = _Writes()
    say("rank 0: resumed after step 4 from the durable tier; next step 5", stream=stream)  # type: ignore[arg-type]
    assert stream.calls == ["rank 0: resumed after step 4 from the durable tier; next step 5\n"]
    print("the same line", file=stream)  # the race: text and newline apart  # type: ignore[arg-type]
    assert stream.calls[1:] == ["the same line", "\n"]


def test_the_trainer_and_the_launcher_say_their_lines_through_say():
    """A bare `print` in training/ or kitcore/ would bring the race back (a Rich console and a
    `file=` other than a shared stream are other things)."""
    bare = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for package in ("training", "kitcore")
        for path in (REPO / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"
    ]
    assert bare == []
