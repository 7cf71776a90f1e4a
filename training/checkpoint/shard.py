"""One rank's shard: a state tree flattened into a skeleton plus one aligned byte region.

The same layout serves the staging buffers (tier 1) and the files (tiers 2 and 3), so a persist is one
sequential write of the staged bytes and a restore is one read, with no per-tensor pickling.

File: MAGIC, u64 skeleton length, the pickled skeleton, padding to ALIGN, then the tensor bytes.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from collections.abc import Iterator

MAGIC = b"NVRXCKP1"
ALIGN = 64
"""Every tensor starts at a multiple of this, so a uint8 view can be reinterpreted as any dtype."""
_HEADER = struct.Struct("<8sQ")


class ShardError(Exception):
    """A shard that cannot be used: torn, truncated, corrupt, or of an unknown format."""


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives in the data region."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Tensors of a state tree in a fixed order, and the data region they occupy."""

    refs: tuple[TensorRef, ...]
    data_bytes: int

    @property
    def signature(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Equal signatures mean a staging buffer can be reused as is."""
        return tuple((str(ref.dtype), ref.shape) for ref in self.refs)


def _align(value: int) -> int:
    return (value + ALIGN - 1) // ALIGN * ALIGN


_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})
"""Leaves with nothing inside: returned as they are, before any isinstance test."""


def _walk(node: object, tensors: list[torch.Tensor]) -> object:
    """Copy of the tree with each tensor replaced by its index in `tensors`."""
    if type(node) in _SCALARS:
        return node
    if isinstance(node, torch.Tensor):
        tensors.append(node)
        return _Slot(len(tensors) - 1)
    if isinstance(node, dict):
        return type(node)((key, _walk(value, tensors)) for key, value in node.items())
    if isinstance(node, list):
        return [_walk(value, tensors) for value in node]
    # Python's RNG state is a tuple of 625 ints: one pass over its types, not 625 recursions (on a
    # small model those recursions are most of a snapshot's flatten).
    if (
        isinstance(node, tuple)
        and not hasattr(node, "_fields")
        and not all(type(value) in _SCALARS for value in node)
    ):
        return tuple(_walk(value, tensors) for value in node)
    return node


def _fill(node: object, tensors: list[torch.Tensor]) -> object:
    if isinstance(node, _Slot):
        return tensors[node.index]
    if isinstance(node, dict):
        return type(node)((key, _fill(value, tensors)) for key, value in node.items())
    if isinstance(node, list):
        return [_fill(value, tensors) for value in node]
    if isinstance(node, tuple) and not hasattr(node, "_fields"):
        return tuple(_fill(value, tensors) for value in node)
    return node


@dataclass(frozen=True)
class _Slot:
    index: int


def flatten(state: dict[str, Any]) -> tuple[object, list[torch.Tensor], Layout]:
    """(skeleton, tensors, layout): the skeleton is the tree with tensors replaced by slots."""
    tensors: list[torch.Tensor] = []
    skeleton = _walk(state, tensors)
    refs = []
    offset = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        refs.append(TensorRef(offset, nbytes, tensor.dtype, tuple(tensor.shape)))
        offset = _align(offset + nbytes)
    return skeleton, tensors, Layout(tuple(refs), offset)


def views(buffer: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Typed views of each tensor's place in a uint8 buffer (no copy)."""
    out = []
    for ref in layout.refs:
        raw = buffer[ref.offset : ref.offset + ref.nbytes]
        out.append(
            raw.view(ref.dtype).view(ref.shape) if ref.nbytes else torch.empty(ref.shape, dtype=ref.dtype)
        )
    return out


def encode_header(skeleton: object, layout: Layout) -> bytes:
    """Header bytes (padded to ALIGN) that precede the data region in a shard file."""
    body = pickle.dumps((skeleton, layout), protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(MAGIC, len(body)) + body
    return header + b"\0" * (_align(len(header)) - len(header))


def decode(blob: memoryview | bytearray | bytes) -> dict[str, Any]:
    """State tree from a whole shard file's bytes; tensors are CPU views into `blob`."""
    view = memoryview(blob)
    if len(view) < _HEADER.size:
        raise ShardError(f"truncated: {len(view)} bytes, shorter than the header")
    magic, body_len = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise ShardError(f"not a checkpoint shard (magic {bytes(magic)!r})")
    start = _HEADER.size
    if start + body_len > len(view):
        raise ShardError("truncated inside the header")
    try:
        # Our own files, verified by checksum before this point; never a foreign pickle.
        skeleton, layout = pickle.loads(view[start : start + body_len])  # noqa: S301
    except Exception as exc:
        raise ShardError(f"unreadable header: {exc}") from exc
    data_start = _align(start + body_len)
    if data_start + layout.data_bytes > len(view):
        raise ShardError(
            f"truncated: data needs {layout.data_bytes} bytes, file holds {len(view) - data_start}"
        )
    if layout.data_bytes:
        data = torch.frombuffer(view, dtype=torch.uint8, offset=data_start, count=layout.data_bytes)
    else:
        data = torch.empty(0, dtype=torch.uint8)
    # encode() pickled the skeleton of a state dict: filled, it is a dict again.
    return cast("dict[str, Any]", _fill(skeleton, views(data, layout)))


def tensor_chunks(tensors: list[torch.Tensor], layout: Layout) -> Iterator[memoryview]:
    """The data region as a stream of byte chunks (padding included), without staging it."""
    position = 0
    for tensor, ref in zip(tensors, layout.refs, strict=True):
        if ref.offset > position:
            yield memoryview(b"\0" * (ref.offset - position))
        if ref.nbytes:
            flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            yield flat.numpy().data
        position = ref.offset + ref.nbytes
    if layout.data_bytes > position:
        yield memoryview(b"\0" * (layout.data_bytes - position))


def to_bytes(state: dict[str, Any]) -> bytes:
    """Whole shard in memory (tests and small states)."""
    skeleton, tensors, layout = flatten(state)
    out = io.BytesIO()
    out.write(encode_header(skeleton, layout))
    for chunk in tensor_chunks(tensors, layout):
        out.write(chunk)
    return out.getvalue()
