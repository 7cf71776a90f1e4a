"""Child processes of this interpreter, as the tests start them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path


def run_python(
    *args: str,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python ARGS...` with the interpreter running the tests, its output captured as text; the exit
    status is the test's to assert unless `check`."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


# What a fresh interpreter reads from os.environ while it imports some modules.
_ENVIRON_PROBE = r"""
import json, os, sys
read = set()
class Env(dict):
    def __getitem__(self, k):
        read.add(k); return super().__getitem__(k)
    def get(self, k, d=None):
        read.add(k); return super().get(k, d)
    def __contains__(self, k):
        read.add(k); return super().__contains__(k)
os.environ = Env(os.environ)
for name in sys.argv[1].split(","):
    __import__(name)
print(json.dumps(sorted(read)))
"""


def import_probe(script: str, modules: tuple[str, ...] | list[str], *, cwd: Path) -> Any:
    """What probe `script` printed as JSON on its last line, run by a fresh interpreter from `cwd` with
    `modules`, comma-separated, as its one argument (it imports them in order)."""
    done = run_python("-c", script, ",".join(modules), timeout=120, cwd=cwd, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def environ_read_at_import(modules: tuple[str, ...] | list[str], *, cwd: Path) -> set[str]:
    """The environment variables a fresh interpreter looked up (os.environ's `[]`, `get`, `in`) while it
    imported `modules` in order, from `cwd`."""
    return set(import_probe(_ENVIRON_PROBE, modules, cwd=cwd))
