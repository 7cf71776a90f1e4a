"""A local pod's Python containers as forks of one warm interpreter (the `warm` runtime).

Each container of the kit's images that runs Python runs `python -m MODULE ARGS`: the self-check, the
launcher, the topology reader, the store's control process. As fresh interpreters every one of them
imports torch, and the self-check the checkpointer's implementation too: seconds of CPU per pod
start, which a local run of many short jobs on a small machine (the test suite) spends over and over
(docs/measurements.md). `WarmStarter` keeps a server process that has imported `PRELOAD` and forks
it for each such container, as the launcher's forkserver does for the ranks; `process_starter` keeps one
for every run of the process, so a run does not pay for the server's imports either, and
`WarmStarter.end` ends one run's forks.

The fork becomes the container as `python -m` (or `python SCRIPT`) would have started it: its own
session; stdin from /dev/null, stdout and stderr to the pod's log (or each to a file of its own); the
container's environment (C-level `getenv` sees it, so torch and NVRx read it as usual) and working
folder; `sys.argv`; `sys.path` as a fresh interpreter builds it (the working folder for `-m` or the
script's own folder, then PYTHONPATH, then the interpreter's own); the stream buffering PYTHONUNBUFFERED
asks for; TMPDIR read again; a fresh `__main__`; the module run by CPython's own `-m` function, a script
compiled and run in `__main__` as CPython runs one. Its exit, an uncaught exception's traceback and exit
status 1, its atexit handlers are the interpreter's own. The server reports each fork's pid and exit
status in `subprocess.Popen`'s convention (-N: killed by signal N). The kit's containers all run `-m`;
the test suite forks its scripts too (tests/children.py).

What differs from a fresh interpreter, and why that is safe here:
- Modules imported before the fork (`PRELOAD`): a value one computes at import from the environment
  or the process id would be the server's in every fork. What is preloaded reads nothing a pod sets
  (but HOME, for sysconfig's user site folder, which only `pip install --user` uses), keeps no
  process id, and starts no Python thread (the server refuses to fork once a preload started one);
  tests/localrun/test_localrun_warm.py checks all three. Native code is another matter: torch sizes
  its thread pool from OMP_NUM_THREADS as it loads, so a fork computes with the server's size until
  it sets its own; the launcher's forkserver, which every rank forks from, sets the pod's
  (training/resilience/launch.py `fork_forkserver`).
- No module teardown at exit (`_run`).
- /proc/PID/environ: the kernel shows the environment block exec was given, which a fork shares with
  the server. The server's block ends with a marker of its own and room after it (`server_environment`),
  and each fork writes its own pod's marker there (`_mark`), as setproctitle rewrites argv: a search
  for one pod finds the fork and whatever it forks without an exec (the launcher's forkserver, the
  ranks, NVRx's monitor processes), a search for the whole run finds them all. `live_roots` lists the
  live forks too, for a search that runs before a fork has marked itself. What a fork execs carries
  the pod's environment as before.
- One hash seed for all forks.
- Start-up time: a pod starts in a fraction of a cluster container's time, so a run's figures that
  include a pod's start (a replacement's time to its first step) are not a cluster's. `nvrx-eks local
  run` and the demo start fresh interpreters (`processes`) unless asked for this runtime. A
  replacement pod also reaches the store sooner after a failure than on a cluster: a race that a
  cluster's slower start makes rare shows here every time (training/resilience/launch.py
  `open_rendezvous_store` is one such).

Any other command (a binary, an interpreter other than this one or with options) starts as a process.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import importlib.machinery
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import IO, Any

import psutil

PRELOAD = (
    "torch",
    "torch.distributed.run",
    "nvrx_eks.training.resilience.nvrx_compat",
    "nvrx_eks.training.checkpoint.factory",
    "nvrx_eks.training.checkpoint.tiered",
)
"""What the server imports once: torch (every Python container) and the checkpointer's implementation
(which the self-check probes). Not NVRx's modules: its launcher names its IPC socket after the
importing process's pid and TMPDIR at import, which every fork would then share. Not torch._dynamo
either, though it is most of what the launcher's forkserver still imports: it fixes its compile cache's
folder from TMPDIR at import (torch/_dynamo/package.py). tests/localrun/test_localrun_warm.py checks
PRELOAD for both kinds of import-time state."""

MARKER_ROOM_ENV = "NVRX_EKS_LOCAL_MARKER_ROOM"
"""The last variable of the server's environment: room for a fork's longer marker (`server_environment`)."""
_MARKER_ROOM_BYTES = 512

_MESSAGE_BYTES = 1 << 20
_KILL_WAIT_S = 5.0

_live_roots: dict[int, tuple[str, psutil.Process]] = {}
"""pid -> (pod marker, process) of every live process a `WarmStarter` forked: their /proc environ is
the server's (see the module docstring)."""
_live_lock = threading.Lock()


