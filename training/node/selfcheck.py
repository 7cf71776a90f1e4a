"""`python -m nvrx_eks.training.node.selfcheck`: can this node train? Run first in every training pod.

Checks torch/CUDA/NCCL, the GPU count against the instance profile, EFA devices and that NCCL will
take the aws-ofi-nccl plugin (not TCP sockets: the library is loaded as NCCL loads it, so a missing
dependency is named here), the memlock limit EFA needs, the environment the job chart sets, NVRx at the
version the image was built with, /dev/shm, and that the job's checkpointer can start here: its
implementation imported and each of its tiers created and written where the ranks will write it, as
the trainer's user (training/checkpoint/factory.py `probe_checkpointer`; its probes are removed). The
job's configuration is the JSON a script's ranks read from $NVRX_EKS_CONFIG, or `--config` (the chart
passes the reference trainer's run folder and checkpoint section that way: its ranks get flags). No
checkpointer falls back to another, so a rank would fail on such a tier too, but only after the
launcher and the rendezvous, and again at every restart: here the pod fails first, with one message
naming the tier, its path or URL, the cause and the fix.
Prints one table, then one verdict line (the pod's termination message), and exits:

- 0  the node can train (warnings are printed, not fatal);
- 2  configuration or image problem (wrong image, missing env, plugin absent or not loadable, the
     memlock limit the node group's launch template gives every node, /dev/shm too small, a
     checkpoint tier of the pod or shared by all pods unusable): every pod would fail the same way,
     so the Job should fail at once;
- 75 node problem (GPUs or EFA devices missing, driver unusable, the node's own checkpoint disk not
     writable): another node may well succeed, so the Job's podFailurePolicy can treat it like a
     disruption. 75 is EX_TEMPFAIL in sysexits.h ("try again later"), distinct from the trainer's
     codes and from NVRx's no-restart code (93). Nothing a healthy node of a correct configuration
     would fail is a node problem; the node check (nodecheck.py) runs the same node checks on every
     GPU node before it takes work.

On a CPU profile (`local-cpu`, no CUDA) it reports CPU mode and checks only what applies there.
All device roots (/sys, /dev, /dev/shm) and the torch probe are injectable (tests fake them).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, exit_with
from nvrx_eks.kitcore.console import make_console
from nvrx_eks.kitcore.pins import IMAGE
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile
from nvrx_eks.training.node import repeats
from nvrx_eks.training.node.topology import NODE_NAME_ENV
from nvrx_eks.training.resilience.config import CONFIG_ENV, config_from_json

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from nvrx_eks.training.checkpoint.config import CheckpointConfig

NODE_PROBLEM_EXIT_CODE = 75
CONFIG_PROBLEM_EXIT_CODE = USER_ERROR_EXIT_CODE

PROFILE_ENV = "NVRX_EKS_INSTANCE_PROFILE"
"""The instance profile (kitcore/profiles.py) the job chart sets on the training container."""
IMAGE_NVRX_ENV = "NVRX_EKS_NVRX_VERSION"
"""Set by images/Dockerfile: the NVRx pin the image was built with."""

# Environment the chart must set on EFA profiles (k8s/env.py EFA_NCCL_ENV; tests/images cross-checks).
REQUIRED_EFA_ENV: dict[str, str | None] = {
    "FI_PROVIDER": "efa",  # anything else lets libfabric fall back to TCP
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
# Set by the Kubernetes Job controller on Indexed Jobs (the node rank comes from it).
REQUIRED_CLUSTER_ENV = ("JOB_COMPLETION_INDEX",)
# NVRx 0.7.0 README: NCCL 2.28.3-2.28.8 break in-process restart.
BAD_NCCL = ((2, 28, 3), (2, 28, 8))
OFI_PLUGIN_NAMES = ("libnccl-net-ofi.so", "libnccl-net.so")
SHM_GIB_PER_GPU_WORKER = 1.0
"""Data loader workers and NCCL's shared-memory transport; Docker's 64 MiB default is far too small."""
_GIB = 1 << 30
SHM = "/dev/shm"  # noqa: S108 - a check name, not a path we write to
CANNOT_TRAIN = "cannot train"
"""How the verdict line of a failed check starts (k8s/termination.py finds it in the pod's log tail)."""


class Status(Enum):
    OK = "ok"
    WARN = "warn"
    SKIP = "n/a"
    CONFIG = "FAIL (config)"
    NODE = "FAIL (node)"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True, kw_only=True)
