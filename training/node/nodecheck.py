"""`python -m nvrx_eks.training.node.nodecheck`: is this GPU node fit to train? The node-check
DaemonSet's loop.

The cluster chart (k8s/cluster_chart.py) runs this on every GPU node, at start and every
`--interval-s`. Each round checks the node, then records the verdict on the Node object:

- pass: label `nvrx-eks/verified=true` with `nvrx-eks/verified-at=<UTC time>`, the taint
  `nvrx-eks/unverified` removed;
- fail: label `nvrx-eks/verified=false` (no time), taint `nvrx-eks/unverified=<reason>:NoSchedule`;
- either way: the node condition `NvrxEksVerified` (True/False, a reason, the failed checks as its
  message), the checks as JSON in the annotation `nvrx-eks/verification`, and an Event when the
  verdict changes (`kubectl describe node` shows both).

Training pods require `nvrx-eks/verified=true` (the job chart's `require_verified_nodes`), so a new
node takes work only once it passed, and a node that fails a later round takes no new pods.

Checks (each one a `selfcheck.Check`; a missing tool is a clear SKIP/WARN, a tool that hangs is a
failure with the time it was given, and nothing here raises out of the loop):

- GPUs: `nvidia-smi` sees the profile's GPU count (instance profile table, keyed by the node's
  instance-type label), none with uncorrected volatile ECC errors; without nvidia-smi, the device files;
- DCGM diagnostics level 1 (`dcgmi diag -r 1`) where dcgmi and a host engine are present;
- NVLink: every link of every GPU active (`nvidia-smi nvlink --status`), on multi-GPU profiles;
- EFA devices against the profile (the self-check's sysfs/uverbs probe);
- what the self-check refuses whatever the node's health, with the training pods' own limits and
  image (the check runs in the training image, as the trainer's user, without a capability): the
  memlock limit EFA needs, and the NCCL net plugin (aws-ofi-nccl) loading as NCCL loads it. A node
  that fails them takes no training pod, and its condition names the fix before any job is submitted;
- the node-local NVMe RAID0: writable and as large as the profile's instance store (a failed array
  leaves the directory on the root volume, far smaller);
- the EKS node monitoring agent's conditions (AcceleratedHardwareReady, ...): none False.

The Kubernetes calls are four fixed REST requests made with the standard library (kubeapi.py
`InClusterApi`): the training image has no Kubernetes client, and its locked requirements are built
inside the base image. Tests replace the API, the commands and the paths with fakes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nvrx_eks.kitcore.configio import UserError, exit_with
from nvrx_eks.kitcore.lines import say
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile
from nvrx_eks.training.checkpoint.probe import free_space, probe_folder
from nvrx_eks.training.node import selfcheck
from nvrx_eks.training.node.kubeapi import ApiError, InClusterApi
from nvrx_eks.training.node.selfcheck import Check, Status

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("nodecheck")

# The contract with the charts (k8s/cluster_chart.py, k8s/job_chart.py import these).
VERIFIED_LABEL = "nvrx-eks/verified"
VERIFIED_AT_LABEL = "nvrx-eks/verified-at"
UNVERIFIED_TAINT = "nvrx-eks/unverified"
REPORT_ANNOTATION = "nvrx-eks/verification"
CONDITION_TYPE = "NvrxEksVerified"
COMPONENT = "nvrx-nodecheck"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

# Conditions the EKS node monitoring agent sets on a node; any of them False means the agent saw a
# fault (auto-repair acts on them after minutes; we stop new work at once).
# https://docs.aws.amazon.com/eks/latest/userguide/node-health.html
AGENT_CONDITIONS = (
    "AcceleratedHardwareReady",
    "ContainerRuntimeReady",
    "KernelReady",
    "NetworkingReady",
    "StorageReady",
)
NVME_MIN_FRACTION = 0.9
"""The array may be smaller than the sum of its disks by filesystem overhead, never by a disk."""
DEFAULT_INTERVAL_S = 600.0
RETRY_S = 30.0
CONFLICT = 409
"""HTTP status of a patch whose resourceVersion is stale."""
PATCH_ATTEMPTS = 3
"""After a failed API call: try again this soon, without exiting (no crash loop)."""

# Condition reasons, one per check (CamelCase, as Kubernetes reasons are).
REASONS = {
    "profile": "UnknownInstanceType",
    "GPUs": "GPUCheckFailed",
    "DCGM diag": "DCGMDiagFailed",
    "NVLink": "NVLinkDown",
    "EFA devices": "EFADevicesMissing",
    "memlock limit": "MemlockLimitTooLow",
    "NCCL net plugin": "NcclNetPluginUnusable",
    "local NVMe": "LocalNVMeUnusable",
    "node conditions": "NodeConditionFalse",
}
PASSED_REASON = "ChecksPassed"


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandTimeoutError(Exception):
    """The tool did not finish in its time (a hung driver call looks like this)."""


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult | None:
    """Run a tool; None when it is not installed. Raises CommandTimeoutError past `timeout_s`."""
    tool = shutil.which(argv[0])
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandTimeoutError(f"{argv[0]} timed out after {timeout_s:g} s") from exc
    return CommandResult(done.returncode, done.stdout, done.stderr)


@dataclass(kw_only=True)
class Host:
    """What the checks look at; every path and the command runner can be replaced (tests)."""

    gpu_dev_root: Path = Path("/dev")
    """Where the NVIDIA runtime puts /dev/nvidiaN (NVIDIA_VISIBLE_DEVICES=all)."""
    sys_root: Path = Path("/host/sys")
    efa_dev_root: Path = Path("/host/dev")
    """Holds infiniband/uverbsN: the host's /dev/infiniband, mounted read-only."""
    nvme_path: Path | None = Path("/host/local-nvme")
    """A directory on the node-local NVMe array (a subdirectory: its root holds kubelet state)."""
    run: Callable[[Sequence[str], float], CommandResult | None] = run_command
    statvfs: Callable[[Path], os.statvfs_result] = os.statvfs
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """The check's own environment: the training image's (LD_LIBRARY_PATH, NCCL_NET_PLUGIN)."""
    memlock: Callable[[], int] = field(default=lambda: resource.getrlimit(resource.RLIMIT_MEMLOCK)[0])
    """This container's soft RLIMIT_MEMLOCK: the node's container runtime gives every pod the same."""
    load_library: Callable[[Path], str | None] = selfcheck.load_problem
    dcgm_host: str | None = None
    """nv-hostengine address for dcgmi (default: dcgmi's own, localhost)."""
    timeout_s: float = 60.0
    dcgm_timeout_s: float = 300.0


