"""Fixtures for rotary position embedding (RoPE), one torch implementation per layout, float64
and float32, forward and backward:

- interleaved pairs (2i, 2i+1): Meta's Llama formula, x viewed as complex numbers and multiplied
  by e^(i theta) (torch.polar, view_as_complex);
- halves (i, i + D/2): HF Llama's formula, x * cos + rotate_half(x) * sin with cos and sin of the
  angles concatenated twice. `check_against_transformers` confirms, when the fixtures are
  written, that this mirror gives bit for bit what transformers' own Llama functions give.

Angles: inv_freq = 1 / base^(arange(0, D, 2) / D) and positions * inv_freq, in the case's dtype.
"""
from __future__ import annotations

import torch
from torch import nn

from common import DTYPES, float_case, normal

FILE = "rope.py"


def angles(positions: torch.Tensor, head_dim: int, base: float, dtype) -> torch.Tensor:
    """positions (T,) -> (T, D/2); positions (B, T) -> (B, 1, T, D/2)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))
    freqs = positions[..., None].to(dtype) * inv_freq
    return freqs[:, None] if positions.ndim == 2 else freqs


class RoPE(nn.Module):
    """No parameters; forward(x (B, H, T, D), positions) in the subclass's layout."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.head_dim, self.base = head_dim, base


class InterleavedRoPE(RoPE):
    def forward(self, x, positions):
        theta = angles(positions, self.head_dim, self.base, x.dtype)
        rotation = torch.polar(torch.ones_like(theta), theta)                # e^(i theta)
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))       # (B, H, T, D/2)
        return torch.view_as_real(pairs * rotation).flatten(-2)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class HalfRoPE(RoPE):
    def forward(self, x, positions):
        theta = angles(positions, self.head_dim, self.base, x.dtype)
        doubled = torch.cat((theta, theta), dim=-1)                          # (..., T, D)
        return x * doubled.cos() + rotate_half(x) * doubled.sin()


def check_against_transformers() -> None:
    """HalfRoPE equals transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb in float32
    (HF's dtype for the angles), bit for bit, for Llama's head_dim 128 and positions to 4095."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)
    for base in (10000.0, 500000.0):
        config = LlamaConfig(hidden_size=256, num_attention_heads=2, head_dim=128,
                             max_position_embeddings=4096, rope_theta=base)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 2, 4, 128, generator=g)
        positions = torch.tensor([[0, 1, 2047, 4095], [5, 6, 7, 8]])
        cos, sin = LlamaRotaryEmbedding(config)(x, positions)
        expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
        if not torch.equal(HalfRoPE(128, base)(x, positions), expected):
            raise AssertionError(f"HalfRoPE differs from transformers' Llama RoPE (base {base})")


def build(out_dir):
    check_against_transformers()
    paths = []
    for dtype in DTYPES:
        for name, seed, module, base, shape, positions in [
                ("rope_interleaved", 41, InterleavedRoPE, 10000.0, (1, 2, 4, 8),
                 torch.arange(3, 7)),
                ("rope_half", 42, HalfRoPE, 10000.0, (2, 1, 4, 8), torch.arange(4)),
                # left padding: each sequence has its own positions
                ("rope_half_position_ids", 43, HalfRoPE, 10000.0, (2, 2, 4, 6),
                 torch.tensor([[1, 1, 0, 1], [0, 1, 2, 3]])),
                ("rope_interleaved_position_ids", 44, InterleavedRoPE, 10000.0, (2, 2, 3, 4),
                 torch.tensor([[0, 7, 9], [2, 3, 4]])),
                # Llama 3's base, far positions: one ulp of inv_freq would show in float32
                ("rope_half_llama", 45, HalfRoPE, 500000.0, (1, 1, 3, 64),
                 torch.tensor([0, 2047, 4095]))]:
            head_dim = shape[-1]
            interleaved = module is InterleavedRoPE
            paths.append(float_case(
                out_dir, FILE, name, "rope", seed, dtype, module(head_dim, base),
                {"head_dim": head_dim, "base": base, "interleaved": interleaved},
                {"x": lambda g, shape=shape: normal(g, shape, dtype),
                 "positions": lambda g, positions=positions: positions},
                conventions={"rope": "pairs (2i, 2i+1)" if interleaved else
                             "halves (i, i + D/2), x * cos + rotate_half(x) * sin"}))
    return paths