class TorchInfo:
    version: str
    cuda: str | None
    """CUDA version torch was built with (None: CPU build)."""
    cuda_available: bool
    device_count: int
    nccl: tuple[int, ...] | None
    error: str | None = None
    """Why CUDA could not be used, when torch has CUDA but it failed to initialize."""


def probe_torch() -> TorchInfo:
    import torch  # noqa: PLC0415 - only when checking

    nccl = None
    error = None
    available = False
    count = 0
    if torch.version.cuda:
        try:
            available = torch.cuda.is_available()
            count = torch.cuda.device_count()
            nccl = tuple(torch.cuda.nccl.version())
        except (RuntimeError, AssertionError) as exc:  # driver/runtime mismatch, no driver
            error = str(exc)
    return TorchInfo(
        version=torch.__version__,
        cuda=torch.version.cuda,
        cuda_available=available,
        device_count=count,
        nccl=nccl,
        error=error,
    )


_MISSING_LIBRARY = re.compile(r"(?P<name>[\w.+-]+\.so[\w.]*): cannot open shared object file")


def load_problem(path: Path) -> str | None:
    """dlopen `path` with RTLD_NOW | RTLD_LOCAL, as NCCL loads its net plugin (every dependency and
    every symbol resolved now); None when it loads, else the dynamic loader's message."""
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return None


@dataclass(kw_only=True)
class Node:
    """What the checks look at; every path and probe can be replaced (tests, other layouts)."""

    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    shm_path: Path = Path("/dev/shm")  # noqa: S108 - measured, never written
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    torch_probe: Callable[[], TorchInfo] = probe_torch
    which: Callable[[str], str | None] = shutil.which
    memlock: Callable[[], int] = field(default=lambda: resource.getrlimit(resource.RLIMIT_MEMLOCK)[0])
    """The process's soft RLIMIT_MEMLOCK in bytes (resource.RLIM_INFINITY: unlimited)."""
    load_library: Callable[[Path], str | None] = load_problem
    """Loads a shared library as NCCL loads its net plugin; the loader's error, or None."""


def run_checks(node: Node, *, profile: InstanceProfile, checkpoint: CheckpointConfig | None) -> list[Check]:
    """Every check; `checkpoint`: the job's checkpoint configuration as its ranks build it (None: none
    given, nothing to prove)."""
    torch_info = node.torch_probe()
    gpu_mode = profile.gpus > 0
    checks = [_mode(profile, torch_info), _torch(torch_info, gpu_mode=gpu_mode)]
    checks += [_gpus(node, profile, torch_info), _nccl(torch_info, gpu_mode=gpu_mode)]
    checks += [_efa_devices(node, profile), net_plugin_check(node, profile), _fi_info(node, profile)]
    checks += [memlock_check(node, profile), _env(node, profile), _nvrx(node), _shm(node, profile)]
    return checks + _checkpointer(checkpoint)


def _mode(profile: InstanceProfile, info: TorchInfo) -> Check:
    if profile.gpus:
        return Check("mode", Status.OK, f"GPU: {profile.name} ({profile.gpus} x {profile.accelerator})")
    cuda = "CUDA build" if info.cuda else "CPU build"
    return Check(
        "mode", Status.OK, f"CPU mode: {profile.name} (torch {cuda}); GPU and EFA checks do not apply"
    )


