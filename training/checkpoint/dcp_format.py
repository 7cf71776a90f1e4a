"""The kit's state in torch.distributed.checkpoint (DCP) terms, and the DCP files each rank writes alone.

A state is a nested mapping: the tracked objects' state dicts by fully-qualified name (a model's
`get_model_state_dict`, an optimizer's `get_optimizer_state_dict`, a loader's `state_dict()`), the
kit's own section (`"kit"`: progress, the job's facts) and this rank's own section (`RANK_SECTION`:
its RNG streams, its resilience counters). `Stager.stage` flattens it as DCP does (keys such as
`model.layers.0.attention.wq.weight`), keeps each DTensor as its local shard, and makes this rank's
DCP write plan: each shard's place in its global tensor. The memory tier stages the flat local
tensors byte for byte; the disk tiers write them as DCP files.

Disk layout of one step (a folder `step-<n>`), every file DCP's own:

- `__<rank>_0.distcp`: the rank's tensors and objects (DCP's FileSystemWriter wrote them);
- `__<rank>.metadata`: the rank's own metadata (DCP's rank-local metadata, `use_collectives=False`);
- `.metadata`: the global metadata, the merge of every rank's (`merge_metadata`), written once every
  rank's files are committed. Plain `torch.distributed.checkpoint.load` reads the step at any world
  size from it, with no kit code; without it (a node-local folder holds only its node's ranks), DCP
  reads each rank's own files at the world size they were written at.

Why each rank writes alone, with no collective: a persist runs on a background thread while the loop
trains, and is abandoned when it outlasts its timeout (persist.py). DCP's `save` coordinates ranks with
three collectives, which a thread abandoned on one rank would leave the others waiting in; the ranks'
plans only need merging once they are all on disk, and that merge is pure data (`merge_metadata`).
Replicated tensors (a DDP model, TP's norms) are written by every rank holding them, as each rank's
shard did before DCP; the global metadata points at the lowest rank's copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    import os
    import threading
    from collections.abc import Callable, Generator, Iterable

    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import SavePlan

KIT_SECTION = "kit"
"""The key of the kit's own part of the state: the next step, the world size, the mesh, the job's facts
(the same on every rank)."""

RANK_SECTION = "kit_rank"
"""The key of a rank's own part of the state. Stored under `kit_rank_<rank>`, so every rank's survives
DCP's one-value-per-key metadata; a restore at another world size takes it from one old rank
(`rank_keyed`)."""

GLOBAL_METADATA = ".metadata"


def rank_metadata_name(rank: int) -> str:
    return f"__{rank}.metadata"


def data_name(rank: int) -> str:
    return f"__{rank}_0.distcp"


def rank_keyed(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """`state` with its rank section under this rank's own key (shallow: nothing is copied)."""
    if RANK_SECTION not in state:
        return state
    keyed = {key: value for key, value in state.items() if key != RANK_SECTION}
    keyed[f"{RANK_SECTION}_{rank}"] = state[RANK_SECTION]
    return keyed


@dataclass(frozen=True)
class Staged:
    """One rank's state as DCP sees it."""

    tree: dict[str, Any]
    """The state, rank-keyed, with each DTensor replaced by its local shard: what a snapshot holds."""
    plan: SavePlan
    """This rank's DCP write items (each shard with its offsets in the global tensor) and the
    flattening's mappings (`planner_data`)."""
    key: str
    """The layout's fingerprint: the world size, every key, and each tensor's shard, shape and dtype.
    Equal keys mean a staged copy can be loaded into the live state byte for byte."""

    def flat(self) -> dict[str, Any]:
        """DCP key -> tensor or object."""
        return flatten(self.tree)[0]