def _under(mark: str, marker: str) -> bool:
    """Whether pod marker `mark` is `marker` or lies below it (`<run-key>` covers a whole run)."""
    return mark == marker or mark.startswith(f"{marker}/")


def live_roots(marker: str) -> list[psutil.Process]:
    """The live forks whose pod marker is `marker` or lies below it (`<run-key>` matches a whole run),
    as `psutil.Process`es that check their pid was not reused before a signal."""
    with _live_lock:
        found = [proc for mark, proc in _live_roots.values() if _under(mark, marker)]
    return [proc for proc in found if proc.is_running()]


Entry = tuple[str, str]
"""What a fork runs: ("module", MODULE) as `python -m MODULE`, ("script", PATH) as `python PATH`."""


def warm_entry(argv: list[str], env: dict[str, str]) -> tuple[Entry, list[str]] | None:
    """(entry, args) when `argv` is `python -m MODULE ARGS` or `python SCRIPT ARGS` with this
    interpreter; None otherwise (an interpreter option, another interpreter, another program)."""
    if len(argv) < 2 or not Path(argv[0]).name.startswith("python"):  # noqa: PLR2004
        return None
    if argv[1] == "-m":
        if len(argv) < 3:  # noqa: PLR2004
            return None
        entry, args = ("module", argv[2]), argv[3:]
    elif argv[1].startswith("-"):
        return None
    else:
        entry, args = ("script", argv[1]), argv[2:]
    found = shutil.which(argv[0], path=env.get("PATH")) if os.sep not in argv[0] else argv[0]
    ours = Path(sys.executable)
    # The same binary in the same folder: this virtualenv's interpreter, not only the same binary.
    if found is None or Path(found).absolute().parent != ours.absolute().parent or not ours.samefile(found):
        return None
    return entry, args


def server_environment(env: dict[str, str], *, marker_env: str, marker: str) -> dict[str, str]:
    """`env` for the server: `marker_env=marker` last, then room for a fork to write a longer marker over
    both (`_mark`)."""
    rest = {k: v for k, v in env.items() if k not in (marker_env, MARKER_ROOM_ENV)}
    return rest | {marker_env: marker, MARKER_ROOM_ENV: "." * _MARKER_ROOM_BYTES}


def _mark(marker_env: str, marker: str) -> None:
    """Write `marker_env=marker` over the end of this process's exec-time environment block, which
    /proc/PID/environ shows: from `marker_env` on, where `server_environment` put it and the room after
    it, the rest filled with NULs (a reader's parse of the block ends at the first empty entry)."""
    import ctypes  # noqa: PLC0415 - only forks mark themselves

    # /proc/PID/stat fields 50 and 51: where the block starts and ends (proc(5)); fields from the third
    # on follow the command's name, which is in parentheses and may hold spaces.
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    start, end = int(fields[47]), int(fields[48])
    block = Path("/proc/self/environ").read_bytes()
    at = block.find(b"\0" + marker_env.encode() + b"=")
    tail = block[at + 1 :].split(b"\0") if at >= 0 else []
    names = [entry.partition(b"=")[0] for entry in tail if entry]
    entry, room = f"{marker_env}={marker}".encode() + b"\0", end - start - at - 1
    if names != [marker_env.encode(), MARKER_ROOM_ENV.encode()] or len(entry) > room:
        raise RuntimeError(
            f"warm runtime: cannot mark this fork {marker!r}: the server's environment ends {names}"
        )
    ctypes.memmove(start + at + 1, entry.ljust(room, b"\0"), room)


class WarmProcess:
    """A started container, with the part of `subprocess.Popen`'s interface the executor uses."""

    def __init__(self, pid: int, args: list[str], marker: str) -> None:
        self.pid, self.args, self.marker = pid, args, marker
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        with _live_lock:
            _live_roots.pop(self.pid, None)
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None  # noqa: S101 - set before the event
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # never a reaped pid, which may be another process's by now
            os.kill(self.pid, sig)


