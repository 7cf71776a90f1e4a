"""Device, process group, device mesh and gradients: what an attempt gives a script to parallelize on.

The process group is created per attempt on a prefix of one long-lived store, so an in-process
restart gets a fresh group without rebinding a port; `device_mesh` builds a DeviceMesh on it (and its
sub-groups), again per attempt. A script parallelizes its model itself -- DistributedDataParallel,
FSDP2, tensor parallelism, HSDP -- and its gradients are reduced inside its backward.

`wrap` is the kit's easy path (`attempt.data_parallel`). CUDA: FSDP2 (`fully_shard` per block, then
the root). CPU: the module itself, and its gradients are averaged by `start_average_gradients` after
backward: one flat all-reduce in parameter order, waited for from Python (`wait`). Not DDP, on
purpose: DDP rebuilds its buckets in gradient-ready order after the first iteration, and gloo's ring
all-reduce sums each element in an order that depends on its position in the bucket; a restarted
attempt runs its first step with the initial buckets again, so its parameters drift from a fault-free
run in the last bits. A fixed layout every step keeps resume bit-exact (and saves DDP's construction
broadcast, which ran under the short restart-friendly timeout). A script's own DDP is exact in a
fault-free run and drifts in the last bits after a restart for the same reason: the demo's verdict
says so with the measured difference.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from nvrx_eks.kitcore.lines import say
from nvrx_eks.kitcore.ports import ReservedPort

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    local_world_size: int = 1

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"


def detect_world(device_choice: str) -> World:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return World(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        local_world_size=local_world_size,
    )


def base_store(world: World, timeout_s: float) -> dist.Store:
    """The process group's store: the launcher agent's (torchelastic) or one hosted by rank 0.

    Without a launcher and without MASTER_PORT, a single process binds a port the kernel picks (port
    0), so that two standalone trainers (or one beside a local job) never collide, and says which;
    several ranks started by hand need the port they agreed on (torch's MASTER_PORT convention, 29500).
    """
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    pick = "MASTER_PORT" not in os.environ and world.world_size == 1 and not agent_store
    is_master = world.rank == 0 and not agent_store
    port = 0 if pick else int(os.environ.get("MASTER_PORT", "29500"))
    timeout = timedelta(seconds=max(timeout_s, 30.0))
    if not is_master and not agent_store:  # the agent's store listens before any worker starts
        wait_until_listening(os.environ["MASTER_ADDR"], port, timeout.total_seconds())
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        port,
        world.world_size,
        is_master=is_master,
        timeout=timeout,
        wait_for_workers=False,
    )
    if pick:
        os.environ["MASTER_PORT"] = str(store.port)
        say(f"process group store on {os.environ['MASTER_ADDR']}:{store.port} (a free port)")
    if agent_store:
        # The agent's store outlives a restart of the workers: scope keys to this round, as torch's
        # own env:// rendezvous does.
        return dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    return store


def preload() -> None:
    """Import what torch would otherwise import lazily inside the first attempt, once per process,
    before the process group and the in-process wrapper exist.

    Constructing an optimizer (torch._disable_dynamo) or DDP imports torch._dynamo on first use,
    seconds of CPU on a loaded machine. Inside an attempt that import (1) would run under the short
    gloo timeout, so faster peers' first collective times out, and (2) can be interrupted by the
    in-process wrapper's asynchronous RankShouldRestart: the interrupted import leaves a
    half-initialised `torch._dynamo` in sys.modules (every later attempt fails with "module
    'torch._dynamo' has no attribute 'utils'") or crashes the worker with SIGSEGV.
    """
    # What a checkpoint and a script's own parallelism import on first use: DCP, its state-dict API,
    # DTensor, FSDP2, tensor parallelism, the device mesh; and what torch.save/torch.load of an object
    # pull in (their serialization helpers and the latin-1 codec numpy's RNG state is pickled with).
    import encodings.latin_1  # noqa: F401, PLC0415

    import torch._dynamo  # noqa: PLC0415
    import torch.distributed.checkpoint  # noqa: PLC0415
    import torch.distributed.checkpoint.state_dict  # noqa: PLC0415
    import torch.distributed.device_mesh  # noqa: PLC0415
    import torch.distributed.fsdp  # noqa: PLC0415
    import torch.distributed.tensor.parallel  # noqa: PLC0415
    import torch.profiler._cupti_monitor  # noqa: PLC0415
    import torch.utils.serialization  # noqa: F401, PLC0415


def shared_free_port(
    store: dist.Store, world: World, *, key: str, timeout_s: float = 300.0
) -> tuple[int, ReservedPort | None]:
    """A port free on rank 0's host, chosen by rank 0 and read by every rank from the store; on rank 0
    also its hold (kitcore/ports.py), which the caller keeps until no server will bind the port again.

    For the in-process wrapper's own TCPStore: a fixed MASTER_PORT + offset may be taken by another
    process (NVRx's TCPStore then silently connects to it as a client), and a port merely found free may
    be handed to one of the process group's own connections before the store binds it. `store` is this
    launcher round's own (`base_store`).
    """
    held = ReservedPort() if world.rank == 0 else None
    if held is not None:
        store.set(key, str(held.port))
    store.wait([key], timedelta(seconds=timeout_s))
    return int(store.get(key)), held


LISTEN_POLL_S = 0.01
"""How often a store client looks whether its host's port accepts connections yet."""


def wait_until_listening(host: str, port: int, timeout_s: float) -> None:
    """Return once `host:port` accepts a TCP connection; raise TimeoutError after `timeout_s`.

    For a TCPStore client whose host may not be listening yet. torch's client retries a refused connect only
    after a randomised backoff, many times longer than the client was early, and a restart's in-process
    store (every rank a client of rank 0's) waits for it on every launcher restart (docs/measurements.md). A
    refused connect is answered at once, so polling costs nothing; the probe's connection is closed unused,
    which the store's server takes as a client that left.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(LISTEN_POLL_S, 1.0)):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:g} s") from exc
            time.sleep(LISTEN_POLL_S)


_retired_groups: list[dist.ProcessGroup | None] = []


def retire_default_group() -> None:
    """Destroy the attempt's process groups (the default one and every group made on it: a device
    mesh's, a script's own) without waiting for a collective still in flight in them.

    Destroying a gloo group joins its worker threads, so it blocks until an in-flight collective ends:
    measured, the whole collective timeout when the peers are alive but elsewhere (as after an
    in-process restart, where every rank left its wait). Kept referenced, a group is only
    deregistered: its collective times out in gloo's own thread and nobody waits for it. One attempt's
    retired groups are kept; the ones before are released now, long after their collectives' timeout.
    """
    from torch.distributed import distributed_c10d  # noqa: PLC0415

    _retired_groups[:] = [dist.group.WORLD, *distributed_c10d._world.pg_map]  # noqa: SLF001 - the registry
    dist.destroy_process_group()


def release_retired_groups() -> None:
    """Destroy the retired groups now, before the interpreter exits: a group still alive when the
    process exits tears down running worker threads (std::terminate: "Fatal Python error: Aborted")."""
    _retired_groups.clear()


CONNECT_TIMEOUT_S = 60.0
"""How long a new process group waits for its peers to connect. gloo bounds the connection of its full
mesh by the group's timeout, and a collective timeout short enough for an in-process restart (2 s in
the local values) is shorter than the seconds between ranks that start together on a loaded machine.
A peer that dies before it connects is the launcher's to handle (its worker exits, the other nodes
restart from the rendezvous), which ends the wait first. Once connected, a group takes the collective
timeout (`_collective_timeout`)."""


def init_group(world: World, store: dist.Store, *, attempt: int, timeout_s: float) -> None:
    if dist.is_initialized():
        retire_default_group()
    dist.init_process_group(
        world.backend,
        store=dist.PrefixStore(f"attempt-{attempt}", store),
        rank=world.rank,
        world_size=world.world_size,
        timeout=timedelta(seconds=max(timeout_s, CONNECT_TIMEOUT_S)),
    )
    _collective_timeout(timeout_s, None)


def _collective_timeout(timeout_s: float, group: dist.ProcessGroup | None) -> None:
    """The timeout of `group`'s collectives from now on (None: the default group), its connection made."""
    from torch.distributed.distributed_c10d import _set_pg_timeout  # noqa: PLC0415 - torch's own setter

    _set_pg_timeout(timedelta(seconds=timeout_s), group)


