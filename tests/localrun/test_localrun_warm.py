"""The warm runtime (localrun/warm.py): a `python -m` container forked from a warm interpreter is the
container a fresh interpreter would have been, as far as the container can tell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml
from children import environ_read_at_import, import_probe, run_python

from nvrx_eks.localrun.executor import CHAOS_ENV, kill_pod_processes, marked_processes
from nvrx_eks.localrun.runtimes import (
    POD_ENV,
    RUNTIME_ENV,
    WARM_SERVER_POD,
    Processes,
    WarmProcesses,
    runtime_named,
)
from nvrx_eks.localrun.warm import MARKER_ROOM_ENV, PRELOAD, WarmProcess, WarmStarter, process_starter

REPO = Path(__file__).resolve().parents[2]
RUN = f"warm-test-{os.getpid()}"
"""This module's run key: the pytest workers' runs never match each other's searches."""

_PROBE = """
import atexit, os, sys, tempfile, threading, time

atexit.register(lambda: print("atexit handler ran", flush=True))
print("argv", sys.argv)
print("path", sys.path[:2])
print("cwd", os.getcwd())
print("env", os.environ.get("PROBE_VALUE"), os.getenv("PROBE_VALUE"))
print("tmp", tempfile.gettempdir())
print("main", __name__, getattr(__spec__, "name", None), __file__)
print("session leader", os.getsid(0) == os.getpid())
print("unbuffered", sys.stdout.write_through)
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
what = sys.argv[1]
if what == "raise":
    raise ValueError("a bug in the container")
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "message":
    sys.exit("a message instead of a status")
sys.stdout.write("no newline at the end")
sys.exit(int(what))
"""


@pytest.fixture(scope="module")
def warm_runtime():
    """The runtime of the module's tests, whose forks the module's end ends."""
    runtime = WarmProcesses()
    yield runtime
    runtime.close(RUN)


@pytest.fixture
def container(tmp_path: Path, warm_runtime: WarmProcesses):
    """A folder with the probe module, and a start of it by either runtime: (exit status, output)."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "probe.py").write_text("import signal\n" + textwrap.dedent(_PROBE))
    (tmp_path / "tmp").mkdir()
    runtimes = {"processes": Processes(project_dir=tmp_path / "project"), "warm": warm_runtime}

    def start(runtime: str, what: str, *, unbuffered: bool = False, script: bool = False) -> tuple[int, str]:
        env = {**os.environ, "PROBE_VALUE": "from the pod", "TMPDIR": str(tmp_path / "tmp")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as the executor gives it
        env[POD_ENV] = f"{RUN}/pod-0"
        env.pop("PYTHONUNBUFFERED", None)
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
        entry = ["project/probe.py"] if script else ["-m", "probe"]  # a script's path as given, relative
        argv, env = runtimes[runtime].command(["python", *entry, what], env, spec=None)  # type: ignore[arg-type]
        env["PYTHONPATH"] = str(tmp_path / "project")
        log = tmp_path / f"{runtime}-{what}.log"
        with log.open("wb") as out:
            proc = runtimes[runtime].start(argv, env, cwd=tmp_path, log=out, run_key=RUN)
            assert isinstance(proc, WarmProcess) == (runtime == "warm")
            code = proc.wait(timeout=60)
        return code, log.read_text()

    return start


@pytest.mark.parametrize("script", [False, True], ids=["module", "script"])
@pytest.mark.parametrize("what", ["0", "3", "raise", "kill", "message"])
def test_a_warm_container_is_what_a_fresh_interpreter_runs(container, what, script):
    """`python -m MODULE` and `python SCRIPT`: same argv, sys.path, working folder, environment, TMPDIR,
    `__main__` and its file, session, exit status (a SIGKILL's -9 too), traceback, atexit handlers,
    non-daemon threads joined, output flushed."""
    cold = container("processes", what, script=script)
    warm = container("warm", what, script=script)
    assert warm == cold
    if what != "kill":  # a SIGKILL loses what the stream had not written yet
        assert "env from the pod from the pod\n" in warm[1]
    if what in {"0", "3"}:  # the buffered line, then the thread's (its flush), then the atexit handler's
        assert warm[1].endswith("no newline at the endthread joined\natexit handler ran\n"), warm[1]
    if what == "raise":
        assert warm[1].count("Traceback (most recent call last)") == 1
        assert "ValueError: a bug in the container" in warm[1]
    expected = {"0": 0, "3": 3, "raise": 1, "kill": -signal.SIGKILL, "message": 1}
    assert warm[0] == expected[what]


def test_a_warm_container_buffers_its_output_as_a_fresh_interpreter_does(container):
    assert container("warm", "0")[1] == container("processes", "0")[1]
    assert "unbuffered False" in container("warm", "0")[1]
    assert container("warm", "0", unbuffered=True) == container("processes", "0", unbuffered=True)
    assert "unbuffered True" in container("warm", "0", unbuffered=True)[1]


_DAEMON = """
import os, sys, time
# A daemon forked without an exec, out of the container's process tree (as NVRx's in-process monitor
# process leaves its rank's): only its marker says whose it is.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1] + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_a_warm_container_and_what_it_forks_carry_its_pod_marker_and_die_with_its_pod(tmp_path, warm_runtime):
    (tmp_path / "daemonizer.py").write_text(textwrap.dedent(_DAEMON))
    env = {**os.environ, POD_ENV: f"{RUN}/pod-1", "PYTHONPATH": str(tmp_path)}
    pid_file = tmp_path / "daemon.pid"
    with (tmp_path / "log").open("wb") as log:
        proc = warm_runtime.start(
            [sys.executable, "-m", "daemonizer", str(pid_file)], env, cwd=tmp_path, log=log, run_key=RUN
        )
    server = process_starter(dict(os.environ))._server.pid
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon = psutil.Process(int(pid_file.read_text()))
    try:
        assert isinstance(proc, WarmProcess)
        assert psutil.Process(proc.pid).ppid() == server
        assert daemon.ppid() != proc.pid
        # Both show their pod's marker in /proc, the rest of the environment as it was; the server, which
        # serves every run of this process, a marker of its own that no run's search matches.
        for pid in (proc.pid, daemon.pid):
            environ = psutil.Process(pid).environ()
            assert environ[POD_ENV] == f"{RUN}/pod-1"
            assert environ["PATH"] == os.environ["PATH"]
            assert MARKER_ROOM_ENV not in environ
        assert psutil.Process(server).environ()[POD_ENV] == WARM_SERVER_POD
        assert sorted(p.pid for p in marked_processes(f"{RUN}/pod-1")) == sorted([proc.pid, daemon.pid])
        assert sorted(p.pid for p in marked_processes(RUN)) == sorted([proc.pid, daemon.pid])
        assert marked_processes(f"{RUN}/pod-2") == []
        # Another process (a leak check, a test watching a `nvrx-eks local run`) finds them too.
        assert sorted(_marked_seen_from_another_process(RUN)) == sorted([proc.pid, daemon.pid])
        kill_pod_processes(f"{RUN}/pod-1")
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE
        assert marked_processes(RUN) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            daemon.kill()


def _sleeper(runtime: WarmProcesses, tmp_path: Path, run_key: str) -> WarmProcess:
    """A warm container of `run_key`'s pod-0 that sleeps a minute."""
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, POD_ENV: f"{run_key}/pod-0", "PYTHONPATH": str(tmp_path)}
    with (tmp_path / f"{run_key}.log").open("wb") as log:
        proc = runtime.start([sys.executable, "-m", "sleeper"], env, cwd=tmp_path, log=log, run_key=run_key)
    assert isinstance(proc, WarmProcess)
    return proc