def _tool(host: Host, name: str, argv: Sequence[str], timeout_s: float) -> CommandResult | Check | None:
    """The result, None when the tool is missing, or a failed Check when it timed out."""
    try:
        return host.run(argv, timeout_s)
    except CommandTimeoutError as exc:
        return Check(name, Status.NODE, f"{exc}: the driver or device is not answering")


_ECC_COLUMN = 2
"""index, pci.bus_id, ecc.errors.uncorrected.volatile.total: the third column of the query."""


def check_gpus(host: Host, profile: InstanceProfile) -> Check:  # noqa: PLR0911 - one return per verdict
    name = "GPUs"
    query = ["nvidia-smi", "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total"]
    done = _tool(host, name, [*query, "--format=csv,noheader,nounits"], host.timeout_s)
    if isinstance(done, Check):
        return done
    files = [p for p in host.gpu_dev_root.glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    if done is None:
        if len(files) < profile.gpus:
            return Check(
                name, Status.NODE, f"{len(files)} of {profile.gpus} /dev/nvidiaN (nvidia-smi absent)"
            )
        return Check(name, Status.WARN, f"nvidia-smi not found; {len(files)} device files, health unknown")
    if done.returncode:
        return Check(name, Status.NODE, f"nvidia-smi failed (exit {done.returncode}): {_tail(done)}")
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if len(rows) < profile.gpus:
        return Check(name, Status.NODE, f"nvidia-smi sees {len(rows)} of {profile.gpus} GPUs")
    bad = [
        f"GPU {r[0]} ({r[1]}): {r[_ECC_COLUMN]} uncorrected ECC"
        for r in rows
        if len(r) > _ECC_COLUMN and r[_ECC_COLUMN].isdigit() and int(r[_ECC_COLUMN])
    ]
    if bad:
        return Check(name, Status.NODE, "; ".join(bad))
    return Check(
        name, Status.OK, f"{len(rows)} of {profile.gpus} ({profile.accelerator}), no uncorrected ECC"
    )


def check_dcgm(host: Host) -> Check:
    name = "DCGM diag"
    argv = ["dcgmi", "diag", "-r", "1", "-j"]
    if host.dcgm_host:
        argv += ["--host", host.dcgm_host]
    done = _tool(host, name, argv, host.dcgm_timeout_s)
    if isinstance(done, Check):
        return done
    if done is None:
        return Check(name, Status.SKIP, "dcgmi not installed in this image")
    text = done.stdout + done.stderr
    if re.search(r"connect|host engine", text, re.IGNORECASE) and done.returncode:
        return Check(name, Status.WARN, f"no DCGM host engine reachable: {_tail(done)}")
    failed = sorted(set(_failed_tests(_json_or_none(done.stdout))))
    if done.returncode or failed:
        detail = ", ".join(failed) if failed else _tail(done)
        return Check(name, Status.NODE, f"level 1 failed (exit {done.returncode}): {detail}")
    return Check(name, Status.OK, "level 1 passed")


def _json_or_none(text: str) -> Any:  # noqa: ANN401 - whatever dcgmi printed
    try:
        return json.loads(text)
    except ValueError:
        return None


def _failed_tests(node: Any, name: str = "") -> list[str]:  # noqa: ANN401
    """Names of every test whose status reads Fail, wherever dcgmi's JSON (its layout varies) nests it."""
    found: list[str] = []
    if isinstance(node, dict):
        label = str(node.get("name") or node.get("test_name") or name)
        status = node.get("status") or node.get("result")
        if isinstance(status, str) and status.lower() == "fail":
            found.append(label)
        for value in node.values():
            found += _failed_tests(value, label)
    elif isinstance(node, list):
        for item in node:
            found += _failed_tests(item, name)
    return found


_GPU_LINE = re.compile(r"^GPU (\d+):")
_LINK_LINE = re.compile(r"^\s*Link (\d+):\s*(.*)$")


def check_nvlink(host: Host, profile: InstanceProfile) -> Check:
    name = "NVLink"
    if profile.gpus <= 1:
        return Check(name, Status.SKIP, f"{profile.name} has {profile.gpus} GPU")
    done = _tool(host, name, ["nvidia-smi", "nvlink", "--status"], host.timeout_s)
    if isinstance(done, Check):
        return done
    if done is None:
        return Check(name, Status.WARN, "nvidia-smi not found; NVLink not checked")
    if done.returncode:
        return Check(name, Status.NODE, f"nvidia-smi nvlink failed (exit {done.returncode}): {_tail(done)}")
    links: dict[str, list[tuple[str, str]]] = {}
    gpu = None
    for line in done.stdout.splitlines():
        if match := _GPU_LINE.match(line):
            gpu = match.group(1)
            links[gpu] = []
        elif (match := _LINK_LINE.match(line)) and gpu is not None:
            links[gpu].append((match.group(1), match.group(2).strip()))
    down = [f"GPU {g} link {n}" for g, ls in links.items() for n, state in ls if "inactive" in state.lower()]
    without = [f"GPU {g}" for g, ls in links.items() if not ls]
    if len(links) < profile.gpus or down or without:
        problems = down + [f"{g}: no links" for g in without]
        if len(links) < profile.gpus:
            problems.insert(0, f"{len(links)} of {profile.gpus} GPUs listed")
        return Check(name, Status.NODE, "; ".join(problems[:8]))
    per_gpu = {len(ls) for ls in links.values()}
    return Check(
        name, Status.OK, f"{len(links)} GPUs, {'/'.join(map(str, sorted(per_gpu)))} links each, all up"
    )


def _as_pod(host: Host) -> selfcheck.Node:
    """The self-check's view of the node, pointed at the host's sysfs and device files."""
    return selfcheck.Node(
        sys_root=host.sys_root,
        dev_root=host.efa_dev_root,
        env=host.env,
        memlock=host.memlock,
        load_library=host.load_library,
    )


def check_efa(host: Host, profile: InstanceProfile) -> Check:
    return selfcheck._efa_devices(_as_pod(host), profile)  # noqa: SLF001 - the same check, shared on purpose


def check_memlock(host: Host, profile: InstanceProfile) -> Check:
    """The self-check's memlock check: a limit every pod of the node gets, so the node takes no work."""
    return selfcheck.memlock_check(_as_pod(host), profile)


def check_net_plugin(host: Host, profile: InstanceProfile) -> Check:
    """The self-check's NCCL net plugin check, in the training image this check runs in."""
    return selfcheck.net_plugin_check(_as_pod(host), profile)


def check_nvme(host: Host, profile: InstanceProfile) -> Check:
    name = "local NVMe"
    if not profile.nvme_count or host.nvme_path is None:
        return Check(name, Status.SKIP, f"{profile.name} has no instance store")
    try:
        # The checkpointer's probe of a folder it commits to: created, written, fsynced, cleaned up.
        written = free_space(probe_folder(host.nvme_path, fsync=True))
    except OSError as exc:
        return Check(name, Status.NODE, f"not writable: {exc.strerror or exc}")
    stat = host.statvfs(host.nvme_path)
    size_gib = stat.f_blocks * stat.f_frsize / (1 << 30)
    want = profile.nvme_total_gib * NVME_MIN_FRACTION
    if size_gib < want:
        return Check(
            name,
            Status.NODE,
            f"{size_gib:.0f} GiB filesystem, want >= {want:.0f} GiB ({profile.nvme_count} x "
            f"{profile.nvme_gib_each} GiB RAID0): the array is missing or degraded",
        )
    return Check(name, Status.OK, f"{size_gib:.0f} GiB, {written}")


def check_node_conditions(node: Mapping[str, Any]) -> Check:
    name = "node conditions"
    conditions = {c.get("type"): c for c in node.get("status", {}).get("conditions", [])}
    seen = [t for t in AGENT_CONDITIONS if t in conditions]
    if not seen:
        return Check(name, Status.WARN, "no node monitoring agent conditions (agent not installed?)")
    bad = [
        f"{t}={conditions[t].get('status')} ({conditions[t].get('reason', '')}: "
        f"{conditions[t].get('message', '')[:120]})"
        for t in seen
        if conditions[t].get("status") != "True"
    ]
    if bad:
        return Check(name, Status.NODE, "; ".join(bad))
    return Check(name, Status.OK, f"{', '.join(seen)} True")


def _tail(done: CommandResult) -> str:
    return (done.stderr.strip() or done.stdout.strip())[-200:]


def run_checks(host: Host, node: Mapping[str, Any]) -> list[Check]:
    """Every check for `node` (the Node object as the API returns it); never raises."""
    instance_type = node.get("metadata", {}).get("labels", {}).get(INSTANCE_TYPE_LABEL, "")
    try:
        profile = get_profile(instance_type, ec2_only=True)
    except UserError as exc:
        return [Check("profile", Status.NODE, str(exc)), check_node_conditions(node)]
    checks = [Check("profile", Status.OK, f"{profile.name}: {profile.gpus} x {profile.accelerator}")]
    probes: list[tuple[str, Callable[[], Check]]] = [
        ("GPUs", lambda: check_gpus(host, profile)),
        ("DCGM diag", lambda: check_dcgm(host)),
        ("NVLink", lambda: check_nvlink(host, profile)),
        ("EFA devices", lambda: check_efa(host, profile)),
        ("memlock limit", lambda: check_memlock(host, profile)),
        ("NCCL net plugin", lambda: check_net_plugin(host, profile)),
        ("local NVMe", lambda: check_nvme(host, profile)),
        ("node conditions", lambda: check_node_conditions(node)),
    ]
    for name, probe in probes:
        try:
            checks.append(probe())
        except Exception as exc:  # noqa: BLE001 - a check that breaks leaves the node unverified, not the loop dead
            checks.append(Check(name, Status.NODE, f"check raised {type(exc).__name__}: {exc}"))
    return checks


# ----- the verdict on the Node object ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Verdict:
    passed: bool
    reason: str
    message: str
    checks: tuple[Check, ...]


def verdict(checks: Sequence[Check]) -> Verdict:
    failed = [c for c in checks if c.status in {Status.NODE, Status.CONFIG}]
    if not failed:
        notes = [f"{c.name}: {c.detail}" for c in checks if c.status is Status.WARN]
        return Verdict(
            passed=True,
            reason=PASSED_REASON,
            message="all checks passed" + (f" ({'; '.join(notes)})" if notes else ""),
            checks=tuple(checks),
        )
    message = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return Verdict(
        passed=False,
        reason=REASONS.get(failed[0].name, "CheckFailed"),
        message=message[:1000],
        checks=tuple(checks),
    )


def label_time(now: datetime) -> str:
    """A label value (no ':' allowed): 20261201T100705Z."""
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_patch(node: Mapping[str, Any], result: Verdict, now: datetime) -> dict[str, Any]:
    """JSON merge patch of labels, annotation and taints. Carries the resourceVersion read, so a
    concurrent change of the taints (replaced whole: merge patches replace lists) is a 409, not lost."""
    metadata = node.get("metadata", {})
    others = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != UNVERIFIED_TAINT]
    taints = others
    if not result.passed:
        taints = [*others, {"key": UNVERIFIED_TAINT, "value": result.reason, "effect": "NoSchedule"}]
    report = {
        "passed": result.passed,
        "at": _rfc3339(now),
        "checks": [[c.name, c.status.value, c.detail] for c in result.checks],
    }
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {
                VERIFIED_LABEL: "true" if result.passed else "false",
                VERIFIED_AT_LABEL: label_time(now) if result.passed else None,
            },
            "annotations": {REPORT_ANNOTATION: json.dumps(report, separators=(",", ":"))},
        },
        "spec": {"taints": taints},
    }