def store_barrier(store: dist.Store, key: str, world_size: int, timeout_s: float = 300.0) -> None:
    """Wait until `world_size` ranks arrived at `key`, on the store (no collective timeout applies)."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while not store_barrier_reached(store, key, world_size):
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {key!r}: not every rank arrived in {timeout_s} s")
        time.sleep(0.01)


def store_barrier_reached(store: dist.Store, key: str, world_size: int) -> bool:
    """Every one of `world_size` ranks has arrived at the store barrier `key` (some may still wait in it)."""
    return int(store.add(key, 0)) >= world_size


_GLOO_OPTIONS = "_Options"


def device_mesh(
    world: World, names: tuple[str, ...], sizes: tuple[int, ...], *, timeout_s: float
) -> DeviceMesh:
    """A DeviceMesh of this attempt's ranks (its sub-groups are made now: every rank calls it).

    Its sub-groups connect within `CONNECT_TIMEOUT_S`, then get the attempt's collective timeout. torch
    gives a group made after `init_process_group` the 30-minute default, not the default group's
    timeout: a tensor-parallel or FSDP collective blocked on a failed peer would then hold its rank far
    past the in-process restart and the launcher's heartbeat (gloo cannot abort a collective; its
    timeout is what ends it)."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    timeout = timedelta(seconds=max(timeout_s, CONNECT_TIMEOUT_S))
    # `_timeout` is the field torch's own mesh code reads; gloo's options class is private.
    options: Any = (
        dist.ProcessGroupNCCL.Options()
        if world.backend == "nccl"
        else getattr(dist.ProcessGroupGloo, _GLOO_OPTIONS)()
    )
    options._timeout = timeout  # noqa: SLF001
    override: dict[int | str, Any] = dict.fromkeys(names, (world.backend, options))
    mesh = init_device_mesh(world.device.type, sizes, mesh_dim_names=names, backend_override=override)
    for name in names:
        _collective_timeout(timeout_s, mesh.get_group(name))
    return mesh


