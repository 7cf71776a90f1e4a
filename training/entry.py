"""Run a training script's entry point in this process, as `python -m MODULE ARGS` or `python SCRIPT ARGS`
would: the worker ft_launcher forks from the warm forkserver runs this file (`--run-path`, see
training/resilience/launch.py), which hands the process to the script named after it.

    python training/entry.py --module examples.hf_llama.train --steps 80
    python training/entry.py --script /workspace/train.py --steps 80

A module or script that does not exist is a configuration error: one message, exit 2, in every rank,
before any collective.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

from nvrx_eks.kitcore.configio import UserError, exit_on_user_error

USAGE = "training/entry.py (--module MODULE | --script PATH) [ARGS...]"


def resolve(argv: list[str]) -> tuple[str, str, list[str]]:
    """("module" | "script", its name or path, its arguments); UserError when it cannot run."""
    if len(argv) < 2 or argv[0] not in {"--module", "--script"}:  # noqa: PLR2004 - the kind and its name
        raise UserError(f"usage: {USAGE}")
    kind, target, args = argv[0].removeprefix("--"), argv[1], argv[2:]
    if kind == "script":
        path = Path(target)
        if not path.is_file():
            raise UserError(
                f"entrypoint.script {target}: no such file in the image (working folder {Path.cwd()}); "
                "give the script's path inside the image, or use entrypoint.module"
            )
        return kind, str(path.resolve()), args
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        spec, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "no such module"
    if spec is None:
        raise UserError(
            f"entrypoint.module {target}: {why} on this worker's path ({', '.join(sys.path[:3])}, ...); "
            "install your package into the image (images/README.md) or fix the module name"
        )
    return kind, target, args


def main(argv: list[str] | None = None) -> None:
    with exit_on_user_error():
        kind, target, args = resolve(sys.argv[1:] if argv is None else argv)
        sys.argv = [target, *args]
        try:
            if kind == "script":
                sys.path.insert(0, str(Path(target).parent))  # as `python SCRIPT` puts its folder first
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        except ImportError as exc:
            # A dependency the image lacks fails the same way on every rank and every restart.
            raise UserError(
                f"entrypoint.{kind} {target} does not import: {type(exc).__name__}: {exc}; add the missing "
                "package to your image (images/README.md: an image on the kit's)"
            ) from None


if __name__ == "__main__":
    main()