def _torch(info: TorchInfo, *, gpu_mode: bool) -> Check:
    detail = f"torch {info.version}, CUDA {info.cuda or 'none'}"
    if gpu_mode and not info.cuda:
        return Check("torch", Status.CONFIG, f"{detail}: a CPU-only torch on a GPU profile (wrong image)")
    return Check("torch", Status.OK, detail)


def _gpus(node: Node, profile: InstanceProfile, info: TorchInfo) -> Check:
    if not profile.gpus:
        return Check("GPUs", Status.SKIP, "CPU profile")
    devices = sorted(p.name for p in node.dev_root.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    want = profile.gpus
    if info.error or not info.cuda_available:
        reason = info.error or "torch.cuda.is_available() is False"
        return Check("GPUs", Status.NODE, f"CUDA unusable ({reason}); {len(devices)} /dev/nvidiaN present")
    seen = min(len(devices), info.device_count)
    if seen < want:
        return Check(
            "GPUs",
            Status.NODE,
            f"{seen} of {want} GPUs usable ({len(devices)} device files, torch sees {info.device_count}): "
            "a GPU is missing or fell off the bus",
        )
    return Check("GPUs", Status.OK, f"{info.device_count} of {want} ({profile.accelerator})")


def _nccl(info: TorchInfo, *, gpu_mode: bool) -> Check:
    if not gpu_mode:
        return Check("NCCL", Status.SKIP, "CPU profile (gloo)")
    if info.nccl is None:
        return Check("NCCL", Status.CONFIG, "torch has no NCCL")
    version = ".".join(map(str, info.nccl))
    low, high = BAD_NCCL
    if low <= info.nccl[:3] <= high:
        return Check(
            "NCCL",
            Status.CONFIG,
            f"{version} is in {'.'.join(map(str, low))}-{'.'.join(map(str, high))}, which NVRx "
            f"{IMAGE.nvrx_version} excludes (in-process restart issue): use another base image",
        )
    return Check("NCCL", Status.OK, version)


def efa_devices(sys_root: Path) -> list[str]:
    """RDMA devices bound to the `efa` driver (sysfs), or all of them where the driver link is absent."""
    root = sys_root / "class" / "infiniband"
    found = []
    for dev in sorted(root.glob("*")) if root.is_dir() else []:
        driver = dev / "device" / "driver"
        if not driver.exists() or driver.resolve().name == "efa":
            found.append(dev.name)
    return found


def _efa_devices(node: Node, profile: InstanceProfile) -> Check:
    if not profile.efa_devices:
        return Check("EFA devices", Status.SKIP, f"{profile.name} has no EFA")
    found = efa_devices(node.sys_root)
    verbs = sorted((node.dev_root / "infiniband").glob("uverbs*"))
    have = min(len(found), len(verbs))
    if have < profile.efa_devices:
        return Check(
            "EFA devices",
            Status.NODE,
            f"{len(found)} in sysfs, {len(verbs)} uverbs device files; the pod requested "
            f"{profile.efa_devices} (vpc.amazonaws.com/efa): EFA device plugin or interface missing",
        )
    return Check("EFA devices", Status.OK, f"{have} of {profile.efa_devices} ({', '.join(found[:3])}...)")


def ofi_plugin_path(env: Mapping[str, str]) -> Path | None:
    """The aws-ofi-nccl library NCCL will load: NCCL_NET_PLUGIN as a path, else the library path."""
    named = env.get("NCCL_NET_PLUGIN", "")
    if "/" in named:
        return Path(named) if Path(named).is_file() else None
    names = (f"libnccl-net-{named}.so",) if named else OFI_PLUGIN_NAMES
    for directory in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        for name in names:
            if (Path(directory) / name).is_file():
                return Path(directory) / name
    return None


def net_plugin_check(node: Node, profile: InstanceProfile) -> Check:
    if not profile.efa_devices:
        return Check("NCCL net plugin", Status.SKIP, "no EFA: NCCL uses its socket transport")
    env = node.env
    if env.get("NCCL_NET", "").lower() == "socket" or env.get("NCCL_NET_PLUGIN", "").lower() == "none":
        return Check(
            "NCCL net plugin", Status.CONFIG, "NCCL_NET=Socket / NCCL_NET_PLUGIN=none forces TCP sockets"
        )
    path = ofi_plugin_path(env)
    if path is None:
        return Check(
            "NCCL net plugin",
            Status.CONFIG,
            f"aws-ofi-nccl not found (NCCL_NET_PLUGIN={env.get('NCCL_NET_PLUGIN', '')!r}, searched "
            "LD_LIBRARY_PATH): NCCL would fall back to TCP sockets; rebuild the image",
        )
    problem = node.load_library(path)
    if problem is not None:
        # NCCL logs one warning and falls back to TCP sockets: the job would run, at a fraction of its
        # speed. A missing dependency (libfabric, libhwloc) is the image's: name it.
        missing = _MISSING_LIBRARY.search(problem)
        cause = f"it needs {missing['name']}, which the image lacks" if missing else problem
        return Check(
            "NCCL net plugin",
            Status.CONFIG,
            f"{path} does not load ({cause}): NCCL would fall back to TCP sockets; install the plugin's "
            "runtime libraries in the image (images/Dockerfile) and rebuild it",
        )
    return Check("NCCL net plugin", Status.OK, f"{path} (loads)")


def _fi_info(node: Node, profile: InstanceProfile) -> Check:
    if not profile.efa_devices:
        return Check("libfabric efa", Status.SKIP, "no EFA")
    tool = node.which("fi_info")
    if tool is None:
        return Check(
            "libfabric efa", Status.CONFIG, "fi_info not found: EFA userspace (libfabric) not installed"
        )
    try:
        done = subprocess.run(
            [tool, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        return Check("libfabric efa", Status.NODE, "fi_info -p efa timed out after 20 s")
    if done.returncode:
        return Check(
            "libfabric efa", Status.NODE, f"fi_info -p efa found no EFA endpoint: {done.stderr.strip()[:200]}"
        )
    return Check("libfabric efa", Status.OK, "fi_info -p efa -t FI_EP_RDM: provider available")


def _env(node: Node, profile: InstanceProfile) -> Check:
    problems = []
    if profile.is_ec2:
        problems += [f"{k} unset" for k in REQUIRED_CLUSTER_ENV if k not in node.env]
    if profile.efa_devices:
        for key, want in REQUIRED_EFA_ENV.items():
            have = node.env.get(key)
            if have is None or (want is not None and have != want):
                problems.append(f"{key}={have!r} (want {want!r})")
    if problems:
        return Check("environment", Status.CONFIG, "; ".join(problems))
    return Check("environment", Status.OK, "required variables set" if profile.is_ec2 else "local run")


def _nvrx(node: Node) -> Check:
    try:
        installed = metadata.version("nvidia-resiliency-ext")
        import nvidia_resiliency_ext.fault_tolerance  # noqa: F401, PLC0415 - importable is the check
    except (metadata.PackageNotFoundError, ImportError) as exc:
        return Check("NVRx", Status.CONFIG, f"not importable: {exc}")
    expected = node.env.get(IMAGE_NVRX_ENV)
    if expected and installed != expected:
        return Check("NVRx", Status.CONFIG, f"{installed} installed, the image was built for {expected}")
    if not expected and installed != IMAGE.nvrx_version:
        return Check(
            "NVRx", Status.WARN, f"{installed} (this virtualenv; the image pins {IMAGE.nvrx_version})"
        )
    # The straggler detector's compiled CUPTI extension ships in the cp312 wheel only (the image);
    # nothing in the kit uses it (training/resilience/nvrx_compat.py), so its absence is a note, not a
    # problem.
    from nvrx_eks.training.resilience.nvrx_compat import straggler_extension_available  # noqa: PLC0415

    extension = "" if straggler_extension_available() else " (no CUPTI straggler extension: GPU images only)"
    return Check("NVRx", Status.OK, f"{installed}{extension}")


def memlock_check(node: Node, profile: InstanceProfile) -> Check:
    """EFA registers the memory NCCL and libfabric send from, bounded by RLIMIT_MEMLOCK: the trainer
    holds no CAP_IPC_LOCK, so a limit below the node's memory fails NCCL's setup on every rank of
    the node. The limit comes from the node's container runtime, which the GPU node group's launch
    template configures (its NodeConfig's containerd base runtime spec) alike for every node of the
    group: a small one is the configuration's, and a replacement pod on another node would meet it
    again. So it fails the job, naming the fix, instead of being retried node after node."""
    name = "memlock limit"
    if not profile.efa_devices:
        return Check(name, Status.SKIP, "no EFA")
    limit = node.memlock()
    if limit == resource.RLIM_INFINITY:
        return Check(name, Status.OK, "unlimited")
    need = profile.memory_gib * _GIB
    if limit < need:
        return Check(
            name,
            Status.CONFIG,
            f"{limit} bytes, below the node's {profile.memory_gib} GiB: EFA memory registration would "
            "fail; the GPU node group's launch template sets it for every node (its NodeConfig's "
            "containerd.baseRuntimeSpec, infra/constructs/launch_template.py): run the group on the "
            "stack's launch template",
        )
    return Check(name, Status.OK, f"{limit / _GIB:,.0f} GiB")


def _shm(node: Node, profile: InstanceProfile) -> Check:
    try:
        stat = os.statvfs(node.shm_path)
    except OSError as exc:
        return Check(SHM, Status.CONFIG, f"{node.shm_path}: {exc}")
    size = stat.f_blocks * stat.f_frsize / _GIB
    need = SHM_GIB_PER_GPU_WORKER * profile.gpus
    detail = f"{size:.1f} GiB"
    if size < need:
        return Check(
            SHM,
            Status.CONFIG,
            f"{detail}, need >= {need:g} GiB for {profile.gpus} workers (emptyDir Memory)",
        )
    return Check(SHM, Status.OK, detail)


def _checkpointer(config: CheckpointConfig | None) -> list[Check]:
    """The job's checkpointer, started as far as it can be without a rank: a failed tier on the node's
    own disk is the node's problem, any other (the implementation, the pod's memory folder, a shared
    tier) every pod's."""
    if config is None:
        return [Check("checkpointer", Status.WARN, f"no job configuration (--config or ${CONFIG_ENV})")]
    from nvrx_eks.training.checkpoint.factory import probe_checkpointer  # noqa: PLC0415 - imports torch

    def status(ok: bool, node_local: bool) -> Status:
        return Status.OK if ok else Status.NODE if node_local else Status.CONFIG

    return [
        Check(f"checkpoint {p.tier}", status(p.ok, p.node_local), f"{p.location}: {p.detail}")
        for p in probe_checkpointer(config)
    ]


def compare_with_other_nodes(
    checks: Sequence[Check],
    *,
    store_endpoint: str | None,
    node_name: str | None,
    connect: Callable[[str], repeats.Store] = repeats.connect,
) -> list[Check]:
    """`checks`, with a node problem that another node reported too (since any pod last passed) made a
    configuration problem naming both nodes (training/node/repeats.py); a pass is recorded. Without the
    job's store (a local run of the check, the store not reachable) the checks stand as they are."""
    code = exit_code(checks)
    if store_endpoint is None or node_name is None or code == CONFIG_PROBLEM_EXIT_CODE:
        return list(checks)
    try:
        store = connect(store_endpoint)
        if code == 0:
            repeats.record_pass(store)
            return list(checks)
        failed = [c.name for c in checks if c.status is Status.NODE]
        elsewhere = repeats.record_failures(store, node=node_name, checks=failed)
    except (RuntimeError, OSError, ValueError) as exc:  # TCPStore's errors are RuntimeErrors
        note = f"the rendezvous store {store_endpoint} was not reached ({exc}): compared with no other node"
        return [*checks, Check("other nodes", Status.WARN, note[:300])]
    return [
        replace(
            c,
            status=Status.CONFIG,
            detail=(
                f"{c.detail}; the same on node {', '.join(elsewhere[c.name])} (this one: {node_name}): a "
                "node problem on every node is the configuration's (the node image, its driver, the "
                "device plugins, the image's CUDA)"
            ),
        )
        if elsewhere.get(c.name)
        else c
        for c in checks
    ]


def exit_code(checks: Sequence[Check]) -> int:
    """2 if any configuration problem (every pod would fail alike), else 75 for a node problem, else 0."""
    statuses = {c.status for c in checks}
    if Status.CONFIG in statuses:
        return CONFIG_PROBLEM_EXIT_CODE
    if Status.NODE in statuses:
        return NODE_PROBLEM_EXIT_CODE
    return 0


def render(checks: Sequence[Check], *, profile: InstanceProfile) -> None:
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    colour = {
        Status.OK: "green",
        Status.WARN: "yellow",
        Status.SKIP: "dim",
        Status.CONFIG: "red",
        Status.NODE: "red",
    }
    table = Table(title=f"nvrx-eks self-check ({profile.name})", title_justify="left")
    for column in ("check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(escape(c.name), f"[{colour[c.status]}]{c.status.value}[/]", escape(c.detail))
    console = make_console()
    console.print(table)
    code = exit_code(checks)
    failed = [c for c in checks if c.status in {Status.CONFIG, Status.NODE}]
    if not failed:
        console.print("[green]node can train[/]")
        return
    kind = "configuration/image problem" if code == CONFIG_PROBLEM_EXIT_CODE else "node problem"
    reasons = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    # One line however long: the pod's termination message is the log's tail (FallbackToLogsOnError).
    console.print(f"[red]{CANNOT_TRAIN} ({kind}, exit {code}):[/] {escape(reasons)}", soft_wrap=True)


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m nvrx_eks.training.node.selfcheck",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Exit codes: 0 can train; 2 configuration/image problem; 75 node problem.",
    )
    parser.add_argument(
        "--profile",
        default=env.get(PROFILE_ENV),
        help=f"instance profile (kitcore/profiles.py); default ${PROFILE_ENV}, else local-cpu",
    )
    parser.add_argument(
        "--store",
        metavar="HOST:PORT",
        help="the job's rendezvous store: a node problem another node reported too fails the job as "
        f"configuration (with ${NODE_NAME_ENV}, this node's name)",
    )
    parser.add_argument(
        "--config",
        metavar="JSON",
        help="the job's resilience configuration (a JSON object, as a script's ranks read it), whose "
        f"checkpointer must start here; default ${CONFIG_ENV}",
    )
    return parser.parse_args(argv)


def checkpoint_config(args: argparse.Namespace, env: Mapping[str, str]) -> CheckpointConfig | None:
    """The checkpoint configuration the job's ranks build their checkpointer from: `--config`, else
    $NVRX_EKS_CONFIG (None: neither given)."""
    source, text = ("--config", args.config) if args.config else (CONFIG_ENV, env.get(CONFIG_ENV))
    return config_from_json(text, source=source).effective_checkpoint() if text else None


def main(argv: Sequence[str] | None = None, *, node: Node | None = None) -> int:
    node = node or Node()
    args = parse_args(argv, node.env)
    profile = get_profile(args.profile or "local-cpu")
    checks = run_checks(node, profile=profile, checkpoint=checkpoint_config(args, node.env))
    checks = compare_with_other_nodes(
        checks, store_endpoint=args.store, node_name=node.env.get(NODE_NAME_ENV)
    )
    render(checks, profile=profile)
    return exit_code(checks)


if __name__ == "__main__":
    exit_with(main)