class WarmStarter:
    """One server process and the containers it forked; `close` ends both."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, *, env: dict[str, str] | None = None) -> None:
        """`env`: the server's environment (default: this process's); each fork gets its own."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._server = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno()), *preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        ready = json.loads(ours.recv(_MESSAGE_BYTES) or b"{}")
        if ready.get("threads") != 1:
            self.close()
            raise RuntimeError(f"warm runtime: the server could not start ({ready or 'it exited'})")
        self._send_lock = threading.Lock()
        self._started: dict[int, WarmProcess | str] = {}
        self._started_cv = threading.Condition()
        self._running: dict[int, WarmProcess] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="warm-starter", daemon=True)
        self._reader.start()

    def start(
        self,
        entry: Entry,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log: IO[bytes],
        marker: str,
        marker_env: str | None = None,
        errors: IO[bytes] | None = None,
    ) -> WarmProcess:
        """`entry` (`warm_entry`) with `args` in `cwd` with `env`, its output to `log` (its standard
        error to `errors` if given); `marker`: its pod's, which the fork writes into its /proc environ
        as `marker_env` (the server's environment from `server_environment`)."""
        with self._send_lock:
            self._next += 1
            key = self._next
            request = {
                "id": key,
                "entry": list(entry),
                "args": args,
                "env": env,
                "cwd": str(cwd),
                "marker": marker,
                "marker_env": marker_env,
            }
            streams = [log.fileno()] if errors is None else [log.fileno(), errors.fileno()]
            socket.send_fds(self._sock, [json.dumps(request).encode()], streams)
            with self._started_cv:
                self._started_cv.wait_for(lambda: key in self._started or not self._reader.is_alive())
                started = self._started.pop(key, "the warm server exited")
        if isinstance(started, str):
            raise OSError(started)
        return started

    def _read(self) -> None:
        while message := self._sock.recv(_MESSAGE_BYTES):
            event: dict[str, Any] = json.loads(message)
            if "started" in event:
                with self._started_cv:
                    if "pid" in event:
                        proc = WarmProcess(event["pid"], [event["entry"][1]], event["marker"])
                        self._running[proc.pid] = proc
                        with _live_lock, contextlib.suppress(psutil.Error):  # gone already: nothing to find
                            _live_roots[proc.pid] = (event["marker"], psutil.Process(proc.pid))
                        self._started[event["started"]] = proc
                    else:
                        self._started[event["started"]] = event["error"]
                    self._started_cv.notify_all()
            elif "exited" in event:
                with self._started_cv:
                    ended = self._running.pop(event["exited"], None)
                if ended is not None:
                    ended._set_exit(event["code"])  # noqa: SLF001 - the reader owns the process objects
        # The server is gone. One that ended killed what it forked (`_serve`); one killed by a signal
        # could not, and the executor's search by pod marker ends those. Either way, a fork whose exit
        # it did not report reads as killed.
        with self._started_cv:
            left, self._running = list(self._running.values()), {}
            self._started_cv.notify_all()
        for proc in left:
            proc._set_exit(-signal.SIGKILL)  # noqa: SLF001

    def alive(self) -> bool:
        """Whether the server still forks. One that died by a signal killed nothing it forked: the
        executor's search by pod marker ends those (executor.py `kill_pod_processes`)."""
        return self._server.poll() is None and self._reader.is_alive()

    def end(self, marker: str) -> None:
        """Kill the forks whose pod marker is `marker` or lies below it, and wait until the server has
        reported each one's exit. The server kills them: it alone knows that a pid is still its fork's,
        not reaped and reused."""
        with self._started_cv:
            ending = [proc for proc in self._running.values() if _under(proc.marker, marker)]
        if not ending:
            return
        with self._send_lock, contextlib.suppress(OSError):  # a dead server reports them as killed
            self._sock.send(json.dumps({"end": marker}).encode())
        for proc in ending:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_KILL_WAIT_S)

    def close(self) -> None:
        """Kill what the server forked, then the server."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)  # the server reads the end, kills its forks and exits
        try:
            self._server.wait(timeout=_KILL_WAIT_S * 2)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        if hasattr(self, "_reader"):
            self._reader.join(timeout=_KILL_WAIT_S)
        self._sock.close()


_process_starter: tuple[int, WarmStarter] | None = None
"""(the pid that started it, this process's server): a forked child of this process has none."""
_process_lock = threading.Lock()


def process_starter(env: dict[str, str]) -> WarmStarter:
    """This process's server: started at first use with `env` (`server_environment`'s), and again if it
    died. Every run of the process forks from it, so a run pays no server start (its imports: seconds
    of CPU) and `WarmStarter.end` ends each run's forks. What the preload read at import is then the
    first run's environment: nothing a pod sets (the module docstring). The server ends with the
    process: at exit, or when the kernel closes its end of the socket."""
    global _process_starter  # noqa: PLW0603 - one per process, by design
    with _process_lock:
        ours = _ours()
        if ours is not None and ours.alive():
            return ours
        if ours is not None:
            ours.close()
        else:
            atexit.register(_close_process_starter)
        started = WarmStarter(env=env)
        _process_starter = (os.getpid(), started)
        return started


def end_process_forks(marker: str) -> None:
    """Kill what this process's server forked for pods under `marker` (`WarmStarter.end`)."""
    with _process_lock:
        ours = _ours()
    if ours is not None:
        ours.end(marker)


def _ours() -> WarmStarter | None:
    """This process's server, if it started one (a forked child did not)."""
    if _process_starter is None or _process_starter[0] != os.getpid():
        return None
    return _process_starter[1]


def _close_process_starter() -> None:
    with _process_lock:
        ours = _ours()
    if ours is not None:
        ours.close()


# ----- the server (`python -m nvrx_eks.localrun.warm FD MODULE...`) --------------------------------------


def _serve(sock: socket.socket, preload: list[str]) -> dict[str, Any] | None:
    """Import `preload`, then fork for each request until the client's end closes. Returns the request
    in a fork (which then becomes its container), None in the server when it is done."""
    if not _preloaded(sock, preload):
        return None
    forks: dict[int, tuple[int, str]] = {}  # pidfd -> (pid, pod marker)
    try:
        while True:
            readable, _, _ = select.select([sock, *forks], [], [])
            _reap([fd for fd in readable if fd in forks], sock=sock, forks=forks)
            if sock not in readable:
                continue
            message, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 2)
            if not message:
                return None
            request: dict[str, Any] = json.loads(message)
            if "end" in request:  # a run's end: its forks go; their exits are reported as any other
                for pid in [pid for pid, mark in forks.values() if _under(mark, request["end"])]:
                    _kill_fork(pid)
            elif _fork(request, streams=fds, sock=sock, forks=forks):
                return request
    finally:
        for pid, _ in forks.values():
            _kill_fork(pid)
        for pidfd, (pid, _) in forks.items():
            os.waitpid(pid, 0)
            os.close(pidfd)


