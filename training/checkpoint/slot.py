"""The memory-slot format: how one snapshot of one rank's shard sits in a folder of host memory.

The memory tier stages each snapshot into a slot of its rank's folder (`<memory_dir>/rank-<r>/`,
memory.py), and the peer replica writes the copies it receives into the same format under
`<memory_dir>/peer/rank-<r>/` (replica.py); a restore reads either alike (restore.py). A slot
is three files:

- `slot-<k>.bin`: the shard's tensor bytes in the layout of shard.py;
- `slot-<k>.hdr`: the shard's header (its skeleton and layout, `shard.encode_header`);
- `slot-<k>.json`: the manifest `{"step", "rank", "world_size", "data_bytes", "layout"}`, the commit
  point (`layout`: the state's layout key, which the header carries: a restore takes a copy only into
  a live state of the same layout).

A writer uncommits the slot (removes its manifest) before it overwrites the data, and commits it by
renaming a new manifest into place once data and header are whole. A reader takes only slots with a
manifest, so a kill -9 at any moment leaves a committed slot or none, never a torn one. The folders are
memory-backed (tmpfs, a memory emptyDir): nothing is fsynced.
"""

from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from nvrx_eks.training.checkpoint.shard import ShardError, header_key, parse_header, tensor_index

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    Fill = Callable[[str, torch.Tensor, object], None]


@dataclass(frozen=True)
class SlotFiles:
    """The three files of one slot."""

    data: Path
    header: Path
    manifest: Path

    @classmethod
    def at(cls, folder: Path, index: int) -> SlotFiles:
        """Slot `index` of `folder`."""
        return cls.of_manifest(folder / f"slot-{index}.json")

    @classmethod
    def of_manifest(cls, manifest: Path) -> SlotFiles:
        return cls(manifest.with_suffix(".bin"), manifest.with_suffix(".hdr"), manifest)

    def uncommit(self) -> None:
        """Before the data is overwritten: a reader never pairs the old manifest with new bytes."""
        self.manifest.unlink(missing_ok=True)

    def commit(self, *, header: bytes, step: int, rank: int, world_size: int, data_bytes: int) -> None:
        """Once the data is whole: write the header, then the manifest (the commit point)."""
        tmp = self.header.with_suffix(".hdr.tmp")
        tmp.write_bytes(header)
        tmp.replace(self.header)
        manifest = {
            "step": step,
            "rank": rank,
            "world_size": world_size,
            "data_bytes": data_bytes,
            "layout": header_key(header),
        }
        tmp = self.manifest.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest))
        tmp.replace(self.manifest)

    def read_manifest(self) -> dict[str, Any] | None:
        """The committed manifest, or None (no slot, or one half-written or being replaced)."""
        try:
            manifest: dict[str, Any] = json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            return None
        else:
            return manifest

    def read(self, manifest: dict[str, Any]) -> bytearray:
        """The slot as one encoded shard (header + data), for `shard.decode` or a transfer."""
        header = self.header.read_bytes()
        nbytes = int(manifest["data_bytes"])
        blob = bytearray(len(header) + nbytes)
        blob[: len(header)] = header
        with self.data.open("rb", buffering=0) as source:
            got = source.readinto(memoryview(blob)[len(header) :])
        if got != nbytes:
            raise ShardError(f"{self.data}: {got} of {nbytes} bytes")
        return blob

    @contextlib.contextmanager
    def reader(self, manifest: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Fill]]:
        """(the slot's state tree, `fill`): the tree's tensor leaves stand for the slot's tensors, and
        `fill(key, target, leaf)` reads one straight into `target` (a live tensor of the same shape and
        dtype) -- one copy from the page cache into the live tensor, the least a restore from RAM can
        do (a mapping of the slot costs its page-table set-up and tear-down on top of the copy). The
        reads run on a thread per core, in chunks (the kernel copies each on the calling thread): the
        block's exit waits for them and raises the first failure."""
        skeleton, layout, _ = parse_header(self.header.read_bytes())
        if layout.data_bytes > int(manifest["data_bytes"]):
            raise ShardError(f"{self.data}: the header needs {layout.data_bytes} bytes, the slot holds fewer")
        with (
            self.data.open("rb", buffering=0) as source,
            ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="ckpt-read") as pool,
        ):
            reads: list[Future[None]] = []

            def fill(key: str, target: torch.Tensor, leaf: object) -> None:
                index = tensor_index(leaf)
                if index is None:
                    raise ValueError(f"{key}: the checkpoint holds a {type(leaf).__name__}, not a tensor")
                ref = layout.refs[index]
                if ref.shape != tuple(target.shape) or ref.dtype != target.dtype:
                    raise ValueError(
                        f"{key}: the checkpoint holds {ref.dtype} {ref.shape}, this run {target.dtype} "
                        f"{tuple(target.shape)}"
                    )
                direct = target.device.type == "cpu" and target.is_contiguous()
                buffer = target if direct else torch.empty(ref.shape, dtype=ref.dtype)
                flat = buffer.view(-1).view(torch.uint8)
                for start in range(0, ref.nbytes, READ_CHUNK):
                    part = flat[start : start + READ_CHUNK]
                    reads.append(pool.submit(_read_at, source.fileno(), part, ref.offset + start, self.data))
                if not direct:
                    for read in reads:
                        read.result()
                    target.copy_(buffer)

            yield cast("dict[str, Any]", skeleton), fill
            for read in reads:
                read.result()


READ_CHUNK = 64 << 20
"""Bytes per read of a restore from RAM: enough to amortize a thread hand-off, small enough to spread a
large tensor over every core."""


def _read_at(fd: int, into: torch.Tensor, offset: int, path: Path) -> None:
    view = into.numpy().data.cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if not got:
            raise ShardError(f"{path}: shorter than its manifest")
        done += got


def committed(folder: Path) -> list[tuple[SlotFiles, dict[str, Any]]]:
    """Every committed slot of `folder` with its manifest, in file-name order."""
    out = []
    for path in sorted(folder.glob("slot-*.json")):
        files = SlotFiles.of_manifest(path)
        if (manifest := files.read_manifest()) is not None:
            out.append((files, manifest))
    return out
