"""Run a rendered job (dist/*.yaml) as local processes, playing kubelet and the Job controller.

A test harness for this kit's manifests, not a scheduler: the manifest's own command line is what runs.

What it does, the way Kubernetes would:
- Starts the rendezvous store's Deployment pod, waits for its readiness probe (TCP port) and restarts
  its container whenever it exits (restartPolicy Always, same address and port), then one pod
  per Job index: init containers in order, then the main container, with the container's env, plus
  `JOB_COMPLETION_INDEX`, `HOSTNAME=<job>-<index>` and the completion-index annotation for fieldRefs.
- `$(VAR)` references in command/args are expanded from the container's env (Kubernetes semantics).
- Names resolve to loopback by rewriting command-line arguments and env values (documented mapping):
  a Service `<svc>[.<ns>[.svc[.cluster.local]]]:<port>` -> 127.0.0.1:<local port> (the store's Service,
  headless or not, names its one pod); a pod of the nodes' headless Service `<job>-<i>.<svc>...` ->
  127.0.0.<2+i>. Each "node" gets its own loopback address (all of 127/8
  reaches this machine), so nodes stay distinguishable as they are on a cluster.
- Ports are mapped the same way, so that two jobs run side by side: every containerPort of the store's
  pod gets a local port that is free now (bound to port 0 and released; `ports` sets one explicitly).
  In that pod's own command line and env a declared port number, as a whole token, becomes its local
  port (`--port=29400` -> `--port=41234`), and so does its readinessProbe; clients reach it through the
  Service's port (`<svc>:29400` -> `127.0.0.1:41234`, via the Service's targetPort). The chosen ports
  are in executor.jsonl (`store_ready`) and in the result.
- Volumes map to folders under the run folder: a PVC -> `volumes/pvc-<claim>` (shared by every pod),
  a hostPath -> `volumes/node-<index>-<generation>/<path>` (a deleted node's replacement gets a fresh,
  empty disk, as a new node would), other emptyDirs -> `volumes/pod-<pod>/<volume>`. A Memory emptyDir
  mounted at /dev/shm is the machine's /dev/shm (POSIX shared memory cannot be remapped); any other
  Memory emptyDir (the memory checkpoint tier) is a folder of its own on the machine's tmpfs,
  `/dev/shm/nvrx-eks-local/<run-key>/<pod>/<volume>`, removed when the pod ends: launcher restarts
  inside the pod keep it, a replacement pod starts with an empty one (as on a cluster, where the
  emptyDir dies with its pod). Container paths in args/env under a mount are rewritten to the folder.
- Each pod has its own temporary folder (`TMPDIR`, a short path under the machine's temp folder, as a
  container has its own /tmp), removed when the pod ends: what its processes leave there (ft_launcher's
  IPC sockets, NVRx's watchdog files) goes with it, also after a SIGKILL.
- `image: local` means the command runs with this virtualenv (its bin first on PATH).
- The API, for a pod that mounts a service account token (the trainer pod's topology init container
  reads its own Node): the executor starts a loopback API server (localrun/node_api.py) serving each
  local node's labels (`local_node_labels`: network nodes, no zone), writes its token and CA into the
  pod's projected volume (a serviceAccountToken and the `kube-root-ca.crt` ConfigMap), and gives
  every container KUBERNETES_SERVICE_HOST/PORT, as the kubelet does. Each pod runs on the node
  `node-<index>-<generation>` (the downward API's spec.nodeName), the one its hostPath folders belong to.
- The Job controller: restartPolicy Never; on a pod's exit it applies podFailurePolicy (onExitCodes of
  the container whose exit ended the pod, an init container included, as the Job controller matches
  init container statuses too; DisruptionTarget for deleted nodes; first matching rule wins; Ignore
  replaces the pod without counting a failure), backoffLimitPerIndex and maxFailedIndexes,
  and starts a replacement only once the old pod's processes are gone (podReplacementPolicy Failed).
- A pod's processes: every container starts in its own session, and carries the environment marker
  `NVRX_EKS_LOCAL_POD=<run-key>/<pod>`. When a pod ends (its main container exited, an init container
  failed, the node was deleted, the job ended) every process of the pod is SIGKILLed: the container's
  process tree and every process carrying the marker. The tree alone is not enough: ft_launcher's
  workers run in their own sessions and NVRx's in-process monitor processes daemonize out of the tree
  (on a cluster they die with the pod's cgroup). The replacement starts only once all are gone. (A
  container the `warm` runtime forked writes its pod's marker into the environment /proc shows, which
  what it forks without an exec inherits; the runtime also lists its live forks with their markers, and
  the search here includes them.)
- successPolicy `succeededCount` (the chart sets it with warm spares): the job is complete once that
  many indexes succeeded; the remaining pods are ended (the job's shutdown), not replaced.
- Node deletion (`LocalJob.delete_node(index)` or a file `$NVRX_EKS_CHAOS_DIR/delete-node-<index>`,
  the chaos contract): the pod's processes are killed as above, the pod gets DisruptionTarget, and
  the replacement runs on a "new node" (fresh hostPath folder, fresh memory emptyDir). That new node
  takes `node_provision_s` to come (default 0): on a cluster the replacement of a lost node's pod is
  Pending until a node joins (Karpenter or the node group: minutes for a p5), and what the job does
  meanwhile (wait for it, or go on with a warm spare) is what a node-loss test is about.
- Store loss (`LocalJob.delete_store()` or a file `$NVRX_EKS_CHAOS_DIR/delete-store`, which the
  `store_loss` fault writes): the store pod is deleted (its processes killed, as a node loss or an OOM
  kill would) and the Deployment's replacement starts behind the same Service (here: the same local
  port) with an empty store: the rendezvous the launchers were connected to is gone mid-run.
Per-pod logs: `<run>/pods/<pod>.log`; executor events (pod and container starts, pod ends, node
deletions): `<run>/executor.jsonl`; outcome: `<run>/job.json`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from nvrx_eks.k8s.names import CLUSTER_CA_CONFIG_MAP, JOB_UID_LABEL
from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE
from nvrx_eks.k8s.termination import failure_cause, log_tail
from nvrx_eks.kitcore.configio import UserError, read_yaml_documents
from nvrx_eks.kitcore.ports import ReservedPort
from nvrx_eks.localrun.addresses import HOSTS, SYSTEM_ADDRESS, missing, node_address, run_addresses
from nvrx_eks.localrun.node_api import LOOPBACK, LocalApiServer
from nvrx_eks.localrun.runtimes import POD_ENV, ContainerSpec, runtime_named
from nvrx_eks.localrun.warm import live_roots
from nvrx_eks.training.checkpoint.domains import NETWORK_NODE_LABELS

if TYPE_CHECKING:
    from collections.abc import Callable

    from nvrx_eks.localrun.runtimes import Running, Runtime

COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
CHAOS_ENV = "NVRX_EKS_CHAOS_DIR"
LOCAL_SHM_ROOT = Path("/dev/shm/nvrx-eks-local")  # noqa: S108 - tmpfs for Memory emptyDirs, by design
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_DNS_TAIL = r"(?:\.{ns}(?:\.svc(?:\.cluster\.local)?)?)?"


@dataclass
class PodOutcome:
    pod: str
    index: int | None
    """Job index (None for the rendezvous store)."""
    started: float
    ended: float | None = None
    exit_code: int | None = None
    container: str = ""
    """The container whose exit ended the pod."""
    reason: str = "Running"
    """Succeeded, Failed, NodeDeleted (DisruptionTarget), InitFailed, Killed (job ended)."""
    log: str = ""
    message: str = ""
    """A failed pod's termination message: the tail of its log, as the kubelet keeps it for
    `terminationMessagePolicy: FallbackToLogsOnError` (k8s/termination.py)."""


@dataclass(frozen=True)
class NodeDeletion:
    index: int
    after_s: float
    """Seconds after the Job's pods started."""

    @classmethod
    def parse(cls, item: str) -> NodeDeletion:
        """`INDEX@SECONDS` (`--delete-node`): a whole index >= 0 and a finite number of seconds >= 0."""
        index, sep, after = item.partition("@")
        try:
            seconds = float(after)
        except ValueError:
            seconds = float("nan")
        if not sep or not index.strip().isdigit() or not 0 <= seconds < float("inf"):
            raise UserError(
                f"--delete-node {item!r} is not INDEX@SECONDS: a Job index (0, 1, ...) and the seconds "
                "after the pods start, e.g. 1@20"
            )
        return cls(index=int(index), after_s=seconds)


