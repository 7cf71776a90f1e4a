"""How the local executor runs a pod's container: as a process (the default), as a fork of a warm
interpreter (`warm`: the test suite's), or in podman.

One interface: `Runtime.command`, given the container's command line and environment as the executor
prepared them (names on loopback, volumes as local folders, `$(VAR)` expanded), returns what to
start, and `Runtime.start` starts it. Everything else (the Job controller, node deletion, the store's
restarts, the chaos contract) is the executor's and the same for all three.

`WarmProcesses` is `Processes` whose `python -m` containers fork from one interpreter per process that
imported torch and the kit (localrun/warm.py says what that keeps and what it changes): a pod starts
in a fraction of the CPU time. The test suite runs its local jobs so (`RUNTIME_ENV`); a pod's start-up
time is then not a cluster's, so `nvrx-eks local run` and the demo start fresh interpreters unless
asked.

`Podman` runs the same command line in a container of the rendered image, as the pod would: the
container's uid, a read-only root filesystem (without podman's own tmpfs at /tmp), no capabilities, no
privilege escalation, the runtime's default seccomp filter. It shares the machine's network (the
executor's loopback names and ports then mean the same inside) and mounts each of the pod's folders at
its own path (the executor's path rewriting then holds too). /dev/shm is the container's own, as a pod's
is (the memory tier's folders, which the executor keeps under the machine's /dev/shm, are mounted into
it at their paths): when a container's first process dies, the kernel kills the rest of its PID
namespace at once, multiprocessing's resource trackers with it, and the POSIX semaphores they would have
unlinked stay in that /dev/shm; the machine's would keep them. Only the environment the pod declares and
the executor adds goes in, never this machine's. The container's processes carry the pod's marker like
processes do, so the executor finds and kills them the same way (a node deletion, the pod's end).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.localrun.warm import (
    WarmStarter,
    end_process_forks,
    process_starter,
    server_environment,
    warm_entry,
)
from nvrx_eks.training.resilience.launch import FORKSERVER_FORK_ENV

RUNC = "/usr/sbin/runc"
# Podman's default runtime (crun) and its default container rlimits both fail on Debian 12 machines of
# this kind: runc and explicit limits work.
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
RUN_LABEL = "io.nvrx-eks.local-run"


POD_ENV = "NVRX_EKS_LOCAL_POD"
"""The environment variable every process of a local pod carries: `<run-key>/<pod>`."""

WARM_SERVER_POD = "_warm-server"
"""The warm server's marker: no `<run-key>/<pod>`, so no run's (it serves every run of its process)."""

RUNTIME_ENV = "NVRX_EKS_LOCAL_RUNTIME"
"""The runtime a local run uses when none is named (`processes` or `warm`; unset: `processes`)."""

Started = tuple[list[str], dict[str, str]]
"""A container's start: the command line and the environment to run it with."""


class Running(Protocol):
    """A started container: the part of `subprocess.Popen` the executor uses."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass(frozen=True)
class ContainerSpec:
    """One container of a rendered pod, as a runtime starts it."""

    container: dict[str, Any]
    pod_spec: dict[str, Any] = field(default_factory=dict)
    store: bool = False
    """The rendezvous store's pod (its own image), not the Job's."""
    folders: list[Path] = field(default_factory=list)
    """The local folders behind the pod's volumes."""
    run_key: str = ""
    """Marks what the run started, so that its end removes it all."""