def _preloaded(sock: socket.socket, preload: list[str]) -> bool:
    """Import `preload` and tell the client how many threads run now: one, or the server may not fork."""
    for name in preload:
        importlib.import_module(name)
    threads = threading.active_count()
    sock.send(json.dumps({"threads": threads}).encode())
    return threads == 1


def _reap(ended: list[int], *, sock: socket.socket, forks: dict[int, tuple[int, str]]) -> None:
    """Reap the forks whose pidfds in `ended` read as exited, and report each one's exit status."""
    for pidfd in ended:
        pid, _ = forks.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _kill_fork(pid: int) -> None:
    """SIGKILL a fork not yet reaped (so its pid is still its own), and its process group once it leads
    one (a fork just made may not yet)."""
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _fork(
    request: dict[str, Any], *, streams: list[int], sock: socket.socket, forks: dict[int, tuple[int, str]]
) -> bool:
    """Fork for `request`: True in the fork (now its container, the server's descriptors closed),
    False in the server (which said the fork's pid, or why there is none). `streams`: the descriptors
    of its output and, if apart, of its standard error."""
    reply = {"started": request["id"], "entry": request["entry"]}
    try:
        pid = os.fork()
    except OSError as exc:
        sock.send(json.dumps({**reply, "error": f"fork: {exc}"}).encode())
        for fd in streams:
            os.close(fd)
        return False
    if pid == 0:
        for fd in forks:
            os.close(fd)
        forks.clear()  # the server's, not this fork's to end
        sock.close()
        _become(request, streams=streams)
        return True
    for fd in streams:
        os.close(fd)
    forks[os.pidfd_open(pid)] = (pid, request["marker"])
    sock.send(json.dumps({**reply, "pid": pid, "marker": request["marker"]}).encode())
    return False


