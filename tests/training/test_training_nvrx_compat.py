"""training/resilience/nvrx_compat.py: the installed NVRx's internals still have the shape the kit
patches or reads, and docs/nvrx-seam.md lists every patch with the process that applies it.

Each test fails when an NVRx release changes what the kit relies on, before a job meets it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from children import run_python, start_python

from nvrx_eks.kitcore.pins import NVRX_SUPPORTED_SINCE
from nvrx_eks.training.resilience import launcher_liveness, nvrx_compat


def test_every_internal_the_kit_uses_has_the_expected_shape():
    nvrx_compat.check_internals()


ROOT = Path(__file__).resolve().parents[2]
SEAM_DOC = ROOT / "docs" / "nvrx-seam.md"
PROCESS_MODULES = {
    "control": "training/resilience/control.py",
    "launcher": "training/resilience/launch.py",
    "rank": "training/resilience/layers.py",
}
"""The processes the seam table names, each by the module that applies its patches."""


def _seam_tables() -> dict[str, dict[str, list[str]]]:
    """docs/nvrx-seam.md's tables by their first column's header: {the function a row names: its cells}."""
    tables: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] | None = None
    for line in SEAM_DOC.read_text().splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if rows is None:
            rows = tables.setdefault(cells[0], {})
        elif not set(cells[0]) <= set("-: "):
            rows[cells[0].strip("`")] = cells
    return tables


def _module_functions() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(nvrx_compat, inspect.isfunction)
        if member.__module__ == nvrx_compat.__name__ and not name.startswith("_")
    }


def test_every_patch_has_a_row_in_the_seam_table_and_every_row_names_a_function():
    tables = _seam_tables()
    patches, others = set(tables["patch"]), set(tables["guard or read"])
    functions = _module_functions()
    without_row = sorted(functions - patches - others)
    assert not without_row, f"nvrx_compat.py functions without a row in docs/nvrx-seam.md: {without_row}"
    unknown = sorted((patches | others) - functions)
    assert not unknown, f"docs/nvrx-seam.md rows naming no function of nvrx_compat.py: {unknown}"
    assert not patches & others


def test_the_seam_table_names_the_processes_that_apply_each_patch():
    sources = {process: (ROOT / module).read_text() for process, module in PROCESS_MODULES.items()}
    for patch, cells in _seam_tables()["patch"].items():
        named = {process.strip() for process in cells[1].split(",")}
        applied = {process for process, source in sources.items() if re.search(rf"\b{patch}\b", source)}
        assert named == applied, patch


def test_a_changed_internal_is_a_clear_error_not_a_silent_no_op():
    class Changed:
        def _set_calculated_timeouts(self, timeouts):  # one parameter where NVRx has two
            pass

    with pytest.raises(RuntimeError, match="is not the expected _set_calculated_timeouts"):
        nvrx_compat.require_internal(Changed, *nvrx_compat.SET_TIMEOUTS)
    with pytest.raises(RuntimeError, match=r"check training/resilience/nvrx_compat\.py"):
        nvrx_compat.require_internal(Changed, "gone", ())


def test_an_nvrx_older_than_the_supported_minor_is_refused_with_one_message():
    with pytest.raises(SystemExit, match=f"the kit needs {NVRX_SUPPORTED_SINCE} or newer"):
        nvrx_compat.check_supported_nvrx("0.6.0")
    nvrx_compat.check_supported_nvrx(NVRX_SUPPORTED_SINCE)


_CLEANUP = """
import os, sys
from nvidia_resiliency_ext.fault_tolerance import launcher
if sys.argv[1] == "kept":
    from nvrx_eks.training.resilience.nvrx_compat import keep_launcher_process_group
    keep_launcher_process_group()
from nvidia_resiliency_ext.fault_tolerance import utils
slept = []
utils.time.sleep = slept.append  # its grace between SIGTERM and SIGKILL
# A forkserver worker is in the launcher's process group: ft_launcher passes that group to its cleanup.
launcher.terminate_mp_processes(allowed_pgids={os.getpgrp()})
print(f"launcher alive, grace slept: {slept}", flush=True)
"""


@pytest.mark.parametrize("variant", ["nvrx", "kept"])
def test_the_orphan_cleanup_spares_the_launchers_own_process_group(variant):
    """NVRx's cleanup kills the process group of each worker; for workers forked from the forkserver
    that is the launcher's own. Unpatched, the launcher dies (SIGTERM); patched, it lives, and with no
    other group to clean it does not wait the cleanup's grace."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CLEANUP), variant],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # its own process group, as the launcher is in its pod
        check=False,
    )
    if variant == "nvrx":
        assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
        assert "launcher alive" not in done.stdout
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        # Nothing else to clean: no 1 s grace added to the restart's teardown.
        assert "launcher alive, grace slept: []" in done.stdout


