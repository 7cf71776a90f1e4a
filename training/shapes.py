"""Model shapes, importable without torch (the command line's `--help` and validation read them).

`PRESETS` goes from a tiny CPU test model (a few ms per step) to about 8B parameters (Llama 3 8B
shapes) for H100 runs; training/model.py builds a decoder from one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_dim: int
    seq_len: int
    rope_theta: float = 10000.0

    @property
    def num_params(self) -> int:
        """Parameters of training/model.py's decoder with this shape (untied embedding and head)."""
        head_dim = self.dim // self.num_heads
        attention = 2 * self.dim * self.num_heads * head_dim + 2 * self.dim * self.num_kv_heads * head_dim
        block = attention + 3 * self.dim * self.ffn_dim + 2 * self.dim
        return 2 * self.vocab_size * self.dim + self.num_layers * block + self.dim

    @property
    def state_bytes(self) -> int:
        """Checkpointed state of the whole model: fp32 parameters and AdamW's two fp32 moments."""
        return self.num_params * 4 * 3


PRESETS: dict[str, ModelShape] = {
    # CPU tests and the local demo: ~0.1 M parameters, milliseconds per step on one core.
    "tiny": ModelShape(
        vocab_size=256, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=172, seq_len=32
    ),
    # CPU benchmarks: ~10 M parameters.
    "small": ModelShape(
        vocab_size=4096, dim=256, num_layers=6, num_heads=8, num_kv_heads=4, ffn_dim=688, seq_len=128
    ),
    # One GPU node smoke test: ~1.2 B parameters (Llama 3.2 1B shapes, shorter context).
    "1b": ModelShape(
        vocab_size=128256,
        dim=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        ffn_dim=8192,
        seq_len=2048,
        rope_theta=500000.0,
    ),
    # Multi-node H100 runs: ~8 B parameters (Llama 3 8B shapes).
    "8b": ModelShape(
        vocab_size=128256,
        dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        ffn_dim=14336,
        seq_len=4096,
        rope_theta=500000.0,
    ),
}