def _become(request: dict[str, Any], *, streams: list[int]) -> None:
    """Turn this fork into the container `request` describes, as `python -m` or `python SCRIPT` would
    have started it."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(streams[0], 1)
    os.dup2(streams[-1], 2)
    for fd in set(streams):
        os.close(fd)
    env: dict[str, str] = request["env"]
    if request.get("marker_env"):
        _mark(request["marker_env"], request["marker"])
    # site.py's own treatment of sys.path: absolute (abspath: no symlink followed), no repeats.
    servers = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}  # noqa: PTH100
    own = [p for p in sys.path[1:] if p not in servers]  # the interpreter's own: stdlib, site-packages
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = env.get("PYTHONIOENCODING", "utf-8").split(":")[0] or "utf-8"
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
    sys.stdout = _stream(1, encoding=encoding, unbuffered=unbuffered, line=False)
    sys.stderr = _stream(2, encoding=encoding, unbuffered=unbuffered, line=True)
    # As a fresh interpreter's: the working folder for `-m` (a script's own folder, its links resolved),
    # then PYTHONPATH's entries, then its own.
    kind, target = request["entry"]
    first = str(Path.cwd()) if kind == "module" else os.path.dirname(os.path.realpath(target))  # noqa: PTH120
    given = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]  # noqa: PTH100
    # The first entry comes after site.py has removed repeats from the rest, so it may repeat one of them.
    sys.path[:] = [first, *dict.fromkeys([*given, *own])]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    # `-m` replaces argv[0] with the module's file; a script's stays as given.
    sys.argv = ["-m" if kind == "module" else target, *request["args"]]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if kind == "module":
        sys.modules.pop(target, None)  # run as __main__, as a fresh interpreter would


def _stream(fd: int, *, encoding: str, unbuffered: bool, line: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    binary: io.RawIOBase | io.BufferedWriter = raw if unbuffered else io.BufferedWriter(raw)
    errors = "backslashreplace" if fd == 2 else "strict"  # noqa: PLR2004 - stderr, as CPython sets it
    return io.TextIOWrapper(
        binary,  # type: ignore[arg-type]
        encoding=encoding,
        errors=errors,
        line_buffering=line,
        write_through=unbuffered,
    )


def _run(entry: Entry) -> None:
    """Run `entry` as `python -m` or `python SCRIPT` does, then end as the interpreter would, less its
    module teardown.

    The exit steps are the interpreter's, in its order: the exit status (SystemExit's code, or 1 after
    the traceback), non-daemon threads joined, atexit handlers, the standard streams flushed. What is
    left out is tearing down every module, whose writes to the heap the fork shares with the server
    would copy most of it page by page (most of a second per container); multiprocessing's forkserver
    ends its workers the same way, with `os._exit`.
    """
    import atexit  # noqa: PLC0415
    import runpy  # noqa: PLC0415

    code, interrupted = 0, False
    try:
        if entry[0] == "module":
            # CPython's own `python -m` (Modules/main.c calls it): the module found by its spec, argv[0]
            # set to its file, its code run in `__main__`.
            runpy._run_module_as_main(entry[1], alter_argv=True)  # type: ignore[attr-defined]  # noqa: SLF001
        else:
            code = _run_script(entry[1])
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt as exc:
        _uncaught(exc)
        interrupted = True
    except BaseException as exc:  # noqa: BLE001 - the interpreter's own handling of an uncaught exception
        _uncaught(exc)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001 - the interpreter's thread join
    atexit._run_exitfuncs()  # noqa: SLF001 - the interpreter's atexit step
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # as CPython ends on an uncaught KeyboardInterrupt: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _run_script(target: str) -> int:
    """Run the script at `target` in `__main__` as `python SCRIPT` does (Modules/main.c, then
    pythonrun.c): its absolute path as `__file__` and as the code's file name, no spec, no cached file,
    the streams flushed when it ends; exit status 2 and the interpreter's line when it cannot be opened."""
    path = os.path.abspath(target)  # noqa: PTH100
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        print(
            f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr
        )
        return 2
    main = sys.modules["__main__"]
    main.__file__, main.__cached__ = path, None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    try:
        exec(compile(source, path, "exec"), main.__dict__)  # noqa: S102 - what the interpreter itself does
    finally:  # pythonrun.c flushes both streams after a script, before it prints an uncaught exception
        for stream in (sys.stderr, sys.stdout):
            with contextlib.suppress(Exception):
                stream.flush()
    return 0


def _uncaught(exc: BaseException) -> None:
    """The traceback as the interpreter prints it: from runpy's frames (`-m`) or the script's on, without
    this module's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def _exit_code(code: object) -> int:
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    request = _serve(sock, sys.argv[2:])
    if request is not None:
        _run(tuple(request["entry"]))


if __name__ == "__main__":
    main()