def _rank_three_nodes(previous_active: set[int], *, mended: bool) -> set[int]:
    """Which infra ranks NVRx's barrier rendezvous makes active among nodes 0, 1, 2 (world of 2)."""
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415

    state = object.__new__(barrier._RendezvousBarrierState)
    state.segment = None
    setattr(state, nvrx_compat.PREVIOUS_ACTIVES, dict.fromkeys(previous_active))
    nodes = {rank: barrier._NodeDesc(addr=f"node-{rank}", pid=rank, local_id=0) for rank in (0, 1, 2)}
    participants = [(nodes[rank], rank, "none", None) for rank in (0, 1, 2)]
    original = barrier._RendezvousBarrierState._sort_rankable_participants
    try:
        if mended:
            nvrx_compat.keep_previous_actives_first()
        ranks = state._assign_group_ranks(participants, 2)
    finally:
        barrier._RendezvousBarrierState._sort_rankable_participants = original
    return {infra for infra, node in nodes.items() if ranks[node] < 2}


def test_a_restart_round_keeps_its_previous_active_nodes_before_a_spare():
    """Nodes 1 and 2 trained; node 0 is the spare (it joined the first round last). NVRx ranks by infra
    rank alone, so the spare displaced node 2 at the next restart round; mended, nodes 1 and 2 stay."""
    assert _rank_three_nodes({1, 2}, mended=False) == {0, 1}
    assert _rank_three_nodes({1, 2}, mended=True) == {1, 2}
    # A lost node's place: the spare fills it; the first round (no previous actives): NVRx's own order.
    assert _rank_three_nodes({2}, mended=True) == {0, 2}
    assert _rank_three_nodes(set(), mended=True) == {0, 1}


def _round_closes_without_node_1(beat_age: float | None, *, mended: bool) -> bool:
    """Whether a restart round (previous actives: infra ranks 0 and 1; present: 0 and the spare 2) closes
    at once, with node 1's launcher's last beat `beat_age` seconds ago (None: it never beat)."""
    from datetime import timedelta  # noqa: PLC0415

    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415
    from torch.distributed import TCPStore  # noqa: PLC0415

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    original = barrier._RendezvousBarrierState._make_previous_active_last_call_gate
    try:
        if mended:
            nvrx_compat.wait_only_for_live_previous_actives(launcher_liveness.gone_launcher_age)
        state = barrier._RendezvousBarrierState(store=store, run_id="job", last_call_timeout_seconds=5.0)
        state._round = 1
        setattr(state, nvrx_compat.PREVIOUS_ACTIVES, {0: None, 1: None})
        if beat_age is not None:
            store.set(launcher_liveness.launcher_beat_key(state.prefix, 1), repr(time.time() - beat_age))
        gate = state._make_previous_active_last_call_gate(2, 3)
        nodes = {rank: barrier._NodeDesc(addr=f"node-{rank}", pid=rank, local_id=0) for rank in (0, 2)}
        participants = [(nodes[rank], rank, "none", None) for rank in (0, 2)]
        return gate.evaluate(participants, time.monotonic()).should_close
    finally:
        barrier._RendezvousBarrierState._make_previous_active_last_call_gate = original


def test_a_restart_round_does_not_wait_for_a_node_whose_launcher_stopped_beating():
    """A node lost with its launcher: NVRx holds the round its last call (5 s here) before the spare may
    take the place; mended, a beat older than LAUNCHER_GONE_S closes it at once. A launcher that beats
    (restarting its workers) or never beat (an older launcher) is still waited for."""
    gone = launcher_liveness.LAUNCHER_GONE_S + 1.0
    assert _round_closes_without_node_1(gone, mended=False) is False
    assert _round_closes_without_node_1(gone, mended=True) is True
    assert _round_closes_without_node_1(0.1, mended=True) is False
    assert _round_closes_without_node_1(None, mended=True) is False


