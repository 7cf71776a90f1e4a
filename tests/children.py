"""Child processes of this interpreter, as the tests start them.

`python -m MODULE` and `python SCRIPT` start as forks of this process's warm interpreter (localrun/
warm.py, the local runs' `warm` runtime), which has imported torch once: a fresh interpreter would
import it again, seconds of CPU per child and most of what the suite's short children cost.
tests/localrun/test_localrun_warm.py holds a fork to what a fresh interpreter runs. `python -c` (the
import probes) starts a fresh interpreter; a test that checks what the interpreter does at its exit
starts its children with `subprocess` itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from nvrx_eks.localrun.runtimes import warm_server
from nvrx_eks.localrun.warm import WarmProcess, warm_entry

if TYPE_CHECKING:
    from collections.abc import Mapping


class WarmChild:
    """A fork of the warm interpreter with the part of `subprocess.Popen`'s interface (text mode, pipes
    for its output and standard error, its own session) that the tests use."""

    def __init__(self, proc: WarmProcess, out: IO[bytes], err: IO[bytes] | None) -> None:
        self._proc, self._out, self._err = proc, out, err
        self.pid, self.args = proc.pid, proc.args
        self._read: tuple[str, str | None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """(output, standard error or None when it went to the output) once the child has exited, its
        files then closed, as Popen's pipes are; `subprocess.TimeoutExpired` while it runs past `timeout`."""
        self.wait(timeout)
        if self._read is None:
            self._read = (_text(self._out), None if self._err is None else _text(self._err))
            self._close()
        return self._read

    def _close(self) -> None:
        for stream in (self._out, self._err):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
            self.wait()
        self._close()


def _text(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode(errors="replace")


def start_python(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    merge_stderr: bool = False,
) -> WarmChild | subprocess.Popen[str]:
    """`python ARGS...` with the interpreter running the tests, in a session of its own, its output (and
    standard error with it if `merge_stderr`) captured as text: a warm fork unless it is `python -c`."""
    argv, env = [sys.executable, *args], dict(os.environ if env is None else env)
    found = warm_entry(argv, env)
    if found is None:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    starter = warm_server()
    out = tempfile.TemporaryFile()  # noqa: SIM115 - the child's, closed with it
    err = None if merge_stderr else tempfile.TemporaryFile()  # noqa: SIM115
    entry, rest = found
    proc = starter.start(entry, rest, env=env, cwd=cwd or Path.cwd(), log=out, errors=err, marker="")
    return WarmChild(proc, out, err)


def run_python(
    *args: str,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python ARGS...` to its end (`start_python`), its output captured as text; the exit status is the
    test's to assert unless `check`. Past `timeout` it is killed and `subprocess.TimeoutExpired` raised."""
    with start_python(*args, cwd=cwd, env=env) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            raise
    code = child.poll()
    assert code is not None  # communicate returned: the child has exited
    done = subprocess.CompletedProcess([sys.executable, *args], code, out, err)
    if check:
        done.check_returncode()
    return done


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
