"""The training state a script hands to `attempt.resume(...)`, by fully-qualified name.

Modules and optimizers are read and written through `torch.distributed.checkpoint.state_dict`
(`get_model_state_dict`, `get_optimizer_state_dict`, `set_optimizer_state_dict`): whatever the script
made of them -- the module itself, DistributedDataParallel, FSDP2's `fully_shard`, tensor parallelism
through `parallelize_module`, HSDP on a 2-D mesh, `torch.compile` -- a key is a parameter's name and a
sharded tensor is a DTensor whose local shard is this rank's. Everything else tracked (a scheduler, a
loader's position) is a `Stateful` object whose `state_dict()` is captured at every step boundary.

`Tracked.state()` is what a snapshot saves: the objects' states, the kit's section (`"kit"`: the next
step, the world size, the parallel layout, the job's facts) and this rank's own (`RANK_SECTION`: its
RNG streams, its resilience counters). `Tracked.target()` is the live state a restore loads into:
tensors in place, so a restore from RAM is one copy per tensor; `Tracked.apply` then gives each object
what is not a tensor (an optimizer's hyperparameters, a scheduler's counters).
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.checkpoint.dcp_format import KIT_SECTION, RANK_SECTION

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch.distributed.device_mesh import DeviceMesh

RESERVED_NAMES = frozenset({KIT_SECTION, RANK_SECTION, "rng", "progress", "resilience"})
"""Names the kit's own sections take in a checkpoint: a tracked object may not use them."""
KEEP = "the checkpoints are kept; point checkpoint.*_dir at a new folder to start afresh"


def is_module(obj: object) -> bool:
    return isinstance(obj, torch.nn.Module)


def is_optimizer(obj: object) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def is_heavy(obj: object) -> bool:
    """Modules and optimizers: large, and changed only inside `update()`, so the previous attempt's
    object is itself the state of the last step boundary."""
    return is_module(obj) or is_optimizer(obj)


def rng_state() -> dict[str, Any]:
    rng: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global state is what gets used
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return rng


def set_rng_state(rng: dict[str, Any]) -> None:
    # clone(): restored tensors may be views into a snapshot's one buffer, and torch reads a generator
    # state from the start of the storage, ignoring the view's offset -- SIGSEGV, or silently another
    # rank's bytes (tests/training: test_rng_state_restores_from_a_view).
    torch.set_rng_state(rng["torch"].clone())
    np.random.set_state(rng["numpy"])  # noqa: NPY002
    random.setstate(rng["python"])
    if "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"].clone())