@dataclass
class JobResult:
    succeeded: bool
    reason: str
    wall_s: float
    pods: list[PodOutcome] = field(default_factory=list)
    deletions: list[dict[str, Any]] = field(default_factory=list)
    """One per node deletion: index, time, replacement pod and its start time."""
    run_dir: str = ""
    run_key: str = ""
    """The pod marker prefix of this run's processes (`marked_processes(run_key)` finds any left)."""
    ports: dict[str, int] = field(default_factory=dict)
    """`<service>:<port>` -> the local port it reached (see the module docstring)."""
    user_error: bool = False
    """The job failed on its input or on the user's script (k8s/termination.py `Cause.user_error`): the
    same at every restart, the user's to fix (`nvrx-eks local run` and the demo exit 2)."""


@dataclass
class _Container:
    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class _Rendered:
    job: dict[str, Any]
    store: dict[str, Any] | None
    services: list[dict[str, Any]]

    @property
    def job_name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"].get("namespace", "default"))


# What a local "node" offers: the kubelet's own resources. A container that asks for a device
# plugin's (nvidia.com/gpu, vpc.amazonaws.com/efa) would stay Pending on a cluster without such a
# node; here its command would start without them and fail minutes later.
LOCAL_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def local_node_labels(index: int, nodes: int) -> dict[str, str]:
    """The labels of the local node that runs pod `index` of `nodes`, as EKS labels a p5: the network
    nodes above it, layers 1 to 3. One layer-1 and one layer-2 node; at layer 3, the first half of the
    indexes under one network node and the rest under another, as capacity comes in blocks, so the
    nodes next to each other by index share one. No zone: a local node has none."""
    layer_1, layer_2, layer_3, _ = NETWORK_NODE_LABELS
    return {layer_1: "nn-local-1", layer_2: "nn-local-2", layer_3: f"nn-local-3{'ab'[2 * index // nodes]}"}


