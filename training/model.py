"""A small Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

One module for every size: `PRESETS` goes from a tiny CPU test model (a few ms per step) to about
8B parameters (Llama 3 8B shapes) for H100 runs. Nothing here knows about distribution; the caller
shards the model (FSDP2 on GPU; see training/parallel.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name
from torch import nn

from nvrx_eks.training.shapes import PRESETS, ModelShape

__all__ = ["PRESETS", "Decoder", "ModelShape", "build_model", "num_parameters"]


def rope_tables(shape: ModelShape, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = shape.dim // shape.num_heads
    inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(shape.seq_len, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); rotate pairs (even, odd).
    x1, x2 = x[..., 0::2], x[..., 1::2]
    seq = x.shape[-2]
    c, s = cos[:seq], sin[:seq]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.dim // shape.num_heads
        self.wq = nn.Linear(shape.dim, shape.num_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(shape.num_heads * self.head_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        projected: torch.Tensor = self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))
        return projected


class FeedForward(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w2 = nn.Linear(shape.ffn_dim, shape.dim, bias=False)
        self.w3 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class Decoder(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab_size, shape.dim)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
        self.norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.output = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        cos, sin = rope_tables(shape)
        # Buffers, not parameters: derived from the shape, never checkpointed.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed: int) -> None:
        """Deterministic initialisation from `seed` alone (same on every rank and every restart)."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in sorted(self.named_parameters()):
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    values = torch.randn(param.shape, generator=generator) * 0.02
                    param.copy_(values.to(param.device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        logits: torch.Tensor = self.output(self.norm(x))
        return logits


def build_model(preset: str, *, seed: int, device: torch.device) -> Decoder:
    """The preset's model with deterministic weights, on `device` (meta init for the large ones is the
    caller's business once it shards; the tiny and small ones are built directly)."""
    model = Decoder(PRESETS[preset]).to(device)
    model.init_weights(seed)
    return model


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