def test_every_run_of_a_process_forks_from_one_server_and_a_runs_end_ends_only_its_forks(tmp_path):
    """A run pays no server start: the runs of one process, side by side or one after another, fork from
    one server, which outlives each of them."""
    first, second = WarmProcesses(), WarmProcesses()  # two executors' runtimes in one process
    one, other = _sleeper(first, tmp_path, f"{RUN}-a"), _sleeper(second, tmp_path, f"{RUN}-b")
    try:
        server = psutil.Process(one.pid).ppid()
        assert psutil.Process(other.pid).ppid() == server
        first.close(f"{RUN}-a")
        assert one.poll() == -signal.SIGKILL  # `close` returns once the server reported it
        assert other.poll() is None
        assert marked_processes(f"{RUN}-a") == []
        assert [p.pid for p in marked_processes(f"{RUN}-b")] == [other.pid]
        later = _sleeper(first, tmp_path, f"{RUN}-c")
        assert psutil.Process(later.pid).ppid() == server
        first.close(f"{RUN}-c")
        assert later.poll() == -signal.SIGKILL
        assert psutil.pid_exists(server)
    finally:
        second.close(f"{RUN}-b")
    assert other.poll() == -signal.SIGKILL


def test_a_dead_server_is_started_again_at_the_next_start(tmp_path):
    runtime = WarmProcesses()
    proc = _sleeper(runtime, tmp_path, f"{RUN}-d")
    server = psutil.Process(proc.pid).ppid()
    os.kill(server, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL  # no server reports it: it reads as killed
    kill_pod_processes(f"{RUN}-d")  # and is, as the executor ends every run: by the pods' marker
    again = _sleeper(runtime, tmp_path, f"{RUN}-d")
    try:
        assert psutil.Process(again.pid).ppid() not in {server, os.getpid()}
    finally:
        runtime.close(f"{RUN}-d")
    assert again.poll() == -signal.SIGKILL


def _marked_seen_from_another_process(marker: str) -> list[int]:
    code = (
        "from nvrx_eks.localrun.executor import marked_processes;"
        f"print([p.pid for p in marked_processes({marker!r})])"
    )
    return json.loads(run_python("-c", code, timeout=60, check=True).stdout)


def test_closing_the_run_ends_what_its_server_forked_and_the_server(tmp_path):
    starter = WarmStarter(preload=())
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with (tmp_path / "log").open("wb") as log:
        proc = starter.start(("module", "sleeper"), [], env=env, cwd=tmp_path, log=log, marker=f"{RUN}/pod-0")
    server = starter._server.pid
    starter.close()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(server)


def test_a_fork_given_a_file_for_its_standard_error_keeps_it_apart_and_a_missing_script_is_status_2(tmp_path):
    starter = WarmStarter(preload=())
    script = tmp_path / "both.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(4)\n")
    try:
        with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err, \
                (tmp_path / "missing").open("wb") as told:  # fmt: skip
            proc = starter.start(("script", str(script)), [], env=dict(os.environ), cwd=tmp_path, log=out,
                                 marker="", errors=err)  # fmt: skip
            missing = starter.start(("script", "gone.py"), [], env=dict(os.environ), cwd=tmp_path, log=told,
                                    marker="")  # fmt: skip
        assert (proc.wait(timeout=30), missing.wait(timeout=30)) == (4, 2)
    finally:
        starter.close()
    assert ((tmp_path / "out").read_text(), (tmp_path / "err").read_text()) == ("out\n", "err\n")
    said = (tmp_path / "missing").read_text()
    assert f"can't open file {str(tmp_path / 'gone.py')!r}: [Errno 2] No such file or directory" in said