def _restart_checks(wrapper) -> set[str]:
    checks = wrapper.restart_health_check
    return {type(c).__name__ for c in getattr(checks, "instances", [])} if checks else set()


def test_without_gpus_the_wrapper_keeps_only_the_kits_health_checks(monkeypatch):
    """NVRx chains NVML GPU/NVLink/NIC checks to every in-process restart when LOCAL_RANK is set; on a
    node without GPUs the GPU check fails and every soft fault became a launcher restart."""
    from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

    monkeypatch.setenv("LOCAL_RANK", "1")
    own = inprocess.health_check.FaultCounter(max_rank_faults=3)
    assert "ChainedGPUHealthCheck" in _restart_checks(inprocess.Wrapper(health_check=inprocess.Compose(own)))
    wrapper = nvrx_compat.inprocess_wrapper(gpu=False, health_check=inprocess.Compose(own))
    assert _restart_checks(wrapper) == {"FaultCounter"}
    assert os.environ["LOCAL_RANK"] == "1"  # the worker's own variable is back


def test_a_replacement_opens_the_next_round_when_its_predecessor_trained_in_the_last(barrier_store):
    """Every active node lost at once: no launcher is left to open round 1, so the replacement of an
    active index does; a spare's index, or a round already open, changes nothing."""
    store, prefix = barrier_store
    assert (
        nvrx_compat.open_round_for_lost_predecessor(store, run_id="job", infra_rank=2, active_nodes=2) is None
    )
    assert not store.check([f"{prefix}:round_done_1"])
    assert nvrx_compat.open_round_for_lost_predecessor(store, run_id="job", infra_rank=1, active_nodes=2) == 1
    assert store.get(f"{prefix}:round_done_1") == b"0"
    assert (
        nvrx_compat.open_round_for_lost_predecessor(store, run_id="job", infra_rank=0, active_nodes=2) is None
    )


def _run_script(tmp_path: Path, source: str, variant: str) -> subprocess.CompletedProcess[str]:
    """Run a launcher-side script (`variant`: torch's behaviour or the kit's patch) in a process of its
    own: the patches are process-wide. Its workers' logs go under `tmp_path`."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return run_python(
        str(script), variant, str(tmp_path / "logs"), timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )


_FAILED_WORKERS = """
import os, signal, sys, time
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes


def worker(local_rank):
    if local_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the fault
    time.sleep(0.5)
    sys.exit(1)  # its node-mate's collective fails after it


if __name__ == "__main__":
    if sys.argv[1] == "every":
        from nvrx_eks.training.resilience.nvrx_compat import report_every_failed_worker
        report_every_failed_worker()
    context = start_processes(
        name="trainer", entrypoint=worker, args={0: (0,), 1: (1,)}, envs={0: {}, 1: {}},
        logs_specs=DefaultLogsSpecs(log_dir=sys.argv[2]), start_method="fork",
    )
    time.sleep(2.0)  # both workers are dead before the launcher's next poll
    result = context.wait(0)
    print(sorted((rank, f.exitcode) for rank, f in result.failures.items()), flush=True)
"""


@pytest.mark.parametrize(("variant", "reported"), [("torch", "[(0, 1)]"), ("every", "[(0, 1), (1, -9)]")])
def test_a_poll_after_a_sigkill_and_its_collateral_exit_reports_both_workers(tmp_path, variant, reported):
    """torch reports the first dead worker in local-rank order only, which hid the SIGKILLed rank behind
    its node-mate's collective error; with the patch both are reported."""
    done = _run_script(tmp_path, _FAILED_WORKERS, variant)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == reported, done.stdout


_UNRESPONSIVE_PEER = """
import sys
from datetime import timedelta
from types import SimpleNamespace
from nvidia_resiliency_ext.inprocess.sibling_monitor import SiblingMonitor
from nvidia_resiliency_ext.inprocess.store import FileStore, PrefixStore
if sys.argv[1] == "ints":
    from nvrx_eks.training.resilience.nvrx_compat import initial_ranks_as_ints
    initial_ranks_as_ints()
base_store = FileStore(sys.argv[2] + "-store", 2)  # the Wrapper's store of a 2-rank job
store = PrefixStore(0, base_store)  # its first in-process iteration
for rank in (0, 1):
    store.set_initial_rank(rank, rank)
# Rank 0's sibling monitor finds rank 1 silent for the heartbeat timeout (rank 1 finished and left).
monitor = SimpleNamespace(store=store, world_size=2, initial_world_size=2)
try:
    SiblingMonitor.terminate_unresponsive_ranks(monitor, [1])
except ValueError as error:
    print(f"monitor: ValueError: {error}", flush=True)
# Rank 0's training returns: CallWrapper.shutdown's termination barrier, as a non-critical rank.
try:
    base_store.termination_barrier(ranks=[0], rendezvous_count=2, timeout=timedelta(0))
    print("shutdown: left the barrier", flush=True)
except ValueError as error:
    print(f"shutdown: ValueError: {error}", flush=True)
"""


