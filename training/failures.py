"""A training script's own failures: said in one line, and a bug told from a fault.

`describe(exc)` is how the kit names a user's exception wherever it shows it (the rank's log, the
launcher's failure summary, the pod's termination message, the job's failure reason): its type, its
message folded into one line, and its place, the innermost frame in the user's code (not the kit's,
torch's or Python's own).

`History` decides when such an exception is a bug rather than a fault. A fault may strike once: the
first failure of a rank is always retried (in process, or by the launcher). The same exception (type,
message, place) at the same step in a later attempt of the same rank is the script's bug, and the job
ends once (exit 2) instead of restarting into it until every budget is spent. Only the same rank's
earlier attempts count: ranks that fail alike in one attempt (every data-parallel rank runs the same
code on the same step) are one failure, retried like any other. The history is kept per run (the run
folder's `failures/<run id>/rank-<r>.txt`), so it survives a launcher's restart of the rank and never
reaches into another run of the same folder.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

from nvrx_eks.kitcore.supervisor import one_line

_KIT = Path(__file__).resolve().parent
_KITCORE = _KIT.parent / "kitcore"
_LIBRARIES = tuple(
    str(Path(p).resolve())
    for name in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(name))
)
FAILURES_DIR = "failures"
RESTART_INTERRUPTS = frozenset({"RankShouldRestart", "DistBackendError", "DistNetworkError"})
"""NVRx's interrupt of a rank whose peer failed, and what a torn collective raises with it."""


def _is_kit(filename: str) -> bool:
    path = Path(filename).resolve()
    return path.is_relative_to(_KIT) or path.is_relative_to(_KITCORE)


def _is_library(filename: str) -> bool:
    """The kit's, Python's or an installed package's code (or code without a file: <frozen runpy>)."""
    if filename.startswith("<"):
        return True
    return str(Path(filename).resolve()).startswith(_LIBRARIES) or _is_kit(filename)


def _shown(filename: str) -> str:
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


def place(exc: BaseException) -> str:
    """Where `exc` was raised, as `file:line in function`: the innermost frame of the user's code, else
    the innermost of all ("?" without a traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    # The user's code may itself be installed as a library: then the innermost frame that is not the kit's.
    own = [f for f in frames if not _is_library(f.filename)]
    outside_kit = [f for f in frames if not _is_kit(f.filename)]
    return _where((own or outside_kit or frames)[-1])


def kit_place(exc: BaseException) -> str | None:
    """Where `exc` was raised when that is the kit's own code (`file:line in function`), else None: the
    script's call may be wrong, or the kit may be."""
    frames = traceback.extract_tb(exc.__traceback__)
    return _where(frames[-1]) if frames and _is_kit(frames[-1].filename) else None


def _where(frame: traceback.FrameSummary) -> str:
    return f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}"


def describe(exc: BaseException) -> str:
    """`Type: message (file:line in function)`, one line."""
    message = one_line(str(exc))[:300]
    return f"{type(exc).__name__}{': ' + message if message else ''} ({place(exc)})"


def is_restart_interrupt(exc: BaseException) -> bool:
    """A rank stopped because a peer failed (NVRx's interrupt, a torn collective): never the script's bug."""
    return type(exc).__name__ in RESTART_INTERRUPTS or (
        isinstance(exc, RuntimeError) and ("gloo" in str(exc).lower() or "timed out" in str(exc).lower())
    )


def signature(exc: BaseException, *, step: int) -> str:
    """What makes two failures the same: type, message, the innermost frame and the step."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__qualname__}|{str(exc)[:500]}|{where}|{step}".replace("\n", " ")


class History:
    """One rank's failures in one run, across its attempts and processes (see the module docstring)."""

    def __init__(self, run_dir: Path, *, run_id: str, rank: int) -> None:
        self.path = run_dir / FAILURES_DIR / run_id / f"rank-{rank}.txt"

    def seen(self, failure: str) -> bool:
        """Whether this rank failed this way in an earlier attempt of this run."""
        return self.path.is_file() and failure in self.path.read_text(encoding="utf-8").splitlines()

    def add(self, failure: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(failure + "\n")


def bug_message(exc: BaseException, *, rank: int, step: int | None) -> str:
    """The job's last word on a bug in the script: what, where, and that it is not retried (`step`
    None: in the attempt's setup, before its first step)."""
    at = f"step {step}" if step is not None else "setup (before the first step)"
    kit = kit_place(exc)
    verdict = (
        "; a bug, not a fault: nothing is retried"
        if kit is None
        else f", raised inside the kit at {kit}; nothing is retried: if the script's call there is right, "
        "it is the kit's bug"
    )
    return (
        f"the training script failed the same way twice on rank {rank} at {at}: {describe(exc)}{verdict} "
        "(the traceback is in the rank's log)"
    )