def test_a_preload_that_starts_a_thread_is_refused(tmp_path, monkeypatch):
    """A fork copies one thread: a lock another thread held stays held in the fork forever."""
    (tmp_path / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="could not start"):
        WarmStarter(preload=("threaded",))
    assert time.monotonic() - started < 20


def test_a_run_uses_the_runtime_its_environment_names_and_processes_by_default(monkeypatch):
    monkeypatch.delenv(RUNTIME_ENV, raising=False)
    assert runtime_named(None).name == "processes"
    monkeypatch.setenv(RUNTIME_ENV, "warm")
    assert runtime_named(None).name == "warm"
    assert runtime_named("processes").name == "processes"
    monkeypatch.setenv(RUNTIME_ENV, "docker")
    with pytest.raises(Exception, match=f"{RUNTIME_ENV} 'docker': one of processes, warm, podman"):
        runtime_named(None)


def _declared_env(manifest: Path) -> set[str]:
    """Every environment variable a container of the rendered job declares."""
    names: set[str] = set()
    stack: list[object] = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names |= {e["name"] for e in node.get("env", []) if isinstance(node.get("env"), list)}
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def test_nothing_the_warm_server_imports_reads_what_a_pod_sets():
    """A fork keeps what its modules read at import from the server's environment: nothing the rendered
    job's containers or the executor set for a pod may be among it."""
    read = environ_read_at_import(PRELOAD, cwd=REPO)
    assert read, "the probe saw no reads at all: it does not watch the environment"
    per_pod = _declared_env(REPO / "tests" / "k8s" / "golden" / "local-cpu.yaml")
    assert {"NVRX_EKS_CONFIG", "OMP_NUM_THREADS", "GROUP_RANK"} <= per_pod  # the parse found them
    per_pod |= {"HOSTNAME", "TMPDIR", "JOB_COMPLETION_INDEX", POD_ENV, CHAOS_ENV}
    per_pod |= {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "PYTHONPATH"}
    # zoneinfo (imported by pydantic) asks sysconfig for its search path, and sysconfig works out the
    # user's site folder from HOME on the way: only pip's --user installs use it.
    assert not read & per_pod - {"HOME"}, sorted(read & per_pod)


_PID_PROBE = r"""
import json, os, re, sys
for name in sys.argv[1].split(","):
    __import__(name)
pid, found = os.getpid(), []
for module in [m for name, m in list(sys.modules.items()) if name not in {"__main__", "__mp_main__"}]:
    for key, value in list(getattr(module, "__dict__", {}).items()):
        if (isinstance(value, int) and not isinstance(value, bool) and value == pid) or (
            isinstance(value, str) and re.search(rf"(?<![0-9]){pid}(?![0-9])", value)
        ):
            found.append(f"{module.__name__}.{key}")
print(json.dumps(found))
"""


def _pid_kept_at_import(modules: tuple[str, ...], cwd: Path) -> list[str]:
    return import_probe(_PID_PROBE, modules, cwd=cwd)


def test_the_pid_probe_sees_nvrxs_launcher_naming_its_socket_after_the_importing_process():
    assert _pid_kept_at_import(("nvidia_resiliency_ext.fault_tolerance.launcher",), REPO)


def test_nothing_the_warm_server_imports_keeps_the_servers_process_id():
    assert _pid_kept_at_import(PRELOAD, REPO) == []