_POISONED = "ValueError: invalid literal for int() with base 10: \"b'1'\""


@pytest.mark.parametrize(
    ("variant", "seen"),
    [
        ("nvrx", [f"monitor: {_POISONED}", f"shutdown: {_POISONED}"]),
        ("ints", ["shutdown: left the barrier"]),
    ],
)
def test_a_peer_found_unresponsive_does_not_poison_the_termination_barrier(tmp_path, variant, seen):
    """NVRx's sibling monitor enters the termination barrier for an unresponsive peer with the peer's
    initial ranks as torch's raw bytes: the monitor itself, and every later termination barrier, failed
    to parse them, and a rank that had finished training exited non-zero."""
    done = _run_script(tmp_path, _UNRESPONSIVE_PEER, variant)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == seen, done.stdout


_FIRST_FAILURE_LOGGED = """
import os, signal, sys, time
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes


def worker(local_rank):
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1] == "plain":
        from nvrx_eks.training.resilience.nvrx_compat import format_tracebacks_without_dynamo
        format_tracebacks_without_dynamo()
    context = start_processes(
        name="trainer", entrypoint=worker, args={0: (0,)}, envs={0: {}},
        logs_specs=DefaultLogsSpecs(log_dir=sys.argv[2]), start_method="fork",
    )
    time.sleep(1.0)
    assert context.wait(0).failures  # the poll logs the failure with its traceback
    print("torch._dynamo" in sys.modules, flush=True)
"""


@pytest.mark.parametrize(("variant", "imported"), [("torch", "True"), ("plain", "False")])
def test_the_launchers_first_failure_log_does_not_import_the_compiler(tmp_path, variant, imported):
    """torch's formatter imports torch._dynamo (seconds of CPU) to log the launcher's first failed worker;
    with the patch the same traceback is logged and nothing is imported."""
    assert nvrx_compat.formatter_imports_dynamo(), "torch's formatter no longer imports it: drop the patch"
    done = _run_script(tmp_path, _FIRST_FAILURE_LOGGED, variant)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == imported
    assert "ProcessExitedException: process 0 terminated with signal SIGKILL" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr


_ROUND_OPENED_WHILE_WAITING = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier

if sys.argv[1] == "mended":
    from nvrx_eks.training.resilience.nvrx_compat import poll_rendezvous_faster
    poll_rendezvous_faster()
slept = []
clock = [0.0]  # a virtual clock, exact in binary at 0: each sleep advances it without waiting
time.sleep = lambda seconds: (slept.append(seconds), clock.__setitem__(0, clock[0] + seconds))
time.monotonic = lambda: clock[0]
store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
state = barrier._RendezvousBarrierState(store, "run", join_timeout_seconds=10)
# A node still at round 0, which closed when training started; a failure has opened round 1.
store.set(f"{state.prefix}:round_done_0", b"1")
store.set(f"{state.prefix}:round_done_1", b"0")
state._last_stale_check_time = time.monotonic()  # it has been waiting a while: its last look was now
node = barrier._NodeDesc(addr="node-0", pid=0, local_id=0)
state._wait_for_rendezvous_open(node)
print(state._round, slept, state._compute_step2_poll_interval(2, 5.0),
      state._compute_step2_poll_interval(8000, 5.0), flush=True)
