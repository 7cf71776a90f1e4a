"""A failed pod's cause from its termination message (k8s/termination.py), on the launchers' own output."""

from __future__ import annotations

from nvrx_eks.k8s.termination import TAIL_BYTES, failure_cause, log_tail
from nvrx_eks.kitcore.profiles import get_profile
from nvrx_eks.training.node.selfcheck import Check, Status, render

# The lines NVRx 0.4.1's ft_launcher logs when it runs out of restarts (seen in this kit's local runs).
FAULTY = (
    "[INFO] [ft_launcher5800@vm] 0/2 restart attempts left. Exiting...\n"
    "[ERROR] [ft_launcher5800@vm] Some rank(s) exited with non-zero exit code: {3: ProcessFailure("
    "local_rank=1, pid=6791, exitcode=-9, error_file='<N/A>', error_file_data={'message': '<NONE>'}, "
    "message='Signal 9 (SIGKILL) received by PID 6791', timestamp=1796123242), 2: ProcessFailure("
    "local_rank=0, pid=6789, exitcode=143, error_file='<N/A>', error_file_data={'message': '<NONE>'}, "
    "message='To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html', "
    "timestamp=1796123242)}. Agent's exit code = 1\n"
)
STOPPED = (
    "[ERROR] [ft_launcher5798@vm] Some rank(s) exited with non-zero exit code: {0: ProcessFailure("
    "local_rank=0, pid=6790, exitcode=143, error_file='<N/A>', error_file_data={'message': '<NONE>'}, "
    "message='To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html', "
    "timestamp=1796123242)}. Agent's exit code = 1\n"
)
# torch elastic's ChildFailedError table (torchrun, and launchers that re-raise it).
TABLE = """
============================================================
training FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_11:07:22
  host      : vm
  rank      : 5 (local_rank: 1)
  exitcode  : -11 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 4242
============================================================
"""


def test_own_rank_killed_by_a_signal_outranks_ranks_the_launcher_stopped():
    faulty, stopped = failure_cause(FAULTY), failure_cause(STOPPED)
    assert faulty.text == "worker rank 3 exit code -9 (Signal 9 (SIGKILL))"
    assert stopped.text == "worker rank 0 exit code 143: stopped by its launcher after a peer failed"
    assert faulty.severity > stopped.severity


def test_torch_root_cause_table_and_known_errors():
    assert failure_cause(TABLE).text == "worker rank 5 exit code -11 (Signal 11 (SIGSEGV))"
    closed = failure_cause("raise RendezvousClosedError()\ntorch...RendezvousClosedError\n")
    assert closed.text == "the rendezvous was closed (RendezvousClosedError)"
    assert closed.severity == 0


def test_log_tail_keeps_what_the_kubelet_keeps():
    text = "".join(f"line {i}\n" for i in range(1000))
    tail = log_tail(text)
    assert tail.endswith("line 999")
    assert len(tail.encode()) <= TAIL_BYTES
    assert len(tail.splitlines()) <= 80


def test_a_lost_rendezvous_store_is_named():
    """NVRx 0.7's ft_launcher when the store pod is deleted (seen in this kit's local store_loss runs)."""
    message = (
        "W1202 10:44:04.507000 27734 torch/distributed/elastic/multiprocessing/api.py:871] Closing process "
        "27783 via signal SIGTERM\n"
        "2026-12-02 10:44:05,928 [ERROR] [vm] [workload:?(?) infra:?(?)] launcher.py:3750 Agent run ended "
        "with exception, e=DistNetworkError('Failed to recv, got 0 bytes. Connection was likely closed. Did "
        "the remote server shutdown or crash?'). Agent's exit code = 1\n"
    )
    cause = failure_cause(message)
    assert cause.text.startswith("the rendezvous store was lost")
    assert cause.severity == 0


def test_the_selfchecks_verdict_is_the_cause_whole(capsys, monkeypatch):
    """A failed self-check's log tail (its init container's termination message): the verdict line, one
    line however narrow the log, named whole, past the 200 characters kept of an unknown last line."""
    monkeypatch.setenv("COLUMNS", "80")
    detail = (
        "/fsx/durable/nvrx-local: Permission denied for uid 10001; make it writable by uid 10001, the "
        "trainer's user, or point checkpoint.durable_dir at another folder"
    )
    checks = [
        Check("mode", Status.OK, "CPU mode"),
        Check("checkpoint durable", Status.CONFIG, detail),
    ]
    render(checks, profile=get_profile("local-cpu"))
    cause = failure_cause(log_tail(capsys.readouterr().out))
    assert cause.text == f"self-check (configuration/image problem, exit 2): checkpoint durable: {detail}"


def test_a_launcher_that_stopped_on_bad_input_names_it_as_the_users_error():
    """The launcher's own check of the entry point, before any rank: its `error:` line is the cause."""
    message = (
        "=== container trainer: python -m nvrx_eks.training.resilience.launch --nnodes=2:2 -m mytrain.main\n"
        "error: entrypoint.module mytrain.main: no such module on the Python path (/workspace, ...); install "
        "your package into the image (images/README.md) or fix the module name\n"
    )
    cause = failure_cause(message)
    assert cause.text.startswith("entrypoint.module mytrain.main: no such module"), cause
    assert cause.user_error
    assert not failure_cause(FAULTY).user_error


def test_a_ranks_own_reason_is_the_cause_and_torchs_generic_line_is_not():
    said = (
        "worker failures: {1: ProcessFailure(local_rank=1, pid=7, exitcode=1, message='ValueError: shapes "
        "do not match (train.py:40 in train)')}\n"
    )
    assert failure_cause(said).text == (
        "worker rank 1 exit code 1: ValueError: shapes do not match (train.py:40 in train)"
    )
    silent = said.replace(
        "ValueError: shapes do not match (train.py:40 in train)", "To enable traceback see: x"
    )
    assert failure_cause(silent).text == "worker rank 1 exit code 1"


def test_a_bug_the_launcher_stopped_the_job_for_is_the_users_error():
    line = (
        "NVRx decided the job must not be restarted (user_error): local rank 1 exited 2: the training "
        "script failed the same way twice on rank 3 at step 12: ValueError: x (train.py:4 in train); a "
        "bug, not a fault: nothing is retried. Agent's exit code = 93\n"
    )
    cause = failure_cause(line)
    assert cause.text.startswith("local rank 1: the training script failed the same way twice on rank 3")
    assert cause.user_error
