"""One rank's snapshot in RAM: a state tree flattened into a skeleton plus one aligned byte region.

The memory tier's staging slots (memory.py) and the peer replica's copies (replica.py) hold a snapshot
this way, so staging is one copy per tensor into a reused buffer and a restore from RAM copies each
tensor straight back, with no per-tensor pickling. The disk tiers write the same tensors as
torch.distributed.checkpoint files (dcp_format.py).

Header: MAGIC, u64 skeleton length, the layout's key (`KEY_BYTES`, dcp_format.py `Staged.key`), the
pickled skeleton, padding to ALIGN; the tensor bytes follow.
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

MAGIC = b"NVRXCKP2"
ALIGN = 64
"""Every tensor starts at a multiple of this, so a uint8 view can be reinterpreted as any dtype."""
KEY_BYTES = 64
"""A layout key: the hex sha256 of dcp_format.py `Staged.key`."""
_HEADER = struct.Struct(f"<8sQ{KEY_BYTES}s")


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


def tensor_index(leaf: object) -> int | None:
    """The tensor a skeleton's leaf stands for (its index in the layout), or None for a plain value."""
    return leaf.index if isinstance(leaf, _Slot) else None


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


def encode_header(skeleton: object, layout: Layout, key: str = "") -> bytes:
    """Header bytes (padded to ALIGN) that precede the data region; `key` names the state's layout."""
    body = pickle.dumps((skeleton, layout), protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(MAGIC, len(body), key.encode()[:KEY_BYTES]) + body
    return header + b"\0" * (_align(len(header)) - len(header))


def header_key(header: bytes | bytearray | memoryview) -> str:
    """The layout key a header carries ("" for none, or for bytes that are no header)."""
    if len(header) < _HEADER.size:
        return ""
    magic, _, key = _HEADER.unpack_from(header)
    return key.rstrip(b"\0").decode(errors="replace") if magic == MAGIC else ""


def parse_header(header: bytes | bytearray | memoryview) -> tuple[object, Layout, int]:
    """(skeleton, layout, header length with its padding) of a snapshot's header bytes."""
    view = memoryview(header)
    if len(view) < _HEADER.size:
        raise ShardError(f"truncated: {len(view)} bytes, shorter than the header")
    magic, body_len, _ = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise ShardError(f"not a snapshot (magic {bytes(magic)!r})")
    start = _HEADER.size
    if start + body_len > len(view):
        raise ShardError("truncated inside the header")
    try:
        # Our own bytes, written by this kit into memory this job owns; never a foreign pickle.
        skeleton, layout = pickle.loads(view[start : start + body_len])  # noqa: S301
    except Exception as exc:
        raise ShardError(f"unreadable header: {exc}") from exc
    return skeleton, layout, _align(start + body_len)


def fill(skeleton: object, layout: Layout, data: torch.Tensor) -> dict[str, Any]:
    """The state tree of a parsed header over its data region (a uint8 tensor): tensors are views."""
    if data.numel() < layout.data_bytes:
        raise ShardError(f"truncated: data needs {layout.data_bytes} bytes, holds {data.numel()}")
    # encode_header() pickled the skeleton of a state dict: filled, it is a dict again.
    return cast("dict[str, Any]", _fill(skeleton, views(data, layout)))


def decode(blob: memoryview | bytearray | bytes) -> dict[str, Any]:
    """State tree from a whole snapshot's bytes (header, then data); tensors are CPU views into `blob`."""
    view = memoryview(blob)
    skeleton, layout, data_start = parse_header(view)
    if data_start + layout.data_bytes > len(view):
        raise ShardError(f"truncated: data needs {layout.data_bytes} bytes, holds {len(view) - data_start}")
    if layout.data_bytes:
        data = torch.frombuffer(view, dtype=torch.uint8, offset=data_start, count=layout.data_bytes)
    else:
        data = torch.empty(0, dtype=torch.uint8)
    return fill(skeleton, layout, data)


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
