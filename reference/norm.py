"""Fixtures for LayerNorm and RMSNorm, from torch.nn.LayerNorm and torch.nn.RMSNorm themselves,
float64 and float32, including rows whose variance is far below eps (eps dominates)."""
from __future__ import annotations

import torch
from torch import nn

from common import DTYPES, float_case, normal

FILE = "norm.py"


def _flat_rows(dtype: str, width: int, offset: float):
    """Four rows of `width` features: exactly constant at `offset`, exactly constant at -2
    (dyadic values, so every mean is exact in float32 too), tiny noise of std 1e-4 around 0
    (variance 1e-8, far below eps), and an ordinary N(0, 1) row."""
    def draw(g):
        rows = torch.stack([
            torch.full((width,), offset, dtype=torch.float64),
            torch.full((width,), -2.0, dtype=torch.float64),
            normal(g, (width,), "float64", 1e-4),
            normal(g, (width,), "float64")])
        return rows.to(DTYPES[dtype])
    return draw


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        def x(shape, std=1.0, shift=0.0):
            return lambda g: normal(g, shape, dtype, std) + shift

        def layernorm(name, seed, width, inputs, eps=1e-5, elementwise_affine=True, bias=True):
            config = {"normalized_shape": width, "eps": eps,
                      "elementwise_affine": elementwise_affine, "bias": bias}
            module = nn.LayerNorm(width, eps, elementwise_affine, bias)
            paths.append(float_case(
                out_dir, FILE, name, "layernorm", seed, dtype, module, config, inputs,
                conventions={"layernorm": "last axis, biased variance, eps inside the sqrt"}))

        def rmsnorm(name, seed, width, inputs, eps, elementwise_affine=True):
            config = {"normalized_shape": width, "eps": eps,
                      "elementwise_affine": elementwise_affine}
            module = nn.RMSNorm(width, eps, elementwise_affine)
            paths.append(float_case(
                out_dir, FILE, name, "rmsnorm", seed, dtype, module, config, inputs,
                conventions={"rmsnorm": "w * x / sqrt(mean(x^2) + eps), last axis"}))

        layernorm("layernorm", 21, 8, {"x": x((2, 3, 8), 2.0, 1.5)})
        layernorm("layernorm_nobias", 22, 6, {"x": x((4, 6), 3.0)}, eps=1e-3, bias=False)
        layernorm("layernorm_noaffine", 23, 5, {"x": x((2, 2, 5))}, elementwise_affine=False)
        layernorm("layernorm_flat_rows", 24, 8, {"x": _flat_rows(dtype, 8, 0.5)})
        rmsnorm("rmsnorm", 26, 8, {"x": x((2, 3, 8), 2.0, 0.5)}, 1e-6)
        rmsnorm("rmsnorm_noaffine", 27, 5, {"x": x((4, 5))}, 1e-5, elementwise_affine=False)
        rmsnorm("rmsnorm_flat_rows", 28, 8, {"x": _flat_rows(dtype, 8, 0.0)}, 1e-6)
    return paths