WRAPPER_NAMES = frozenset({"module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})
"""Name segments wrappers add (DDP, torch.compile, activation checkpointing): not part of a key."""


def clean_name(name: str) -> str:
    """A parameter's or buffer's name as `get_model_state_dict` keys it (wrappers' segments dropped)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_NAMES)


def persistent_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers a module's state holds (BatchNorm's running statistics, a step counter), by key;
    non-persistent ones (masks, rotary tables) are constants the module rebuilds."""
    saved = set(module.state_dict(keep_vars=True))
    return {clean_name(name): buffer for name, buffer in module.named_buffers() if name in saved}


def _live_groups() -> set[int]:
    from torch.distributed import distributed_c10d  # noqa: PLC0415

    return {id(group) for group in distributed_c10d._world.pg_map}  # noqa: SLF001 - the registry itself


def meshes_of(modules: Iterable[torch.nn.Module]) -> list[DeviceMesh]:
    """The device meshes the modules' DTensor parameters live on (each once)."""
    found: list[DeviceMesh] = []
    for module in modules:
        for param in module.parameters():
            if isinstance(param, DTensor) and not any(param.device_mesh is mesh for mesh in found):
                found.append(param.device_mesh)
    return found


def stale_group_problems(name: str, module: torch.nn.Module) -> list[str]:
    """Problems with a module parallelized over a process group that is not this attempt's (built once
    and kept across restarts): its collectives would run on a destroyed group. A DDP wrapper holds its
    group; a device mesh names its groups, and a name this attempt has not made is an earlier one's."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    live = _live_groups()
    group = getattr(module, "process_group", None)
    if group is not None and id(group) not in live:
        return [
            (
                f"{name}: its DistributedDataParallel runs on a process group of an earlier attempt; build "
                "the model (and wrap it) inside the training function, on this attempt's group"
            )
        ]
    from torch.distributed.distributed_c10d import _resolve_process_group  # noqa: PLC0415

    for mesh in meshes_of([module]):
        try:
            for group_name in getattr(mesh, "_dim_group_names", ()):
                _resolve_process_group(group_name)
        except (RuntimeError, ValueError, KeyError):
            return [
                (
                    f"{name}: is sharded over a device mesh of an earlier attempt; build the mesh with "
                    "attempt.device_mesh() and the model on it inside the training function, every attempt"
                )
            ]
    return []


class Tracked:
    """The objects one attempt tracks, and how their state is read, captured and restored."""

    def __init__(self, objects: dict[str, Any]) -> None:
        check_objects(objects)
        self.objects = objects
        self.modules = {name: obj for name, obj in objects.items() if is_module(obj)}
        self.optimizers = {name: obj for name, obj in objects.items() if is_optimizer(obj)}
        self.owner = _optimizer_owners(self.modules, self.optimizers)
        self._buffer_refs: dict[str, dict[str, torch.Tensor]] | None = None
        self.light: dict[str, Any] = {}
        self.buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.rng: dict[str, Any] = {}

    @property
    def sharded(self) -> bool:
        """Some parameter is a DTensor (FSDP2, tensor parallelism): ranks hold different shards."""
        return any(isinstance(p, DTensor) for module in self.modules.values() for p in module.parameters())

    def nbytes(self) -> int:
        """This rank's tensor bytes: the modules' state and the optimizers' (what a snapshot copies).
        Read from the objects themselves: `get_optimizer_state_dict` would initialize an optimizer that
        has no state yet (a fresh start), and its first real step would then count as its second."""
        total = 0
        for module in self.modules.values():
            for tensor in module.state_dict().values():
                if isinstance(tensor, torch.Tensor):
                    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
                    total += local.numel() * local.element_size()
        for optimizer in self.optimizers.values():
            for per_param in optimizer.state.values():
                for value in per_param.values():
                    if isinstance(value, torch.Tensor):
                        local = value.to_local() if isinstance(value, DTensor) else value
                        total += local.numel() * local.element_size()
        return total

    def stale_group_problems(self) -> list[str]:
        return [p for name, module in self.modules.items() for p in stale_group_problems(name, module)]

    # ----- the state of a step boundary -------------------------------------------------------------
    def capture(self) -> None:
        """The small tracked state (everything but modules and optimizers, and the modules' persistent
        buffers, which a forward changes outside `update()`) and the RNGs, as they are now: what a
        restart re-enters with, and what a snapshot saves."""
        self.light = {n: copy.deepcopy(o.state_dict()) for n, o in self.objects.items() if not is_heavy(o)}
        if self._buffer_refs is None:
            self._buffer_refs = {name: persistent_buffers(m) for name, m in self.modules.items()}
        self.buffers = {
            name: {b: t.detach().clone() for b, t in refs.items()}
            for name, refs in self._buffer_refs.items()
            if refs
        }
        self.rng = rng_state()

    def heavy_state(self, name: str) -> dict[str, Any]:
        obj = self.objects[name]
        if is_module(obj):
            return get_model_state_dict(obj)
        return get_optimizer_state_dict(self.modules[self.owner[name]], obj)

    def state(self, *, kit: dict[str, Any], rank: dict[str, Any]) -> dict[str, Any]:
        """The state a snapshot saves: tensors are the live ones (the snapshot copies them before the
        next update changes them), the rest as captured at the boundary."""
        out: dict[str, Any] = {
            name: (self.heavy_state(name) if is_heavy(obj) else self.light[name])
            for name, obj in self.objects.items()
        }
        out[KIT_SECTION] = kit
        out[RANK_SECTION] = {"rng": pickle.dumps(self.rng), **rank}
        return out

    def target(self, *, kit: dict[str, Any], rank: dict[str, Any]) -> dict[str, Any]:
        """The live state a restore loads into. Reading an optimizer's state initializes it (DCP steps it
        once with zero gradients and no learning rate): call it only when a checkpoint will be loaded,
        `discard_target` if none was."""
        out: dict[str, Any] = {
            name: (self.heavy_state(name) if is_heavy(obj) else obj.state_dict())
            for name, obj in self.objects.items()
        }
        out[KIT_SECTION] = kit
        out[RANK_SECTION] = {"rng": b"", **rank}
        return out

    def discard_target(self) -> None:
        """Nothing was loaded: the optimizers' state that `target` initialized goes, so a fresh start is
        the same as a run that never looked for a checkpoint."""
        for optimizer in self.optimizers.values():
            optimizer.state.clear()

    def apply(self, state: dict[str, Any]) -> dict[str, Any]:
        """Give every object what a restore loaded into `state` (its tensors are already in place);
        returns the kit's and the rank's sections. UserError when the state does not fit an object."""
        for name, obj in self.objects.items():
            try:
                if is_module(obj):
                    extra = {k: v for k, v in state[name].items() if not isinstance(v, torch.Tensor)}
                    if extra:  # a module's non-tensor state (`get_extra_state`)
                        set_model_state_dict(obj, extra, options=StateDictOptions(strict=False))
                elif is_optimizer(obj):
                    set_optimizer_state_dict(self.modules[self.owner[name]], obj, state[name])
                else:
                    obj.load_state_dict(state[name])
            except (RuntimeError, KeyError, ValueError, TypeError) as exc:
                raise UserError(
                    f"{name}: the checkpoint does not fit this run's {type(obj).__name__} ({exc}); build "
                    f"it as it was when the checkpoint was written ({KEEP})"
                ) from None
        section = state[RANK_SECTION]
        if section.get("rng"):
            set_rng_state(pickle.loads(section["rng"]))  # noqa: S301 - the kit's own, checksummed on disk
        return {KIT_SECTION: state[KIT_SECTION], RANK_SECTION: section}

    # ----- an in-process restart: the previous attempt's objects ----------------------------------
    def memory_tree(self, *, kit: dict[str, Any], rank: dict[str, Any]) -> dict[str, Any]:
        """This attempt's state at its last boundary, for the next attempt to load (same layout): the
        modules and optimizers themselves (changed only inside an update), their buffers and the rest
        as captured. FSDP2 modules a failed forward left unsharded are resharded first (no collective)."""
        for module in self.modules.values():
            for sub in module.modules():
                reshard = getattr(sub, "reshard", None)
                if callable(reshard) and type(sub).__name__.startswith("FSDP"):
                    with contextlib.suppress(Exception):
                        reshard()
        state = self.state(kit=kit, rank=rank)
        for name, buffers in self.buffers.items():
            for buffer, value in buffers.items():
                if buffer in state[name]:
                    state[name][buffer] = value
        return state


def check_objects(objects: dict[str, Any]) -> None:
    if not objects:
        raise UserError(
            "attempt.resume() needs the training state: resume(model=model, optimizer=optimizer, ...)"
        )
    problems = []
    for name, obj in objects.items():
        if name in RESERVED_NAMES or name.startswith(f"{RANK_SECTION}_"):
            problems.append(f"{name}: the name is the kit's own checkpoint key; rename it")
        elif not (
            callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
        ):
            problems.append(
                f"{name}: a {type(obj).__name__} has no state_dict()/load_state_dict(); pass an object that "
                "has both (torch.distributed.checkpoint.stateful.Stateful), or wrap it in one"
            )
    if problems:
        raise UserError("attempt.resume(): " + "; ".join(problems))


def _optimizer_owners(
    modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> dict[str, str]:
    """optimizer name -> the tracked module whose parameters it holds. UserError for an optimizer
    holding parameters of no tracked module (built before the model was sharded, which replaces the
    parameters) or of several."""
    owned = {name: {id(p) for p in module.parameters()} for name, module in modules.items()}
    owner: dict[str, str] = {}
    problems = []
    for name, optimizer in optimizers.items():
        params = [p for group in optimizer.param_groups for p in group["params"]]
        holders = [m for m, ids in owned.items() if any(id(p) in ids for p in params)]
        strays = [p for p in params if not any(id(p) in ids for ids in owned.values())]
        if strays or len(holders) != 1:
            sharded = any(isinstance(p, DTensor) for module in modules.values() for p in module.parameters())
            if strays and sharded:
                problems.append(
                    f"{name}: holds {len(strays)} parameter(s) the tracked model no longer has: it was built "
                    "before fully_shard / parallelize_module replaced them; build the optimizer after "
                    "sharding the model"
                )
            elif strays:
                problems.append(
                    f"{name}: holds {len(strays)} parameter(s) of no tracked module; pass the module they "
                    "belong to (resume(model=model, ...)), built before the optimizer"
                )
            else:
                problems.append(
                    f"{name}: holds parameters of {', '.join(holders)}; track them as one module "
                    "(torch.nn.ModuleDict) or give each its own optimizer"
                )
            continue
        owner[name] = holders[0]
    if problems:
        raise UserError("attempt.resume(): " + "; ".join(problems))
    return owner


def local_parameters(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    """Every parameter's local data (a DTensor's shard), for fingerprints."""
    return [p.to_local() if isinstance(p, DTensor) else p for module in modules for p in module.parameters()]
