"""Why a training pod failed, in one line, from its termination message.

The trainer container sets `terminationMessagePolicy: FallbackToLogsOnError`, so a failed pod's
status carries the tail of its log (the kubelet keeps the last 80 lines, at most 2,048 bytes:
https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/).
That tail holds what the launcher printed on the way out: for a launcher out of restarts, its failed
ranks (torch elastic's ChildFailedError table, raised by ft_launcher, has a "Root Cause (first observed
failure)" entry; some launcher versions log "Some rank(s) exited with non-zero exit code: {rank:
ProcessFailure(...)}" instead); for a launcher turned away by a closed rendezvous, RendezvousClosedError.
A rank that exited 143 (SIGTERM) was stopped by its own launcher because a peer failed: that pod is not
where the fault was, and the cause says so (when all its ranks were, its launcher exits
training/resilience/launch.py `COLLATERAL_EXIT_CODE`, which the Job does not charge). A launcher that lost its
connection to the rendezvous store (its pod restarted) names that. A rank that failed says why in one
line (kitcore/supervisor.py), which the cause carries; a launcher that stopped on bad input before any
rank started (an entry point that does not exist) has its `error: ...` line as the cause. The local executor
(localrun/executor.py) keeps the same tail of each failed pod, so a job that finally fails names the
index and this cause in both places.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvrx_eks.kitcore.supervisor import TORCH_NO_REASON
from nvrx_eks.training.node.selfcheck import CANNOT_TRAIN
from nvrx_eks.training.resilience.launch import STOPPED_EXIT_CODES

TAIL_LINES = 80
TAIL_BYTES = 2048
"""The kubelet's limits for a termination message taken from the log."""

_ROOT = re.compile(r"Root Cause \(first observed failure\):\s*\n(?P<body>(?:.*\n?){1,8})")
_FIELD = re.compile(r"^\s*(?P<key>rank|exitcode|traceback)\s*:\s*(?P<value>.*?)\s*$", re.MULTILINE)
# Some launcher versions log their failed ranks as one line of torch's ProcessFailure reprs.
_PROCESS_FAILURE = re.compile(
    r"(?P<rank>\d+): ProcessFailure\(local_rank=\d+, pid=\d+, exitcode=(?P<exitcode>-?\d+),"
    r".*?message='(?P<message>[^']*)'"
)
# A rank its own launcher stopped (SIGTERM while stopping the worker group) failed because of another.
_STOPPED = {str(code) for code in STOPPED_EXIT_CODES}
# A rank's bad input or bug ended the job without a restart (training/resilience/nvrx_compat.py
# `stop_on_user_error`): the launcher's last line names the rank and its error.
_USER_ERROR = re.compile(
    r"must not be restarted \(user_error\): local rank (?P<rank>\d+) exited \d+: (?P<message>.*?)"
    r"(?:\. Agent's exit code = \d+)?$",
    re.MULTILINE,
)
# A process of the kit's that stopped on bad input (kitcore/configio.py `exit_on_user_error`): the launcher
# itself when the job's entry point cannot run (training/resilience/launch.py `check_entry`), before any rank.
_KIT_ERROR = re.compile(r"^error: (?P<message>.+)$", re.MULTILINE)
# The self-check init container's verdict line (training/node/selfcheck.py `render`): the failed checks,
# each with its fix, whole (a verdict may well exceed the 200 characters kept of an unknown last line).
_SELFCHECK = re.compile(rf"^{CANNOT_TRAIN} \((?P<kind>[^)]*)\): (?P<reasons>.+)$", re.MULTILINE)
_KNOWN = (
    ("RendezvousClosedError", "the rendezvous was closed (RendezvousClosedError)"),
    ("RendezvousTimeoutError", "the rendezvous timed out (RendezvousTimeoutError)"),
    # ft_launcher's one TCPStore connection is the rendezvous store's (the store Deployment, is_host=0);
    # torch's client raises DistNetworkError when the store's process goes away under it, and NVRx 0.7
    # does not reconnect, so a lost store pod ends every launcher with it.
    (
        "DistNetworkError",
        "the rendezvous store was lost: the launcher's connection to it failed (DistNetworkError)",
    ),
)


@dataclass(frozen=True)
class Cause:
    text: str
    severity: int
    """How likely this pod is where the fault was: 2 a rank died of a signal (SIGKILL, SIGSEGV...:
    nothing in the job sends those to a healthy rank), 1 a rank exited with an error (which may be a
    consequence: a collective fails when a peer dies), 0 its ranks were stopped by its own launcher
    (SIGTERM) or the launcher failed without a rank failure (e.g. a closed rendezvous)."""
    user_error: bool = False
    """The job's input or the user's script is wrong (exit 2): the same at every restart, the user's fix."""


def log_tail(text: str) -> str:
    """What the kubelet would keep of a log as the termination message."""
    tail = "\n".join(text.splitlines()[-TAIL_LINES:])
    return tail.encode()[-TAIL_BYTES:].decode(errors="replace")


def _rank_failure(rank: str, exitcode: str, message: str) -> Cause:
    text = f"worker rank {rank} exit code {exitcode}"
    if exitcode in _STOPPED:
        return Cause(text=f"{text}: stopped by its launcher after a peer failed", severity=0)
    if message.startswith("Signal"):
        text += f" ({message.split(' received', maxsplit=1)[0]})"
    elif message and not message.startswith(TORCH_NO_REASON):
        text += f": {message}"  # what the rank said of its failure (kitcore/supervisor.py)
    return Cause(text=text, severity=2 if exitcode.startswith("-") else 1)


def failure_cause(message: str) -> Cause:
    """The pod's cause in one line: the ranks' failures (own ones first), a known error, or the last line."""
    user_error = _USER_ERROR.search(message)
    if user_error:
        text = f"local rank {user_error['rank']}: {user_error['message'].strip()}"
        return Cause(text=text, severity=2, user_error=True)
    verdict = _SELFCHECK.search(message)
    if verdict:
        return Cause(text=f"self-check ({verdict['kind']}): {verdict['reasons'].strip()}", severity=1)
    failures = [
        _rank_failure(m["rank"], m["exitcode"], m["message"]) for m in _PROCESS_FAILURE.finditer(message)
    ]
    root = _ROOT.search(message)
    if root:
        fields = {m["key"]: m["value"] for m in _FIELD.finditer(root["body"])}
        if "rank" in fields and "exitcode" in fields:
            code = fields["exitcode"].split()[0]
            failures.append(_rank_failure(fields["rank"].split()[0], code, fields.get("traceback", "")))
    if failures:
        worst = max(f.severity for f in failures)
        # The launcher's own line and the wrapper's summary name the same ranks: each once.
        texts = dict.fromkeys(f.text for f in failures if f.severity == worst)
        return Cause(text="; ".join(texts), severity=worst)
    for needle, text in _KNOWN:
        if needle in message:
            return Cause(text=text, severity=0)
    kit_errors = _KIT_ERROR.findall(message)
    if kit_errors:
        return Cause(text=kit_errors[-1].strip(), severity=2, user_error=True)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return Cause(text=lines[-1][:200] if lines else "no termination message", severity=1)
