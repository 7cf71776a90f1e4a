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
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nvrx_eks.training.checkpoint.shard import ShardError, fill, header_key, parse_header

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


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
    def mapped(self, manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The slot's state tree, its tensors views of the slot's memory mapped read-only (no copy:
        a restore copies each straight into the live tensor). The views are valid inside the block."""
        skeleton, layout, _ = parse_header(self.header.read_bytes())
        nbytes = int(manifest["data_bytes"])
        if layout.data_bytes > nbytes:
            raise ShardError(
                f"{self.data}: the header needs {layout.data_bytes} bytes, the slot holds {nbytes}"
            )
        if not layout.data_bytes:
            yield fill(skeleton, layout, torch.empty(0, dtype=torch.uint8))
            return
        with self.data.open("rb") as source:
            if source.seek(0, 2) < layout.data_bytes:
                raise ShardError(f"{self.data}: shorter than its manifest")
            # Copy-on-write, never written: torch.frombuffer of a read-only mapping warns. MAP_POPULATE
            # maps every page at once instead of faulting each in during the copy.
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
            mapping = mmap.mmap(source.fileno(), layout.data_bytes, flags=flags)
        data: torch.Tensor | None = None
        try:
            data = torch.frombuffer(mapping, dtype=torch.uint8, count=layout.data_bytes)
            yield fill(skeleton, layout, data)
        finally:
            del data
            with contextlib.suppress(BufferError):  # a caller still holding a view: closed when freed
                mapping.close()


def committed(folder: Path) -> list[tuple[SlotFiles, dict[str, Any]]]:
    """Every committed slot of `folder` with its manifest, in file-name order."""
    out = []
    for path in sorted(folder.glob("slot-*.json")):
        files = SlotFiles.of_manifest(path)
        if (manifest := files.read_manifest()) is not None:
            out.append((files, manifest))
    return out
