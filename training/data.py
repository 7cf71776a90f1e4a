"""Deterministic data: every sample is a pure function of (seed, global sample index).

The position in the data is therefore just a step number: step `s` of a job of `w` ranks at its full
size reads the global batch `[s * w * b, (s + 1) * w * b)`, rank `r` its `r`-th run of `b` samples.
Resuming at any step, on any restart layer, reads exactly the samples a fault-free run reads, which is
what makes "nothing lost" checkable bit for bit. A job that shrank to fewer ranks reads the same global
batch per step, each rank a larger contiguous share of it in micro-batches of at most `b`
(`DataSource.share`), so no sample is skipped or repeated and the global batch is kept.

A memory-mapped token file (e.g. on FSx) is the other source: sample `i` is the window
starting at `i * seq_len` (wrapping around).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from pathlib import Path

# A large odd multiplier spreads consecutive sample indices across the seed space (splitmix64 constant).
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 63) - 1
TOKEN_BYTES = 2  # uint16 token ids (TokenFile)


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class SyntheticTokens:
    """Token sequences with learnable structure (a noisy affine recurrence), keyed by sample index."""

    def __init__(self, *, seed: int, vocab_size: int, seq_len: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.seq_len = seq_len

    def sample(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(((self.seed + 1) * _MIX + index) & _MASK)
        start = torch.randint(0, self.vocab_size, (1,), generator=generator)
        stride = torch.randint(1, 8, (1,), generator=generator)
        noise = (torch.rand(self.seq_len + 1, generator=generator) < 0.1).long()  # noqa: PLR2004
        positions = torch.arange(self.seq_len + 1)
        return (start + stride * positions + noise) % self.vocab_size


class TokenFile:
    """A flat file of uint16 token ids (np.memmap); sample `i` is a window of seq_len + 1 tokens."""

    def __init__(self, *, path: Path, seq_len: int) -> None:
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.seq_len = seq_len
        if len(self.tokens) <= seq_len + 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, need more than seq_len + 1")

    def sample(self, index: int) -> torch.Tensor:
        num_windows = (len(self.tokens) - 1) // self.seq_len
        start = (index % num_windows) * self.seq_len
        window = np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
        return torch.from_numpy(window)


class DataSource:
    """Batches for (step, rank) from a sample source; stateless, so the data position is the step."""

    def __init__(self, *, source: SyntheticTokens | TokenFile, batch_size: int, world_size: int) -> None:
        self.source = source
        self.batch_size = batch_size
        self.world_size = world_size

    def first_sample(self, step: int, rank: int) -> int:
        return (step * self.world_size + rank) * self.batch_size

    def batch(self, step: int, rank: int, device: torch.device) -> Batch:
        return self._rows(self.first_sample(step, rank), self.batch_size, device)

    def share(self, step: int, rank: int, ranks: int, device: torch.device) -> list[tuple[Batch, float]]:
        """Rank `rank`'s share of step `step`'s global batch when the job runs on `ranks` ranks (its full
        size `world_size`, or fewer after it shrank): a contiguous run of the global batch, in
        micro-batches of at most `batch_size` samples, each with the weight of its mean loss (its samples
        times `ranks` over the global batch), so the gradient averaged over the ranks is the global
        batch's mean at any size. At the full size: one micro-batch, `batch(step, rank)`, weight 1."""
        total = self.batch_size * self.world_size
        begin, end = total * rank // ranks, total * (rank + 1) // ranks
        first = step * total + begin
        starts = range(0, end - begin, self.batch_size)
        micro = [(start, min(self.batch_size, end - begin - start)) for start in starts]
        return [(self._rows(first + start, count, device), count * ranks / total) for start, count in micro]

    def _rows(self, first: int, count: int, device: torch.device) -> Batch:
        rows = torch.stack([self.source.sample(first + i) for i in range(count)])
        rows = rows.to(device, non_blocking=True)
        return Batch(inputs=rows[:, :-1], targets=rows[:, 1:])


def token_file_problems(path: Path, *, seq_len: int) -> list[str]:
    """What is wrong with `path` as the token file of a model whose sequences are `seq_len` long."""
    field = f"data.token_file {path}"
    if not path.exists():
        return [f"{field}: no such file; pass an existing uint16 token file (unset: synthetic data)"]
    if not path.is_file():
        return [f"{field}: not a regular file; pass a flat file of uint16 token ids"]
    if not os.access(path, os.R_OK):
        return [f"{field}: not readable by this user; fix its permissions"]
    size = path.stat().st_size
    if size % TOKEN_BYTES:
        return [f"{field}: {size} bytes is not a whole number of uint16 tokens; is it a token file?"]
    if size // TOKEN_BYTES <= seq_len + 1:
        tokens = size // TOKEN_BYTES
        return [f"{field}: {tokens} tokens; the model's seq_len ({seq_len}) needs more than {seq_len + 1}"]
    return []