def flatten(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's flattening: (key -> leaf, key -> path in the tree)."""
    flat, mappings = flatten_state_dict(tree)
    return flat, dict(mappings)


def _describe(key: str, value: object) -> tuple[object, ...]:
    if isinstance(value, DTensor):
        return (key, "d", tuple(value.shape), value.dtype, tuple(value.placements), value.device_mesh.shape)
    if isinstance(value, torch.Tensor):
        return (key, "t", tuple(value.shape), value.dtype)
    return (key, "o")


def _layout_key(plan: SavePlan, world_size: int) -> str:
    digest = hashlib.sha256(f"world_size={world_size}".encode())
    for item in plan.items:
        digest.update(f"|{item.index.fqn}|{item.type.value}".encode())
        data = item.tensor_data
        if data is not None:
            digest.update(
                f"|{tuple(data.size)}|{tuple(data.chunk.offsets)}|{tuple(data.chunk.sizes)}|"
                f"{data.properties.dtype}".encode()
            )
    return digest.hexdigest()


def _local(node: object) -> object:
    if isinstance(node, DTensor):
        return node.to_local()
    if isinstance(node, dict):
        return {key: _local(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_local(value) for value in node]
    return node


class Stager:
    """Flattens one rank's states for the tiers, reusing the write plan while the layout stays."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._described: tuple[tuple[object, ...], ...] | None = None
        self._plan: SavePlan | None = None
        self._key = ""

    def stage(self, state: dict[str, Any]) -> Staged:
        keyed = rank_keyed(state, self.rank)
        flat, mappings = flatten(keyed)
        described = tuple(_describe(key, value) for key, value in flat.items())
        if described != self._described or self._plan is None:
            plan = create_default_local_save_plan(flat, is_coordinator=True)
            self._plan = dataclasses.replace(plan, planner_data=mappings)
            self._key = _layout_key(self._plan, self.world_size)
            self._described = described
        return Staged(tree=cast("dict[str, Any]", _local(keyed)), plan=self._plan, key=self._key)


# ----- writing one rank's files ---------------------------------------------------------------------


class _StagedPlanner(DefaultSavePlanner):
    """DCP's default planner over a staged copy: the plan made from the live state, the data from the
    staged tensors (plain CPU tensors, where the live state held DTensors)."""

    def __init__(self, plan: SavePlan) -> None:
        super().__init__()
        self._staged_plan = plan

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        storage_meta: StorageMeta | None = None,  # noqa: ARG002 - DCP's signature
        is_coordinator: bool = False,  # noqa: ARG002 - DCP's signature
    ) -> None:
        self.state_dict = state_dict
        self.mappings = self._staged_plan.planner_data
        self.is_coordinator = True

    def create_local_plan(self) -> SavePlan:
        self.plan = self._staged_plan
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:  # noqa: ANN401 - DCP's signature
        return self.state_dict[index.fqn]


class _CrcWriter(io.RawIOBase):
    """A file being written, with the CRC32 and size of what went through it."""

    def __init__(self, raw: io.BufferedIOBase | io.RawIOBase) -> None:
        super().__init__()
        self.raw = raw
        self.crc = 0
        self.nbytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # noqa: ANN401 - any buffer
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        written = 0
        while written < len(view):  # short writes happen on some filesystems
            written += self.raw.write(view[written:]) or 0
        self.nbytes += len(view)
        return len(view)

    def tell(self) -> int:
        return self.raw.tell()

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()


class _CheckedFileSystem(FileSystem):
    """DCP's local file system, recording each written file's size and CRC32 (the kit's manifest)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, tuple[int, int]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as raw:
            stream = _CrcWriter(cast("io.BufferedIOBase", raw))
            yield stream
            self.sums[Path(path).name] = (stream.nbytes, stream.crc)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        self.sums[Path(new_path).name] = self.sums.pop(Path(path).name)


class _Writer(FileSystemWriter):
    """DCP's FileSystemWriter into a private folder, naming the folder the files end up in."""

    def __init__(self, folder: Path, *, final: str, fsync: bool) -> None:
        super().__init__(folder, single_file_per_rank=True, sync_files=fsync, thread_count=1, overwrite=True)
        self.fs = _CheckedFileSystem()
        self._final = final

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self._final, save_id=self.save_id)


class Cancelled(Exception):  # noqa: N818 - a state, not an error: the persist was abandoned
    """The trainer abandoned this persist (timeout, close): it must not commit."""


def write_rank_files(
    folder: Path,
    staged: Staged,
    *,
    rank: int,
    final: str,
    fsync: bool,
    cancelled: threading.Event | None = None,
) -> dict[str, tuple[int, int]]:
    """Write this rank's DCP files (`data_name`, `rank_metadata_name`) into `folder`, DCP's way; returns
    each file's (size, CRC32). `final` names where the files will live (the metadata's checkpoint id).
    Raises `Cancelled` once every byte is written but before the metadata, if `cancelled` is set."""
    writer = _Writer(folder, final=final, fsync=fsync)
    planner = _StagedPlanner(staged.plan)
    planner.set_up_planner(staged.flat())
    writer.set_up_storage_writer(True, rank=rank, use_collectives=False)
    local = writer.prepare_local_plan(planner.create_local_plan())
    plans, metadata = planner.create_global_plan([local])
    results = writer.write_data(planner.finish_plan(plans[0]), planner).value()
    if cancelled is not None and cancelled.is_set():
        raise Cancelled("abandoned by the trainer before its commit")
    writer.finish(metadata, [results])
    return dict(cast("_CheckedFileSystem", writer.fs).sums)


# ----- the global metadata ---------------------------------------------------------------------------


def merge_metadata(parts: Iterable[Metadata]) -> Metadata:
    """Every rank's own metadata (rank order) as one global metadata: each tensor's chunks from every
    rank (a chunk held by several ranks once, at the lowest rank's copy), every object once."""
    merged: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    mappings: dict[str, Any] = {}
    first: Metadata | None = None
    for part in parts:
        first = first or part
        for key, meta in part.state_dict_metadata.items():
            if isinstance(meta, TensorStorageMetadata):
                have = merged.setdefault(key, TensorStorageMetadata(meta.properties, meta.size, []))
                if not isinstance(have, TensorStorageMetadata) or tuple(have.size) != tuple(meta.size):
                    raise ValueError(f"{key}: the ranks' metadata disagree on its size")
                seen = {tuple(chunk.offsets) for chunk in have.chunks}
                have.chunks.extend(chunk for chunk in meta.chunks if tuple(chunk.offsets) not in seen)
            else:
                merged.setdefault(key, meta)
        for index, info in (part.storage_data or {}).items():
            storage.setdefault(index, info)
        if isinstance(part.planner_data, dict):
            for key, path in part.planner_data.items():
                mappings.setdefault(key, path)
    if first is None:
        raise ValueError("no rank metadata to merge")
    metadata = Metadata(state_dict_metadata=merged, planner_data=mappings, storage_data=storage)
    metadata.version = first.version
    metadata.storage_meta = first.storage_meta
    return metadata


def encode_metadata(metadata: Metadata) -> bytes:
    return pickle.dumps(metadata)


def decode_metadata(blob: bytes) -> Metadata:
    """A metadata file's object; the caller has verified the bytes (the kit's manifest, CRC32)."""
    return cast("Metadata", pickle.loads(blob))  # noqa: S301 - DCP's own format, checksummed first


# ----- reading ---------------------------------------------------------------------------------------


class RankReader(FileSystemReader):
    """DCP's reader over one rank's own files, at the layout they were written at (no collective)."""

    def __init__(self, path: str | os.PathLike[str], rank: int) -> None:
        super().__init__(path)
        self._rank = rank

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # noqa: ANN401, ARG002
        return super().read_metadata(rank=self._rank)


def load_planner(*, partial: bool = False) -> DefaultLoadPlanner:
    """DCP's default load planner; a key of the checkpoint that the live state lacks (a rank section
    not asked for) is no error, a key of the live state that the checkpoint lacks is (unless
    `partial`: reading one section alone)."""
    return DefaultLoadPlanner(allow_partial_load=partial)


class LayoutMismatchError(Exception):
    """A checkpoint step whose tensors do not fit this run's state (another model, another optimizer):
    no tier and no older step can fix that, the run's configuration can."""


def load_into(
    live: dict[str, Any], saved: dict[str, Any], *, rank: int, fill: Callable[[str, torch.Tensor, Any], None]
) -> dict[str, Any]:
    """Load a saved copy of the same layout into the live state: `saved` is its rank-keyed tree with any
    leaf standing for a tensor; `fill(key, live_local, leaf)` puts that tensor's bytes into the live
    local tensor (or its shard) in place. Objects are set as saved. Returns the live state; KeyError /
    ValueError when the copy does not fit."""
    keyed = rank_keyed(live, rank)
    live_flat, mappings = flatten(keyed)
    leaves = {key: _at(saved, mappings[key]) for key in live_flat}
    missing = sorted(key for key, leaf in leaves.items() if leaf is _MISSING)
    if missing:
        raise KeyError(f"the checkpoint holds no {', '.join(missing[:3])}")
    with torch.no_grad():
        for key, value in live_flat.items():
            if isinstance(value, torch.Tensor):
                fill(key, value.to_local() if isinstance(value, DTensor) else value, leaves[key])
                continue
            node: Any = keyed
            path = mappings[key]
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = leaves[key]
    return unkeyed(keyed, rank)


_MISSING = object()


def _at(tree: object, path: Iterable[object]) -> object:
    """The leaf of `tree` at a DCP key's path (dict keys, list indices), or `_MISSING`."""
    node: Any = tree
    for part in path:
        try:
            node = node[part] if isinstance(node, dict) else node[int(part)]  # type: ignore[call-overload]
        except (KeyError, IndexError, TypeError, ValueError):
            return _MISSING
    return node


def load_copy(live: dict[str, Any], saved_tree: dict[str, Any], *, rank: int) -> dict[str, Any]:
    """`load_into` from a saved tree whose tensors are tensors (views of a snapshot in memory)."""

    def fill(key: str, local: torch.Tensor, saved: Any) -> None:  # noqa: ANN401 - a saved leaf
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape:
            got = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            raise ValueError(f"{key}: the checkpoint holds {got}, this run {tuple(local.shape)}")
        local.copy_(saved)

    return load_into(live, saved_tree, rank=rank, fill=fill)


def unkeyed(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """`rank_keyed` undone: this rank's section (or, from another layout, the one old rank's the state
    came with) back under `RANK_SECTION`."""
    sections = [key for key in state if key.startswith(f"{RANK_SECTION}_")]
    if not sections:
        return state
    out = {key: value for key, value in state.items() if key not in sections}
    mine = f"{RANK_SECTION}_{rank}"
    out[RANK_SECTION] = state[mine if mine in state else sections[0]]
    return out