"""


@pytest.mark.parametrize(
    ("variant", "polls"),
    [
        # NVRx: 1 s polls, and it looks for a newer round only every 10 s; its close check once a second.
        ("nvrx", "1 [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] 1.0 4.0"),
        # Mended: it looks at every 0.1 s poll and is in the open round 0.2 s later; large jobs keep
        # NVRx's close interval.
        ("mended", "1 [0.1, 0.1] 0.1 4.0"),
    ],
)
def test_a_node_waiting_for_a_round_finds_the_opened_one_at_the_next_fast_poll(tmp_path, variant, polls):
    script = tmp_path / "round_opened.py"
    script.write_text(textwrap.dedent(_ROUND_OPENED_WHILE_WAITING))
    done = run_python(str(script), variant, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == polls, done.stdout


def test_a_monitor_thread_that_dies_of_its_store_calls_back_and_one_stopped_on_purpose_does_not(monkeypatch):
    import threading  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from nvidia_resiliency_ext.inprocess.monitor_thread import MonitorThread  # noqa: PLC0415

    class StoreGone(MonitorThread):
        # NVRx's own loop, minus its constructor's collaborators: the store's wait raises what a
        # TCPStore client raises once its server's process is gone.
        def __init__(self, *, stopped: bool) -> None:
            threading.Thread.__init__(self, daemon=True)
            self.stop_loop = threading.Event()
            if stopped:
                self.stop_loop.set()

        def run(self) -> None:
            raise torch.distributed.DistNetworkError("Failed to recv, got 0 bytes.")

    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    calls: list[BaseException | None] = []
    nvrx_compat.on_monitor_thread_death(calls.append)
    for stopped in (True, False):
        thread = StoreGone(stopped=stopped)
        thread.start()
        thread.join()
    (exc,) = calls
    assert isinstance(exc, torch.distributed.DistNetworkError)
    # NVRx's loop survives only DistStoreError, which DistNetworkError is not: the reason for the hook.
    assert not issubclass(torch.distributed.DistNetworkError, torch.distributed.DistStoreError)


_FORKED_CONNECTION = r"""
import multiprocessing, socket, sys, time
from types import SimpleNamespace
from nvrx_eks.training.resilience import nvrx_compat

ours, launchers = socket.socketpair()
client = SimpleNamespace(rank_monitor_socket=ours)
if sys.argv[1] == "mended":
    nvrx_compat.close_rank_monitor_socket_in_forks(client)
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(5,))  # a monitor process
child.start()
ours.close()  # the rank ends
launchers.settimeout(2)
try:
    print("closed" if launchers.recv(1) == b"" else "data")
except TimeoutError:
    print("still open")
child.kill()
"""


@pytest.mark.parametrize(("variant", "seen"), [("nvrx", "still open"), ("mended", "closed")])
def test_a_ranks_launcher_connection_closes_with_the_rank_not_with_its_forked_children(variant, seen):
    """The in-process monitor process, forked from the rank, kept the rank's connection to its launcher
    open after the rank ended; the launcher's next worker waited for it."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_CONNECTION, variant],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.stdout.strip().splitlines()[-1] == seen


def test_the_rank_monitor_client_still_keeps_its_connection_where_the_kit_closes_it_in_forks():
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: PLC0415

    client = RankMonitorClient()  # not connected yet
    assert getattr(client, nvrx_compat.RANK_MONITOR_SOCKET, "missing") is None


HOST = "127.0.0.1"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_restart_decided_after_every_rank_finished_training_is_declined(tmp_path, reserve_port):
    """Two ranks under NVRx's real Wrapper pass the kit's last barrier; then rank 1 is recorded
    unresponsive while still in its call, as when a rank that finished first left the Wrapper and its
    monitor fell silent. NVRx restarted both ranks there: at the end of a real job the ranks that left
    are gone for good, and the restarted ones waited for them until the launcher's rendezvous timeout.
    The kit declines the restart: each rank's call returns once, and the events say why."""
    script = ROOT / "tests" / "training" / "scripts" / "silent_after_the_last_barrier.py"
    port = reserve_port()
    env = os.environ | {"PYTHONPATH": str(ROOT), "MASTER_ADDR": HOST, "WORLD_SIZE": "2"}
    ranks = [
        start_python(str(script), str(tmp_path), str(port), env=env | {"RANK": str(rank)}) for rank in (0, 1)
    ]
    try:
        outputs = [rank.communicate(timeout=100) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (out, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["iterations"] == [0], out + err[-3000:]
    declined = [
        event
        for path in sorted((tmp_path / "events").glob("rank-*.jsonl"))
        for event in map(json.loads, path.read_text().splitlines())
        if event["kind"] == "restart_declined"
    ]
    assert {event["rank"] for event in declined} == {0, 1}, declined