def previous_condition(node: Mapping[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in node.get("status", {}).get("conditions", []) if c.get("type") == CONDITION_TYPE), None
    )


def status_patch(node: Mapping[str, Any], result: Verdict, now: datetime) -> dict[str, Any]:
    """Strategic merge patch of the one condition (conditions merge by type)."""
    status = "True" if result.passed else "False"
    before = previous_condition(node)
    changed = before is None or before.get("status") != status
    transition = _rfc3339(now) if before is None or changed else before.get("lastTransitionTime")
    return {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_TYPE,
                    "status": status,
                    "reason": result.reason,
                    "message": result.message,
                    "lastHeartbeatTime": _rfc3339(now),
                    "lastTransitionTime": transition,
                }
            ]
        }
    }


def event(node: Mapping[str, Any], result: Verdict, now: datetime, *, namespace: str) -> dict[str, Any]:
    metadata = node.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata.get('name', 'node')}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": metadata.get("name"),
            "uid": metadata.get("uid"),
        },
        "reason": result.reason,
        "message": result.message,
        "type": "Normal" if result.passed else "Warning",
        "source": {"component": COMPONENT, "host": metadata.get("name")},
        "firstTimestamp": _rfc3339(now),
        "lastTimestamp": _rfc3339(now),
        "count": 1,
    }