def _token_sources(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The serviceAccountToken sources of the pod's projected volumes."""
    return [
        source
        for vol in pod_spec.get("volumes", [])
        for source in (vol.get("projected") or {}).get("sources", [])
        if "serviceAccountToken" in source
    ]


def _pod_templates(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kinds = {"Job", "Deployment"}
    return [d.get("spec", {}).get("template", {}).get("spec", {}) for d in docs if d.get("kind") in kinds]


def _cluster_only(docs: list[dict[str, Any]]) -> list[str]:
    """What in these manifests only a cluster node has: extended resources, a registry image."""
    found: list[str] = []
    for spec in _pod_templates(docs):
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            resources = container.get("resources") or {}
            names = {*(resources.get("requests") or {}), *(resources.get("limits") or {})}
            found += [f"{container.get('name')} requests {n}" for n in sorted(names - LOCAL_RESOURCES)]
            if container.get("image", LOCAL_IMAGE) != LOCAL_IMAGE:
                found.append(f"{container.get('name')} runs image {container['image']}")
    return list(dict.fromkeys(found))


def load_rendered(dist_dir: Path) -> _Rendered:
    """The Job, the store Deployment and the Services of one rendered job folder (UserError when it
    is not a folder of one job rendered for this machine)."""
    if not Path(dist_dir).is_dir():
        raise UserError(f"{dist_dir}: no such folder; render a job there first (nvrx-eks job render -o)")
    docs = []
    for path in sorted(Path(dist_dir).glob("*.yaml")):
        docs += read_yaml_documents(path, what="rendered manifest (nvrx-eks job render)")
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if len(jobs) != 1:
        raise UserError(
            f"{dist_dir}: expected exactly one rendered Job, found {len(jobs)}; render one job there"
        )
    cluster_only = _cluster_only(docs)
    if cluster_only:
        raise UserError(
            f"{dist_dir}: rendered for a cluster ({'; '.join(cluster_only[:4])}): the local executor runs "
            "a job rendered from local values (instance_profile: local-cpu, image: local), e.g. "
            "`nvrx-eks job render -f k8s/values/local-cpu.yaml -o dist/`"
        )
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    return _Rendered(
        job=jobs[0],
        store=deployments[0] if deployments else None,
        services=[d for d in docs if d.get("kind") == "Service"],
    )


def _container_ports(pod_spec: dict[str, Any]) -> dict[str | int, int]:
    """A pod's declared container ports, by number and by name."""
    found: dict[str | int, int] = {}
    for container in pod_spec.get("containers", []):
        for port in container.get("ports", []):
            found[int(port["containerPort"])] = int(port["containerPort"])
            if "name" in port:
                found[port["name"]] = int(port["containerPort"])
    return found


def store_ports(rendered: _Rendered) -> list[int]:
    """The container ports the rendezvous store's pod declares (none without a store)."""
    spec = (rendered.store or {}).get("spec", {}).get("template", {}).get("spec", {})
    return sorted(set(_container_ports(spec).values()))


def _selects(service: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    selector = service["spec"].get("selector") or {}
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


class _Names:
    """Service and pod DNS names -> loopback addresses, Service ports -> local ports (module docstring).

    `local_ports` (the store pod's container port -> local port) is read when a name is rewritten, so a
    port chosen again (the store could not bind the first one) applies to every pod started after it."""

    def __init__(self, rendered: _Rendered, local_ports: dict[int, int]) -> None:
        ns = re.escape(rendered.namespace)
        tail = _DNS_TAIL.format(ns=ns)
        job = re.escape(rendered.job_name)
        subdomain = rendered.job["spec"]["template"]["spec"].get("subdomain")
        self._rules: list[tuple[re.Pattern[str], Any]] = []
        self.service_ports: dict[str, int] = {}
        """`<service>:<port>` -> the store's container port behind it."""
        if subdomain:
            pod = re.compile(rf"\b{job}-(\d+)\.{re.escape(subdomain)}{tail}\b")
            self._rules.append((pod, lambda m: node_address(int(m.group(1)))))
        store_template = (rendered.store or {}).get("spec", {}).get("template", {})
        store_labels = store_template.get("metadata", {}).get("labels", {})
        store_ports = _container_ports(store_template.get("spec", {}))
        for svc in rendered.services:
            selects_store = _selects(svc, store_labels)
            if svc["spec"].get("clusterIP") == "None" and not selects_store:
                continue  # the nodes' headless Service is reached through its pods' names (above)
            name = re.escape(svc["metadata"]["name"])
            if selects_store:
                for entry in svc["spec"].get("ports", []):
                    target = store_ports.get(entry.get("targetPort", entry["port"]))
                    if target is None:
                        continue
                    self.service_ports[f"{svc['metadata']['name']}:{entry['port']}"] = target
                    self._rules.append(
                        (
                            re.compile(rf"(?<![\w./-]){name}{tail}:{entry['port']}(?!\d)"),
                            lambda _m, t=target: f"127.0.0.1:{local_ports.get(t, t)}",
                        )
                    )
            # Only in HOST:PORT form, so that a job name inside a path or an id is left alone.
            self._rules.append((re.compile(rf"(?<![\w./-]){name}{tail}(?=:\d)"), lambda _m: "127.0.0.1"))

    def rewrite(self, text: str) -> str:
        for pattern, repl in self._rules:
            text = pattern.sub(repl, text)
        return text


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def pvc_folder(run_dir: Path, claim: str) -> Path:
    """The local folder standing in for PersistentVolumeClaim `claim` (shared by every pod of a run)."""
    return run_dir / "volumes" / f"pvc-{claim}"


def _environ(proc: psutil.Process) -> dict[str, str]:
    with contextlib.suppress(psutil.Error):  # gone, a zombie, or not ours to read
        return proc.environ()
    return {}


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie is dead; its parent or init reaps it)."""
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def marked_processes(marker: str) -> list[psutil.Process]:
    """Processes whose pod marker is `marker` or lies below it (`<run-key>` matches the whole run)."""
    # A warm runtime's forks: their /proc environ is their server's, which a search for the whole run
    # matches too (each process once).
    found = {proc.pid: proc for proc in live_roots(marker)}
    for proc in psutil.process_iter():
        value = _environ(proc).get(POD_ENV)
        if value is not None and (value == marker or value.startswith(f"{marker}/")):
            found.setdefault(proc.pid, proc)
    return list(found.values())


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return any("multiprocessing.resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def kill_pod_processes(marker: str, *, root_pid: int | None = None) -> None:
    """SIGKILL a pod's processes (the tree under `root_pid` and every marked one) until none is left.

    multiprocessing's resource trackers go last, and are given a moment to leave on their own: the
    forkserver's workers (training/resilience/launch.py) and torch.distributed.elastic's queues and events are
    POSIX semaphores in /dev/shm that only the tracker unlinks, when every process holding its pipe is
    gone. On a cluster the pod's /dev/shm is its own and dies with it; here it is the machine's, and a
    tracker SIGKILLed with the rest left one semaphore per worker start behind.
    """
    for attempt in range(10):
        procs = {p.pid: p for p in marked_processes(marker)}
        if root_pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(root_pid)
                procs |= {p.pid: p for p in [root, *root.children(recursive=True)]}
        procs.pop(os.getpid(), None)
        alive = [p for p in procs.values() if _alive(p)]
        if not alive:
            return
        trackers = [p for p in alive if _is_resource_tracker(p)] if attempt == 0 else []
        others = [p for p in alive if p not in trackers]
        for proc in others:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        # Dead once a zombie: orphans are reaped by PID 1 whenever it gets to it, which may be late.
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in others) and time.monotonic() < deadline:
            time.sleep(0.02)
        # Its pipe's writers are dead now: the tracker reads EOF, unlinks what they left and exits.
        deadline = time.monotonic() + 3
        while any(_alive(p) for p in trackers) and time.monotonic() < deadline:
            time.sleep(0.02)


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` or one of its children listens on TCP `port`."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                for conn in proc.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                        return True
    return False


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


STORE_RESTART_LIMIT = 5
"""Restarts of the store's container before the local run gives up on it."""


class _Pod:
    """One pod: init containers, then the main container, as local processes."""

    def __init__(
        self,
        *,
        name: str,
        index: int | None,
        marker: str,
        containers: list[_Container],
        log: Path,
        cwd: Path,
        ram_dirs: list[Path],
        on_event: Callable[..., None],
        start: Callable[..., Running],
    ) -> None:
        """`start(argv, env, cwd=, log=)`: the runtime's, for this run."""
        self.name, self.index, self.marker = name, index, marker
        self._ram_dirs = ram_dirs
        self._start = start
        self._on_event = on_event
        self.outcome = PodOutcome(pod=name, index=index, started=time.time(), log=str(log))
        self._containers = containers
        self._log_path = log
        self._cwd = cwd
        self._lock = threading.Lock()
        self.proc: Running | None = None
        self.deleted = False
        self.stopped = False
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        with self._log_path.open("ab") as log:
            for i, container in enumerate(self._containers):
                with self._lock:
                    if self.stopped:
                        break
                    log.write(f"=== container {container.name}: {' '.join(container.argv)}\n".encode())
                    log.flush()
                    self._on_event("container_start", pod=self.name, container=container.name)
                    try:
                        self.proc = self._start(container.argv, container.env, cwd=self._cwd, log=log)
                    except OSError as exc:  # kubelet's StartError: the container fails with 128
                        log.write(f"cannot start {container.argv[0]}: {exc}\n".encode())
                        log.flush()
                        self._finish(128, container.name, init_failed=i < len(self._containers) - 1)
                        return
                code = self.proc.wait()
                is_main = i == len(self._containers) - 1
                if code != 0 or is_main:
                    self._finish(code, container.name, init_failed=not is_main)
                    return
        self._finish(None, "", init_failed=False)

    def _finish(self, code: int | None, container: str, *, init_failed: bool) -> None:
        if self.done.is_set():
            return
        # The pod is over: nothing it started outlives it, and its memory emptyDirs are freed. (Its
        # main process is reaped, so its pid may be reused: only the marker names what is left.)
        kill_pod_processes(self.marker)
        for folder in self._ram_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        o = self.outcome
        o.ended, o.exit_code = time.time(), code
        if self.deleted:
            o.reason = "NodeDeleted"
        elif self.stopped:
            o.reason = "Killed"
        elif init_failed:
            o.reason = "InitFailed"
        else:
            o.reason = "Succeeded" if code == 0 else "Failed"
        o.container = container
        if o.reason in {"Failed", "InitFailed"}:
            with contextlib.suppress(OSError):
                o.message = log_tail(self._log_path.read_text(errors="replace"))
        self.done.set()

    def kill(self, *, deleted: bool) -> None:
        with self._lock:
            self.deleted = self.deleted or deleted
            self.stopped = True
            running = self.proc is not None and self.proc.poll() is None
            kill_pod_processes(self.marker, root_pid=self.proc.pid if running and self.proc else None)
            if self.proc is None:
                self._finish(None, "", init_failed=False)
        self.done.wait(timeout=30)


def pod_tmp_prefix(run_key: str) -> str:
    """How the names of a run's pod temporary folders begin; mkdtemp adds 8 random characters."""
    return f"nvrx-{run_key[-10:]}-"


POD_TMP_NAME_LENGTH = len(pod_tmp_prefix("0" * 10)) + 8
SOCKET_NAME_ROOM = 40
"""What the pods' processes put after their TMPDIR for a unix socket: ft_launcher's
`/_ft_launcher<pid>_rmon<local rank>.socket` (NVRx), multiprocessing's forkserver
`/pymp-<8>/listener-<8>`, with room for a 7-digit pid and a 3-digit local rank."""
UNIX_PATH_MAX = 107
"""The longest path a unix socket binds to on Linux (sun_path holds 108 bytes, its NUL included)."""


def check_socket_room(temp_folder: Path) -> None:
    """Refuse, before any pod starts, a machine temp folder too long for the pods' unix sockets: each
    pod's TMPDIR is a folder in it, and a socket path past the limit fails only inside a launcher
    ("AF_UNIX path too long"), where every restart fails the same way until the job's backoff limit."""
    longest = len(str(temp_folder)) + 1 + POD_TMP_NAME_LENGTH + SOCKET_NAME_ROOM
    if longest > UNIX_PATH_MAX:
        room = UNIX_PATH_MAX - 1 - POD_TMP_NAME_LENGTH - SOCKET_NAME_ROOM
        raise UserError(
            f"TMPDIR: the temp folder {temp_folder} is {len(str(temp_folder))} characters long; the local "
            f"pods put their unix sockets below it, which allows at most {room}: set TMPDIR to a shorter "
            "folder (TMPDIR=/tmp)"
        )


class LocalJob:
    """A rendered job running on this machine. Use `run()` or `start()` + `wait()`; `delete_node(i)`."""

    def __init__(
        self,
        dist_dir: Path,
        *,
        run_dir: Path,
        chaos_dir: Path | None = None,
        venv_bin: Path | None = None,
        extra_env: dict[str, str] | None = None,
        timeout_s: float = 600.0,
        ports: dict[int, int] | None = None,
        echo: Callable[[str], None] | None = None,
        node_provision_s: float = 0.0,
        runtime: Runtime | None = None,
    ) -> None:
        """`ports`: store container port -> local port, where one must be fixed (default: a free one
        each); `echo`: where to say which local ports the job uses (the CLI prints; tests stay quiet);
        `node_provision_s`: how long the replacement of a deleted node's pod stays Pending; `runtime`:
        how a container runs (localrun/runtimes.py: processes, warm or podman; default:
        `NVRX_EKS_LOCAL_RUNTIME`'s, else processes)."""
        self.runtime: Runtime = runtime or runtime_named(None)
        check_socket_room(Path(tempfile.gettempdir()))
        self.rendered = load_rendered(dist_dir)
        self.run_dir = Path(run_dir).resolve()
        self.chaos_dir = (chaos_dir or self.run_dir / "chaos").resolve()
        self.venv_bin = venv_bin or Path(sys.executable).parent
        self.extra_env = extra_env or {}
        self.timeout_s = timeout_s
        self.node_provision_s = node_provision_s
        self._pending: dict[int, float] = {}
        """Index -> when its replacement starts: Pending until its new node has come."""
        self._fixed_ports = dict(ports or {})
        self.local_ports: dict[int, int] = {}
        """The store pod's container port -> the local port it listens on (chosen in `start`)."""
        # The chosen local ports, held for the run: the store's restarts bind the same ports.
        self._port_holds: list[ReservedPort] = []
        self._echo = echo or (lambda _line: None)
        self._names = _Names(self.rendered, self.local_ports)
        spec = self.rendered.job["spec"]
        self.completions = int(spec["completions"])
        self.backoff_per_index = int(spec.get("backoffLimitPerIndex", 6))
        self.max_failed_indexes = spec.get("maxFailedIndexes")
        rules = (spec.get("successPolicy") or {}).get("rules", [])
        self.success_count = min([int(r["succeededCount"]) for r in rules if "succeededCount" in r] or [0])
        """successPolicy succeededCount (0: none): the job is done once that many indexes succeeded."""
        self.failure_rules = (spec.get("podFailurePolicy") or {}).get("rules", [])
        self.pods: dict[int, _Pod] = {}
        self.history: list[PodOutcome] = []
        self.failures = dict.fromkeys(range(self.completions), 0)
        self.generation = dict.fromkeys(range(self.completions), 0)
        self.succeeded: set[int] = set()
        self._out_of_budget: dict[int, PodOutcome] = {}
        self.deletions: list[dict[str, Any]] = []
        self._store: _Pod | None = None
        self._ended_stores: list[PodOutcome] = []
        self.api: LocalApiServer | None = None
        """The loopback API server (started in `start` when a pod mounts a service account token)."""
        self._delete_requests: list[int] = []
        self._user_error = False
        """The failure verdict's cause was the user's input or script (`JobResult.user_error`)."""
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._events = self.run_dir / "executor.jsonl"
        self._emit_lock = threading.Lock()
        digest = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:10]
        self.run_key = f"{self.rendered.job_name}-{digest}"
        """Names this run's pods in their marker and in the machine's tmpfs (unique per run folder)."""
        self.shm_dir = LOCAL_SHM_ROOT / self.run_key
        self.job_uid = str(uuid.uuid4())
        """The Job's UID, as the Job controller labels each of its pods (names.JOB_UID_LABEL): one per run."""

    # ---- public API -------------------------------------------------------------------------
    def delete_node(self, index: int) -> None:
        """Delete the node running pod `index` (thread-safe; acted on by the controller loop)."""
        with self._lock:
            self._delete_requests.append(index)

    def run(self, *, deletions: list[NodeDeletion] | tuple[NodeDeletion, ...] = ()) -> JobResult:
        pending = sorted(deletions, key=lambda d: d.after_s)
        previous = None
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a `kill`, a CI runner's cancel) ends the run like Ctrl-C: through the `finally`
            # below, so that no pod process, tmpfs folder or temporary folder outlives the executor.
            previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            self.start()
            return self._control(pending)
        finally:
            self._shutdown()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    # ---- the controller ---------------------------------------------------------------------
    def start(self) -> None:
        for sub in ("pods", "volumes"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self._say_unnamed_addresses()
        self.chaos_dir.mkdir(parents=True, exist_ok=True)
        if any(_token_sources(self.rendered.job["spec"]["template"]["spec"])):
            self.api = LocalApiServer(self.run_dir / "api")
            self.api.start()
            self._emit("api_ready", port=self.api.port)
        if self.rendered.store is not None:
            self._start_store()
        self._t0 = time.time()
        for index in range(self.completions):
            self._start_pod(index)

    def _say_unnamed_addresses(self) -> None:
        """Says, once per run, which of its loopback addresses /etc/hosts does not name: torch then asks
        the DNS server on every store connection, and a dropped query stalls it 5 s (localrun/addresses)."""
        try:
            hosts = HOSTS.read_text(encoding="utf-8")
        except OSError:
            hosts = ""
        lacking = missing(hosts, run_addresses(self.completions))
        if lacking:
            self._emit("addresses_unnamed", addresses=lacking)
            self._echo(
                f"{len(lacking)} local node addresses ({lacking[0]}..{lacking[-1]}) have no name in {HOSTS}: "
                "torch looks each store connection's peer up in DNS, which can stall it 5 s; name them with "
                "`sudo python localrun/addresses.py --add` (docs/local.md)"
            )

    def _control(self, pending: list[NodeDeletion]) -> JobResult:
        deadline = self._t0 + self.timeout_s
        active_deadline = self.rendered.job["spec"].get("activeDeadlineSeconds")
        if active_deadline:
            deadline = min(deadline, self._t0 + float(active_deadline))
        while True:
            now = time.time()
            while pending and now - self._t0 >= pending[0].after_s:
                self.delete_node(pending.pop(0).index)
            self._poll_chaos_dir()
            with self._lock:
                requests, self._delete_requests = self._delete_requests, []
            for index in requests:
                self._delete(index)
            for index, due in list(self._pending.items()):
                if now >= due:
                    del self._pending[index]
                    self._start_pod(index)
            verdict = self._reconcile()
            if verdict is not None:
                return self._result(succeeded=verdict[0], reason=verdict[1])
            failure = self._restart_store() if self._store is not None and self._store.done.is_set() else None
            if failure is not None:
                return self._result(succeeded=False, reason=failure)
            if now > deadline:
                return self._result(succeeded=False, reason="DeadlineExceeded")
            time.sleep(0.1)

    def _reconcile(self) -> tuple[bool, str] | None:
        # In the order the pods ended, as the Job controller sees their terminations arrive.
        ended = [
            (i, p)
            for i, p in self.pods.items()
            if p.done.is_set()
            and i not in self.succeeded
            and i not in self._out_of_budget
            and i not in self._pending
        ]
        for index, pod in sorted(ended, key=lambda item: item[1].outcome.ended or 0.0):
            o = pod.outcome
            self._emit("pod_end", pod=pod.name, index=index, exit_code=o.exit_code, reason=o.reason)
            if o.reason == "Succeeded":
                self.succeeded.add(index)
                continue
            action = self._failure_action(o)
            if action == "FailJob":
                found = failure_cause(o.message) if o.message else None
                self._user_error = found is not None and found.user_error
                cause = f": {found.text}" if found is not None else ""
                return False, (
                    f"PodFailurePolicy: pod {pod.name} container {o.container} exit code {o.exit_code} "
                    f"fails the job{cause}"
                )
            if action != "Ignore":
                self.failures[index] += 1
                if action == "FailIndex" or self.failures[index] > self.backoff_per_index:
                    self._out_of_budget[index] = o
                    continue
            if o.reason == "NodeDeleted" and self.node_provision_s > 0:
                self._pending[index] = time.time() + self.node_provision_s
                self._emit("pod_pending", index=index, until_s=self.node_provision_s)
                continue
            self._start_pod(index)
        if self._out_of_budget:
            return self._budget_verdict()
        if len(self.succeeded) == self.completions:
            return True, "Completed"
        if self.success_count and len(self.succeeded) >= self.success_count:
            # The Job controller ends the remaining pods (the unused spares) when it marks the Job.
            return True, "SuccessPolicy: Completed"
        return None

    def _budget_verdict(self) -> tuple[bool, str] | None:
        """The job fails (maxFailedIndexes 0); the reason names the index where the fault was.

        When a launcher runs out of restarts every launcher of the group leaves with it (NVRx counts
        restarts by the rendezvous round, job-wide, and closes the rendezvous for all). A pod whose ranks
        were all stopped by their launcher is not charged (podFailurePolicy on its collateral exit code),
        but one whose ranks failed in turn (a collective error after the peer died) is, so several
        indexes may run out at once. The index to name is the one where the fault was: the pods
        of one failed group end within a moment of each other, so the verdict waits 3 s for them, then
        names the index whose cause is the most telling (k8s/termination.py `Cause.severity`: a rank
        killed by a signal before one that exited with an error before one its launcher stopped),
        the first to end among equals.
        """
        first_at = min(o.ended or 0.0 for o in self._out_of_budget.values())
        if time.time() - first_at < 3.0 and len(self._out_of_budget) < len(self.pods):  # noqa: PLR2004
            return None
        causes = {i: failure_cause(o.message) for i, o in self._out_of_budget.items()}
        by_end = sorted(self._out_of_budget, key=lambda i: self._out_of_budget[i].ended or 0.0)
        index = max(by_end, key=lambda i: causes[i].severity)  # max keeps the first of equals
        o = self._out_of_budget[index]
        self._user_error = causes[index].user_error
        others = sorted(set(self._out_of_budget) - {index})
        also = f" (also out of budget: index {', '.join(map(str, others))})" if others else ""
        return False, (
            f"index {index} failed {self.failures[index]} time(s): BackoffLimitExceeded; cause: "
            f"{causes[index].text} (pod {o.pod}, container {o.container}, exit code {o.exit_code}){also}"
        )

    def _failure_action(self, o: PodOutcome) -> str:
        for rule in self.failure_rules:
            codes = rule.get("onExitCodes")
            if codes and o.exit_code is not None and o.reason != "NodeDeleted":
                if codes.get("containerName") not in {None, o.container}:
                    continue
                hit = o.exit_code in codes["values"]
                if hit == (codes.get("operator", "In") == "In"):
                    return str(rule["action"])
            for cond in rule.get("onPodConditions", []):
                if cond.get("type") == "DisruptionTarget" and o.reason == "NodeDeleted":
                    return str(rule["action"])
        return "Count"

    def delete_store(self) -> None:
        """`kubectl delete pod` on the store's pod: its processes are killed; the controller loop then
        starts the Deployment's replacement behind the same Service (here: the same local port), with
        an empty store."""
        if self._store is None or self._store.done.is_set():
            self._emit("delete_store_ignored")
            return
        self._emit("delete_store", pod=self._store.name)
        self._store.kill(deleted=True)

    def _delete(self, index: int) -> None:
        pod = self.pods.get(index)
        if pod is None or pod.done.is_set():
            self._emit("delete_node_ignored", index=index)
            return
        t = time.time()
        self._emit("delete_node", index=index, pod=pod.name)
        pod.kill(deleted=True)
        self.generation[index] += 1  # the replacement runs on a new node with an empty local disk
        self.deletions.append({"index": index, "pod": pod.name, "time": t, "killed_s": time.time() - t})

    def _poll_chaos_dir(self) -> None:
        store_request = self.chaos_dir / "delete-store"
        if store_request.exists():
            store_request.rename(store_request.with_name(f"handled-delete-store-{time.time():.3f}"))
            self.delete_store()
        for path in sorted(self.chaos_dir.glob("delete-node-*")):
            if path.suffix == ".tmp":  # still being written: the writer renames it into place when done
                continue
            suffix = path.name.removeprefix("delete-node-")
            handled = path.with_name(f"handled-{path.name}-{time.time():.3f}")
            path.rename(handled)
            if suffix.isdigit() and int(suffix) < self.completions:
                self.delete_node(int(suffix))
            else:
                self._emit("bad_chaos_request", file=path.name)

    # ---- pods -------------------------------------------------------------------------------
    def _start_store(self) -> None:
        deploy = self.rendered.store
        assert deploy is not None  # noqa: S101 - checked by the caller
        pod_spec = deploy["spec"]["template"]["spec"]
        declared = _container_ports(pod_spec)
        probe = (pod_spec["containers"][0].get("readinessProbe") or {}).get("tcpSocket", {}).get("port")
        probe_port = declared.get(probe, probe) if probe is not None else None
        for port in sorted(set(declared.values())):
            if port in self._fixed_ports:
                self.local_ports[port] = self._fixed_ports[port]
            else:
                # Held, not merely found free: NVRx's store (torch's TCPStore) binds it beside the hold,
                # and nothing else can take it before the store binds it or between its restarts.
                self._port_holds.append(ReservedPort())
                self.local_ports[port] = self._port_holds[-1].port
        name = f"{deploy['metadata']['name']}-0"
        self._store = self._make_pod(
            name=name, index=None, pod_spec=pod_spec, annotations={}, ports=self.local_ports
        )
        self._store.start()
        if probe_port is not None and not self._wait_listening(self.local_ports.get(probe_port, probe_port)):
            raise UserError(
                f"rendezvous store did not listen on port {self.local_ports.get(probe_port, probe_port)}; "
                f"see {self.run_dir / 'pods'}"
            )
        ports = {svc: self.local_ports.get(port, port) for svc, port in self._names.service_ports.items()}
        self._emit("store_ready", pod=name, ports=ports)
        for svc, port in ports.items():
            self._echo(f"rendezvous store {svc} -> 127.0.0.1:{port}")

    def _restart_store(self) -> str | None:
        """The store Deployment's pod has restartPolicy Always: the kubelet restarts its container in
        the same pod (same address, same port) whenever it exits. NVRx's control process exits once the
        launchers closed the rendezvous for good; the restarted one serves an empty store, where the
        Job's replacement pods start a fresh rendezvous. Returns a failure once it keeps exiting
        (the kubelet's CrashLoopBackOff, where a cluster would retry with growing waits)."""
        assert self._store is not None  # noqa: S101 - called only with a store
        exited = self._store
        self._ended_stores.append(exited.outcome)
        restarts = len(self._ended_stores)
        self._emit("store_restart", pod=exited.name, exit_code=exited.outcome.exit_code, restarts=restarts)
        if restarts > STORE_RESTART_LIMIT:
            return f"rendezvous store exited {restarts} times; see {exited.outcome.log}"
        deploy = self.rendered.store
        assert deploy is not None  # noqa: S101 - a store pod ran, so the rendering has one
        pod_spec = deploy["spec"]["template"]["spec"]
        name = f"{deploy['metadata']['name']}-r{restarts}"
        self._store = self._make_pod(
            name=name, index=None, pod_spec=pod_spec, annotations={}, ports=self.local_ports
        )
        self._store.start()
        return None

    def _wait_listening(self, port: int, *, timeout_s: float = 60) -> bool:
        """The readinessProbe: True once the store pod's own process listens on `port` (a connection
        alone could reach another job's process that took the port), False if the pod exits first."""
        assert self._store is not None  # noqa: S101 - called right after starting it
        end = time.time() + timeout_s
        while time.time() < end and not self._store.done.is_set():
            if self._store.proc is not None and _listens(self._store.proc.pid, port):
                return True
            # In a container the listening process is no child of ours: it carries the pod's marker.
            if any(_listens(p.pid, port) for p in marked_processes(self._store.marker)):
                return True
            time.sleep(0.1)
        return False

    def _start_pod(self, index: int) -> None:
        attempt = sum(1 for o in self.history if o.index == index)
        name = f"{self.rendered.job_name}-{index}-a{attempt}"
        pod_spec = self.rendered.job["spec"]["template"]["spec"]
        pod = self._make_pod(
            name=name,
            index=index,
            pod_spec=pod_spec,
            annotations={COMPLETION_INDEX_ANNOTATION: str(index), JOB_UID_LABEL: self.job_uid},
        )
        self.pods[index] = pod
        self.history.append(pod.outcome)
        for d in self.deletions:
            if d["index"] == index and "replacement" not in d:
                d["replacement"], d["replacement_started"] = name, pod.outcome.started
        self._emit("pod_start", pod=name, index=index)
        pod.start()

    def _make_pod(
        self,
        *,
        name: str,
        index: int | None,
        pod_spec: dict[str, Any],
        annotations: dict[str, str],
        ports: dict[int, int] | None = None,
    ) -> _Pod:
        mounts, ram_dirs = self._volume_folders(pod_spec, name=name, index=index)
        if self.api is not None:
            labels = local_node_labels(index, self.completions) if index is not None else {}
            self.api.nodes[self._node_name(index)] = labels
        marker = f"{self.run_key}/{name}"
        # The pod's /tmp, short on purpose (`check_socket_room`).
        tmp = Path(tempfile.mkdtemp(prefix=pod_tmp_prefix(self.run_key)))
        ram_dirs.append(tmp)
        containers = [
            self._container(
                c,
                pod_spec=pod_spec,
                index=index,
                annotations=annotations,
                volumes=mounts,
                marker=marker,
                tmp=tmp,
                ports=ports or {},
            )
            for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
        ]
        return _Pod(
            name=name,
            index=index,
            marker=marker,
            containers=containers,
            log=self.run_dir / "pods" / f"{name}.log",
            cwd=self.run_dir,
            ram_dirs=ram_dirs,
            on_event=self._emit,
            start=functools.partial(self.runtime.start, run_key=self.run_key),
        )

    def _volume_folders(
        self, pod_spec: dict[str, Any], *, name: str, index: int | None
    ) -> tuple[dict[str, Path | None], list[Path]]:
        """Volume name -> local folder (None: the machine's own /dev/shm), and the pod's tmpfs folders."""
        folders: dict[str, Path | None] = {}
        ram: list[Path] = []
        root = self.run_dir / "volumes"
        at_dev_shm = {
            m["name"]
            for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
            for m in c.get("volumeMounts", [])
            if m["mountPath"].rstrip("/") == "/dev/shm"  # noqa: S108 - a mount path we compare, not a file
        }
        for vol in pod_spec.get("volumes", []):
            if "persistentVolumeClaim" in vol:
                path: Path | None = pvc_folder(self.run_dir, vol["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in vol:
                path = root / self._node_name(index) / vol["hostPath"]["path"].strip("/").replace("/", "_")
            elif (vol.get("emptyDir") or {}).get("medium") == "Memory" and vol["name"] in at_dev_shm:
                path = None  # the pod's /dev/shm: the machine's own serves
            elif (vol.get("emptyDir") or {}).get("medium") == "Memory":
                path = self.shm_dir / name / vol["name"]
                ram.append(path)
            else:
                path = root / f"pod-{name}" / vol["name"]
            if path is not None:
                path.mkdir(parents=True, exist_ok=True)
            if "projected" in vol and path is not None:
                self._project(vol, path)
            folders[vol["name"]] = path
        return folders, ram

    def _project(self, volume: dict[str, Any], folder: Path) -> None:
        """A projected volume, as the kubelet writes it: the API server's token and the cluster's CA."""
        for source in volume["projected"].get("sources", []):
            token = source.get("serviceAccountToken")
            config_map = source.get("configMap") or {}
            if token is not None and self.api is not None:
                (folder / token["path"]).write_text(self.api.token)
            elif config_map.get("name") == CLUSTER_CA_CONFIG_MAP and self.api is not None:
                for item in config_map.get("items") or [{"key": "ca.crt", "path": "ca.crt"}]:
                    (folder / item["path"]).write_bytes(self.api.ca_pem)
            else:
                raise UserError(
                    f"volume {volume['name']}: the local executor projects only a service account token "
                    f"and the {CLUSTER_CA_CONFIG_MAP} ConfigMap, not {sorted(source)}"
                )

    def _base_env(self, spec: dict[str, Any], *, index: int | None, marker: str, tmp: Path) -> dict[str, str]:
        """What every container gets before its own env: this machine's, the pod's, the kubelet's."""
        env = dict(os.environ)
        env["PATH"] = f"{self.venv_bin}{os.pathsep}{env.get('PATH', '')}"
        env["TMPDIR"] = str(tmp)
        hostname = f"{self.rendered.job_name}-{index}" if index is not None else spec["name"]
        env |= {"HOSTNAME": hostname, CHAOS_ENV: str(self.chaos_dir)}
        if index is not None:
            env["JOB_COMPLETION_INDEX"] = str(index)
        if self.api is not None:  # as the kubelet gives every container the API's address
            env |= {"KUBERNETES_SERVICE_HOST": LOOPBACK, "KUBERNETES_SERVICE_PORT": str(self.api.port)}
        env |= self.extra_env
        env[POD_ENV] = marker
        return env

    def _container(
        self,
        spec: dict[str, Any],
        *,
        pod_spec: dict[str, Any],
        index: int | None,
        annotations: dict[str, str],
        volumes: dict[str, Path | None],
        marker: str,
        tmp: Path,
        ports: dict[int, int],
    ) -> _Container:
        env = self._base_env(spec, index=index, marker=marker, tmp=tmp)
        declared: dict[str, str] = {}
        for var in spec.get("env", []):
            if "value" in var:
                declared[var["name"]] = _expand(var["value"], declared | env)
            elif "fieldRef" in var.get("valueFrom", {}):
                declared[var["name"]] = self._field_ref(
                    var["valueFrom"]["fieldRef"]["fieldPath"], annotations, index, node=self._node_name(index)
                )
            elif "secretKeyRef" in var.get("valueFrom", {}):
                ref = var["valueFrom"]["secretKeyRef"]
                raise UserError(
                    f"env {var['name']} reads Secret {ref['name']}; the local executor has no Secrets: "
                    "drop secret_env for local runs"
                )
        env |= declared
        path_map = sorted(
            ((m["mountPath"], volumes.get(m["name"])) for m in spec.get("volumeMounts", [])),
            key=lambda item: -len(item[0]),
        )

        def local(text: str) -> str:
            text = self._names.rewrite(_expand(text, env))
            for mount, folder in path_map:
                if folder is not None:
                    # A whole path or one inside a value (a script's NVRX_EKS_CONFIG is JSON): the mount
                    # path, then anything but more of a name.
                    text = re.sub(rf"(?<![\w/]){re.escape(mount)}(?![\w.-])", str(folder), text)
            for declared, port in ports.items():  # this pod's own ports (the store's), as whole tokens
                text = re.sub(rf"(?<![\w.]){declared}(?![\w.])", str(port), text)
            return text

        argv = [local(a) for a in [*spec.get("command", []), *spec.get("args", [])]]
        env |= {k: local(v) for k, v in declared.items()}
        mounted = [folder for _, folder in path_map if folder is not None]
        where = ContainerSpec(
            container=spec,
            pod_spec=pod_spec,
            store=index is None,
            folders=[*mounted, self.chaos_dir],
            run_key=self.run_key,
        )
        argv, env = self.runtime.command(argv, env, where)
        return _Container(name=spec["name"], argv=argv, env=env)

    def _node_name(self, index: int | None) -> str:
        """The local node pod `index` runs on: a deleted node's replacement is a new node."""
        return "node-system" if index is None else f"node-{index}-{self.generation.get(index, 0)}"

    @staticmethod
    def _field_ref(path: str, annotations: dict[str, str], index: int | None, *, node: str = "") -> str:
        """`node`: the name of the local node the pod runs on (`_node_name`)."""
        if path == "status.podIP":  # the "node's" loopback address, as its headless DNS name maps
            return SYSTEM_ADDRESS if index is None else node_address(index)
        if path == "spec.nodeName":
            return node
        match = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
        if match and match.group(2) in annotations:
            return annotations[match.group(2)]
        if match and match.group(1) == "labels":
            # A label the pod lacks reads as empty, as the kubelet gives it: a local node has no zone
            # to copy onto its pods (its network nodes come through the API: `local_node_labels`).
            return ""
        raise UserError(f"fieldRef {path} is not supported by the local executor")

    # ---- bookkeeping ------------------------------------------------------------------------
    def _emit(self, kind: str, **fields: object) -> None:
        with self._emit_lock, self._events.open("a") as f:  # pod threads emit too
            f.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")

    def _result(self, *, succeeded: bool, reason: str) -> JobResult:
        self._emit("job_end", succeeded=succeeded, reason=reason)
        return JobResult(
            succeeded=succeeded,
            reason=reason,
            wall_s=time.time() - self._t0,
            pods=self.history,
            deletions=self.deletions,
            run_dir=str(self.run_dir),
            run_key=self.run_key,
            ports={svc: self.local_ports.get(port, port) for svc, port in self._names.service_ports.items()},
            user_error=not succeeded and self._user_error,
        )

    def _shutdown(self) -> None:
        for pod in self.pods.values():
            if not pod.done.is_set():
                pod.kill(deleted=False)
        if self._store is not None and self._store.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._store.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._store.proc.wait(timeout=10)
            self._store.kill(deleted=False)
            self.history.insert(0, self._store.outcome)
        self.history[:0] = self._ended_stores
        self.runtime.close(self.run_key)
        kill_pod_processes(self.run_key)  # belt and braces: nothing of this run survives it
        if self.api is not None:
            self.api.close()
        for held in self._port_holds:
            held.release()
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # only when no other run uses it
            LOCAL_SHM_ROOT.rmdir()


def run_local(
    dist_dir: Path,
    *,
    run_dir: Path,
    deletions: list[NodeDeletion] | tuple[NodeDeletion, ...] = (),
    chaos_dir: Path | None = None,
    timeout_s: float = 600.0,
    extra_env: dict[str, str] | None = None,
    ports: dict[int, int] | None = None,
    echo: Callable[[str], None] | None = None,
    node_provision_s: float = 0.0,
    runtime: Runtime | None = None,
) -> JobResult:
    """Run a rendered job folder to the end; delete nodes on schedule or on chaos-dir request.

    Writes `<run_dir>/job.json` (this result) and returns it. Every process is gone when it returns.
    """
    job = LocalJob(
        dist_dir,
        run_dir=run_dir,
        chaos_dir=chaos_dir,
        timeout_s=timeout_s,
        extra_env=extra_env,
        ports=ports,
        echo=echo,
        node_provision_s=node_provision_s,
        runtime=runtime,
    )
    result = job.run(deletions=deletions)
    (job.run_dir / "job.json").write_text(json.dumps(asdict(result), indent=2, default=str))
    return result
