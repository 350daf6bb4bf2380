"""Fixtures for absolute positions: a learned table (torch.nn.Embedding looked up at positions
offset .. offset + T - 1 and added to x) and the sinusoidal table (computed here in torch, in the
case's dtype), float64 and float32."""
from __future__ import annotations

import torch
from torch import nn

from common import DTYPES, float_case, normal

FILE = "positions.py"


class LearnedPositions(nn.Embedding):
    """x (B, T, C) + Embedding(max_context, C) at positions offset .. offset + T - 1."""

    def forward(self, x, offset):
        positions = torch.arange(int(offset), int(offset) + x.shape[1])
        return x + super().forward(positions)


class SinusoidalPositions(nn.Module):
    """x (B, T, C) + PE, PE(t, 2i) = sin(t w_i), PE(t, 2i+1) = cos(t w_i),
    w_i = 1 / 10000^(2i / C), every step in x's dtype."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def forward(self, x, offset):
        length, dtype = x.shape[1], x.dtype
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.width, 2, dtype=dtype) / self.width))
        positions = torch.arange(int(offset), int(offset) + length).to(dtype)
        angles = positions[:, None] * inv_freq[None, :]                  # (T, C/2)
        table = torch.zeros(length, self.width, dtype=dtype)
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)
        return x + table


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        for name, seed, (max_context, width, length, offset) in [
                ("learned_positions", 31, (7, 6, 4, 0)),
                # the last rows: positions 4, 5, 6 of a 7-row table
                ("learned_positions_offset", 32, (7, 6, 3, 4))]:
            paths.append(float_case(
                out_dir, FILE, name, "learned_positions", seed, dtype,
                LearnedPositions(max_context, width),
                {"max_context": max_context, "width": width},
                {"x": lambda g: normal(g, (2, length, width), dtype),
                 "offset": lambda g: torch.tensor(offset)},
                conventions={"positions": "x + weight[offset : offset + T]"}))
        for name, seed, (width, length, offset) in [
                ("sinusoidal_positions", 33, (6, 5, 0)),
                ("sinusoidal_positions_offset", 34, (8, 4, 1000))]:
            paths.append(float_case(
                out_dir, FILE, name, "sinusoidal_positions", seed, dtype,
                SinusoidalPositions(width), {"width": width},
                {"x": lambda g: normal(g, (2, length, width), dtype),
                 "offset": lambda g: torch.tensor(offset)},
                conventions={"positions": "PE(t, 2i) = sin(t 10000^(-2i/C)), "
                                          "PE(t, 2i+1) = cos(...)"}))
    return paths