class Runtime(Protocol):
    @property
    def name(self) -> str:
        """How the command line names it (`--runtime`)."""
        ...

    def command(
        self, argv: list[str], env: dict[str, str], spec: ContainerSpec
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that start `spec`'s container."""
        ...

    def start(
        self, argv: list[str], env: dict[str, str], *, cwd: Path, log: IO[bytes], run_key: str
    ) -> Running:
        """Start what `command` returned, its output to `log`, in a session of its own."""
        ...

    def close(self, run_key: str) -> None:
        """Remove what the run left (nothing for processes)."""
        ...


def popen(argv: list[str], env: dict[str, str], *, cwd: Path, log: IO[bytes]) -> Running:
    """A container as a new process, in its own session."""
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


@dataclass(frozen=True)
class Processes:
    """The container's command as a local process with this virtualenv (`image: local`), and the
    project `nvrx-eks` runs in on its Python path: a script of your own (the job values' `entrypoint`)
    is found there as an image built on the kit's finds it in its working folder."""

    name: str = "processes"
    project_dir: Path = field(default_factory=lambda: Path.cwd().resolve())

    def command(
        self, argv: list[str], env: dict[str, str], spec: ContainerSpec
    ) -> tuple[list[str], dict[str, str]]:
        del spec  # the process is the container, whatever it declares
        path = os.pathsep.join(p for p in (str(self.project_dir), env.get("PYTHONPATH")) if p)
        return argv, {**env, "PYTHONPATH": path}

    def start(
        self, argv: list[str], env: dict[str, str], *, cwd: Path, log: IO[bytes], run_key: str
    ) -> Running:
        del run_key
        return popen(argv, env, cwd=cwd, log=log)

    def close(self, run_key: str) -> None:
        del run_key


def warm_server() -> WarmStarter:
    """This process's warm server (localrun/warm.py `process_starter`), which the warm runtime's pods and
    the test suite's children fork from. One server for every run of the process; it belongs to none,
    so its marker names no run and a run's search never finds it. Its forks write their own pod's
    marker over it (warm.py)."""
    return process_starter(server_environment(dict(os.environ), marker_env=POD_ENV, marker=WARM_SERVER_POD))


@dataclass(frozen=True)
class WarmProcesses(Processes):
    """`Processes` whose `python -m` containers fork from this process's warm interpreter
    (localrun/warm.py); any other command starts as a process."""

    name: str = "warm"

    def start(
        self, argv: list[str], env: dict[str, str], *, cwd: Path, log: IO[bytes], run_key: str
    ) -> Running:
        found = warm_entry(argv, env)
        if found is None:
            return popen(argv, env, cwd=cwd, log=log)
        starter = warm_server()
        entry, args = found
        # Each fork writes its pod's marker into its /proc environ, so what the launcher forks without
        # an exec is its pod's too: the launcher may fork its forkserver (training/resilience/launch.py).
        env = env | {FORKSERVER_FORK_ENV: "1"}
        marker = env.get(POD_ENV, "")
        del run_key  # the pod's marker begins with it
        return starter.start(
            entry, args, env=env, cwd=cwd, log=log, marker=marker, marker_env=POD_ENV if marker else None
        )

    def close(self, run_key: str) -> None:
        end_process_forks(run_key)


@dataclass(frozen=True)
class Podman:
    """Each container in podman, from `trainer_image` (the Job's pods) or `store_image` (the store's)."""

    trainer_image: str
    store_image: str
    name: str = "podman"

    def command(
        self, argv: list[str], env: dict[str, str], spec: ContainerSpec
    ) -> tuple[list[str], dict[str, str]]:
        pod, container = spec.pod_spec, spec.container
        security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        run = ["podman", "--runtime", RUNC, "run", "--rm", *ULIMITS, "--network", "host"]
        run += ["--label", f"{RUN_LABEL}={spec.run_key}", "--workdir", "/tmp"]  # noqa: S108 - the pod's own /tmp
        uid = security.get("runAsUser")
        if uid is not None:
            run += ["--user", f"{uid}:{security.get('runAsGroup', uid)}"]
        if security.get("readOnlyRootFilesystem"):
            run += ["--read-only", "--read-only-tmpfs=false"]
        for cap in security.get("capabilities", {}).get("drop", []):
            run += ["--cap-drop", cap]
        if security.get("allowPrivilegeEscalation") is False:
            run += ["--security-opt", "no-new-privileges"]
        # Only what the pod declares and the executor adds; the image keeps its own PATH and HOME
        # becomes the pod's temporary folder (its /tmp), as the chart sets it for a real image.
        inner = {k: v for k, v in env.items() if os.environ.get(k) != v and k != "PATH"}
        inner.setdefault("HOME", env.get("TMPDIR", "/tmp"))  # noqa: S108 - the pod's own /tmp
        for key, value in sorted(inner.items()):
            run += ["--env", f"{key}={value}"]
        mounts = sorted({*spec.folders, Path(inner["TMPDIR"])} if "TMPDIR" in inner else set(spec.folders))
        for folder in mounts:
            _hand_over(folder, uid)
            run += ["--volume", f"{folder}:{folder}:rw"]
        run += ["--shm-size", _shm_size(spec.pod_spec)]
        image = self.store_image if spec.store else self.trainer_image
        return [*run, image, *argv], dict(os.environ)

    def start(
        self, argv: list[str], env: dict[str, str], *, cwd: Path, log: IO[bytes], run_key: str
    ) -> Running:
        del run_key  # its containers carry the run's label (`command`)
        return popen(argv, env, cwd=cwd, log=log)

    def close(self, run_key: str) -> None:
        listed = subprocess.run(
            ["podman", "ps", "--all", "--quiet", "--filter", f"label={RUN_LABEL}={run_key}"],
            capture_output=True,
            text=True,
            check=False,
        )
        ids = listed.stdout.split()
        if ids:
            subprocess.run(["podman", "rm", "--force", *ids], capture_output=True, check=False)


def _shm_size(pod_spec: dict[str, Any]) -> str:
    """The container's own /dev/shm: the size limit of the pod's Memory emptyDir mounted there."""
    mounted = {
        m["name"]
        for c in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]
        for m in c.get("volumeMounts", [])
        if m["mountPath"].rstrip("/") == "/dev/shm"  # noqa: S108 - a mount path we compare, not a file
    }
    for volume in pod_spec.get("volumes", []):
        if volume["name"] in mounted and (volume.get("emptyDir") or {}).get("sizeLimit"):
            return str(volume["emptyDir"]["sizeLimit"]).replace("Gi", "g").replace("Mi", "m")
    return "64m"  # podman's default, and a pod's without a shm volume


def _hand_over(folder: Path, uid: int | None) -> None:
    """The pod's own-dirs init container, for a local folder: the container's user owns it."""
    folder.mkdir(parents=True, exist_ok=True)
    if uid is not None and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(folder, int(uid), int(uid))


RUNTIME_NAMES = ("processes", "warm", "podman")


def runtime_named(name: str | None, *, image: str = "", store_image: str = "") -> Runtime:
    """The runtime called `name` (None: `RUNTIME_ENV`'s, else `processes`); an unknown name is a
    UserError naming the choices. `image`, `store_image`: podman's."""
    name = name or os.environ.get(RUNTIME_ENV) or "processes"
    if name == "processes":
        return Processes()
    if name == "warm":
        return WarmProcesses()
    if name == "podman":
        return Podman(trainer_image=image, store_image=store_image)
    source = "--runtime" if name != os.environ.get(RUNTIME_ENV) else RUNTIME_ENV
    raise UserError(f"{source} {name!r}: one of {', '.join(RUNTIME_NAMES)}")