def wrap(
    model: nn.Module,
    world: World,
    *,
    blocks: Iterable[nn.Module] = (),
    mp_policy: MixedPrecisionPolicy | None = None,
) -> nn.Module:
    """FSDP2 on CUDA (each of `blocks`, then the root, with `mp_policy`; sharding is in place;
    gradients reduced in backward); the module itself on CPU (gradients averaged by
    `start_average_gradients`)."""
    if world.device.type == "cuda":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: PLC0415

        policy = mp_policy or MixedPrecisionPolicy()
        for block in blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, *, norm_type: float = 2.0
) -> torch.Tensor:
    """Clip the gradients' total norm to `max_norm`, whatever holds them; returns the total norm.

    Plain tensors (DDP, the kit's CPU path): `torch.nn.utils.clip_grad_norm_` itself, so a script's
    numerics are the same as without the kit. DTensors: torch's one stack of per-tensor norms fails when
    they live on different meshes (tensor-parallel weights on the (dp, tp) mesh, FSDP's embeddings and
    norms on dp alone), so the norm is taken per mesh, made whole (a collective over that mesh), and the
    per-mesh norms combined; each gradient's local shard is scaled in place."""
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        by_mesh.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.nn.utils.get_total_norm(norms, norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coefficient.to(local.device))
    return total


POLL_S = 0.0005
"""How often a rank waiting on a collective looks at it: ~1% of a CPU step, and a wait that an
in-process restart (an asynchronous exception, delivered between bytecodes) ends at once."""


def wait(work: dist.Work) -> None:
    """Wait for an async collective from Python, not inside gloo's blocking call.

    A blocking gloo call holds the thread until the collective's timeout even when a peer has failed
    and an in-process restart is already decided (gloo cannot abort it); this loop yields to the
    restart's asynchronous exception within `POLL_S`. The abandoned operation belongs to the old
    process group, which the next attempt retires without waiting for it (`retire_default_group`).
    """
    while not work.is_completed():
        time.sleep(POLL_S)
    work.wait()  # raises the collective's own error (timeout, peer gone)


@dataclass
class PendingAverage:
    """The CPU gradient all-reduce in flight (`start_average_gradients`)."""

    work: dist.Work
    flat: torch.Tensor
    grads: list[torch.Tensor]
    world_size: int

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def finish(self) -> None:
        """The averaged gradients into `.grad` (raises the collective's error, if it failed)."""
        self.work.wait()
        self.flat.div_(self.world_size)
        synced = torch._utils._unflatten_dense_tensors(self.flat, self.grads)  # noqa: SLF001
        for grad, averaged in zip(self.grads, synced, strict=True):
            grad.copy_(averaged)


def start_average_gradients(model: nn.Module, world: World) -> PendingAverage | None:
    """Start averaging gradients across ranks (CPU path; FSDP2 already did it on CUDA): one async
    all-reduce of all gradients flattened in parameter order, the same layout every step and every
    attempt. None: nothing to wait for."""
    if world.device.type == "cuda" or world.world_size == 1:
        return None
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)  # noqa: SLF001 - torch's own helper for this
    return PendingAverage(dist.all_reduce(flat, async_op=True), flat, grads, world.world_size)