class NodeApi(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...
    def patch_node(self, name: str, patch: dict[str, Any]) -> None: ...
    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None: ...
    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...


def verify_once(
    api: NodeApi,
    host: Host,
    *,
    node_name: str,
    namespace: str,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Verdict:
    """One round: read the node, check it, record the verdict. API errors propagate (the loop retries)."""
    node = api.get_node(node_name)
    result = verdict(run_checks(host, node))
    when = now()
    before = previous_condition(node)
    for attempt in range(PATCH_ATTEMPTS):
        try:
            api.patch_node(node_name, node_patch(node, result, when))
            break
        except ApiError as exc:
            if exc.status != CONFLICT or attempt == PATCH_ATTEMPTS - 1:  # the node changed since it was read
                raise
            node = api.get_node(node_name)
    api.patch_node_status(node_name, status_patch(node, result, when))
    if (
        before is None
        or before.get("status") != ("True" if result.passed else "False")
        or before.get("reason") != result.reason
    ):
        api.create_event(namespace, event(node, result, when, namespace=namespace))
    return result


def loop(
    api: NodeApi,
    host: Host,
    *,
    node_name: str,
    namespace: str,
    interval_s: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Check at start, then every `interval_s`; an API failure is logged and retried, never fatal."""
    done = 0
    while rounds is None or done < rounds:
        done += 1
        try:
            result = verify_once(api, host, node_name=node_name, namespace=namespace)
        except Exception as exc:  # noqa: BLE001 - an API outage or a bug: log, retry, never crash-loop
            log.warning("could not record the verdict for %s: %r; retrying in %g s", node_name, exc, RETRY_S)
            sleep(RETRY_S)
            continue
        log.info("%s %s: %s", node_name, "verified" if result.passed else "NOT verified", result.message)
        sleep(interval_s)


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m nvrx_eks.training.node.nodecheck", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--node", default=env.get("NODE_NAME"), help="this node's name (default $NODE_NAME)")
    parser.add_argument("--namespace", default=env.get("POD_NAMESPACE", "default"), help="for Events")
    parser.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per nvidia-smi call")
    parser.add_argument("--dcgm-timeout-s", type=float, default=300.0)
    parser.add_argument("--dcgm-host", default=env.get("NVRX_EKS_DCGM_HOST") or None)
    parser.add_argument("--once", action="store_true", help="one round; exit 0 verified, 75 not")
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node (or $NODE_NAME, from the downward API) is required")
    return args


def main(argv: Sequence[str] | None = None, *, api: NodeApi | None = None, host: Host | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv, os.environ)
    host = host or Host(
        timeout_s=args.timeout_s, dcgm_timeout_s=args.dcgm_timeout_s, dcgm_host=args.dcgm_host
    )
    api = api or InClusterApi()
    if args.once:
        result = verify_once(api, host, node_name=args.node, namespace=args.namespace)
        for c in result.checks:
            say(f"{c.name:16} {c.status.value:14} {c.detail}")
        return 0 if result.passed else selfcheck.NODE_PROBLEM_EXIT_CODE
    loop(api, host, node_name=args.node, namespace=args.namespace, interval_s=args.interval_s)
    return 0


if __name__ == "__main__":
    exit_with(main)
