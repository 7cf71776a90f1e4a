"""Run a training script's entry point in this process, as `python -m MODULE ARGS` or `python SCRIPT ARGS`
would: the worker ft_launcher forks from the warm forkserver runs this file (`--run-path`, see
training/resilience/launch.py), which hands the process to the script named after it.

    python training/entry.py --module examples.hf_llama.train --steps 80
    python training/entry.py --script /workspace/train.py --steps 80

A module or script that does not exist, or does not import, is a configuration error: one message,
exit 2, in every rank, before any collective (the launcher checks it once before any rank starts:
`entry_problem`). Whatever else ends the script early -- its own `sys.exit(2)` after an argparse error,
an exception before `kit.Job().run` -- reaches the launcher's failure summary, and so the job's failure
reason, in one line (kitcore/supervisor.py), not as torch's generic "To enable traceback".
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from nvrx_eks.kitcore import supervisor
from nvrx_eks.kitcore.configio import UserError, exit_on_user_error
from nvrx_eks.training.failures import describe

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

USAGE = "training/entry.py (--module MODULE | --script PATH) [ARGS...]"
_FIX_MODULE = "install your package into the image (images/README.md) or fix the module name"


def find_module(name: str, path: Sequence[str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """`name`'s spec found as the import system finds it -- every finder on `sys.meta_path`, each
    submodule in its parent's search locations -- without running any of its packages' `__init__` (a
    package that imports torch would make the launcher pay for it). None when not found this way (a
    package that extends its own `__path__` at import is found only by importing it)."""
    parts = name.split(".")
    locations: list[str] | None = None if path is None else list(path)
    spec = None
    for depth in range(len(parts)):
        if depth and not locations:
            return None
        spec = _find(".".join(parts[: depth + 1]), locations)
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
    return spec


def _find(fullname: str, locations: list[str] | None) -> importlib.machinery.ModuleSpec | None:
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec: importlib.machinery.ModuleSpec | None = find(fullname, locations)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def script_path(target: str) -> Path | None:
    """The script `target` names: itself when absolute; else relative to the working folder, then to
    each folder of the Python path (an image built on the kit's has the project's folder there)."""
    path = Path(target)
    bases = [Path()] if path.is_absolute() else [Path.cwd(), *(Path(p) for p in sys.path if p)]
    return next(((base / path).resolve() for base in bases if (base / path).is_file()), None)


def entry_problem(kind: str, target: str) -> str | None:
    """Why `kind` ("module" | "script") `target` cannot run from this process's working folder and Python
    path, or None. Imports nothing while the answer is yes; confirms a no by importing the parents."""
    if kind == "script":
        if script_path(target) is not None:
            return None
        return (
            f"entrypoint.script {target}: no such file in the image (working folder {Path.cwd()}, or "
            "relative to the Python path); give the script's path inside the image, or use entrypoint.module"
        )
    if find_module(target) is not None:
        return None
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        spec, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "no such module"
    if spec is not None:
        return None
    where = ", ".join(sys.path[:3])
    return f"entrypoint.module {target}: {why} on the Python path ({where}, ...); {_FIX_MODULE}"


def entry_source(kind: str, target: str) -> Path | None:
    """The file the entry point's code is in (a module's source, a package's `__main__`), or None."""
    if kind == "script":
        return script_path(target)
    spec = find_module(target)
    if spec is not None and spec.submodule_search_locations:  # a package runs its __main__
        spec = find_module(f"{target}.__main__")
    origin = None if spec is None else spec.origin
    return Path(origin) if origin and origin.endswith(".py") and Path(origin).is_file() else None


def resolve(argv: list[str]) -> tuple[str, str, list[str]]:
    """("module" | "script", its name or path, its arguments); UserError when it cannot run."""
    if len(argv) < 2 or argv[0] not in {"--module", "--script"}:  # noqa: PLR2004 - the kind and its name
        raise UserError(f"usage: {USAGE}")
    kind, target, args = argv[0].removeprefix("--"), argv[1], argv[2:]
    problem = entry_problem(kind, target)
    if problem is not None:
        raise UserError(problem)
    return kind, str(script_path(target)) if kind == "script" else target, args


class _Tail:
    """stderr as it was, keeping the last text written to it: what a script's own `sys.exit(2)` (an
    argparse error) said."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.text = ""

    def write(self, text: str) -> int:
        self.text = (self.text + text)[-2000:]
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - the stream's own attributes
        return getattr(self._stream, name)

    def last_line(self) -> str:
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        return lines[-1] if lines else ""


@contextlib.contextmanager
def _told_to_launcher(kind: str, target: str, tail: _Tail) -> Iterator[None]:
    """Whatever ends the script early, told to the launcher in one line (unless the kit told it already)."""
    try:
        yield
    except SystemExit as exc:
        if exc.code not in (0, None) and supervisor.told() is None:
            said = exc.code if isinstance(exc.code, str) else tail.last_line()
            code = 1 if isinstance(exc.code, str) else exc.code
            supervisor.tell(f"entrypoint.{kind} {target} exited {code}{': ' + said if said else ''}")
        raise
    except ImportError as exc:
        # A dependency the image lacks fails the same way on every rank and every restart.
        raise UserError(
            f"entrypoint.{kind} {target} does not import: {type(exc).__name__}: {exc}; add the missing "
            "package to your image (images/README.md: an image on the kit's)"
        ) from None
    except SyntaxError as exc:
        raise UserError(
            f"entrypoint.{kind} {target}: {type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
        ) from None
    except Exception as exc:
        # Before `kit.Job().run` (or after it): a failure for the launcher to restart, said in one line.
        if supervisor.told() is None:
            supervisor.tell(f"entrypoint.{kind} {target}: {describe(exc)}")
        raise


def main(argv: list[str] | None = None) -> None:
    with exit_on_user_error():
        kind, target, args = resolve(sys.argv[1:] if argv is None else argv)
        sys.argv = [target, *args]
        tail = _Tail(sys.stderr)
        sys.stderr = tail
        try:
            with _told_to_launcher(kind, target, tail):
                if kind == "script":
                    sys.path.insert(0, str(Path(target).parent))  # as `python SCRIPT` puts its folder first
                    runpy.run_path(target, run_name="__main__")
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
        finally:
            sys.stderr = tail._stream  # noqa: SLF001


if __name__ == "__main__":
    main()
