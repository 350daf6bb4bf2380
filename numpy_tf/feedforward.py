"""Position-wise feed-forward networks: the classic two-layer MLP and SwiGLU.

Both act on each position alone: x (..., C) -> (..., C) through a hidden width F (4C by default
for the MLP; Llama's intermediate_size for SwiGLU).

    MLP:     y = W2 act(W1 x + b1) + b2                      Linear, activation, Linear
    SwiGLU:  y = W_down (silu(W_gate x) * (W_up x))          three Linears without bias

SwiGLU is not the MLP with its activation renamed: it has two input projections, one of them
gating the other through silu (the seed material makes the same point).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validate
from .activations import SiLUCache, activation, silu_backward, silu_forward
from .core import Module, Sequential
from .linear import Linear, LinearCache, linear_backward, linear_forward


def feedforward(width: int, hidden: int | None = None, activation_name: str = "gelu",
                bias: bool = True, *, rng: np.random.Generator | int = 0,
                dtype=np.float64) -> Sequential:
    """Sequential(Linear(C, F), activation, Linear(F, C)): parameters `0.weight`, `0.bias`,
    `2.weight`, `2.bias`, as torch.nn.Sequential names them (the activation is module 1)."""
    width = validate.positive_int("width", width)
    hidden = 4 * width if hidden is None else validate.positive_int("hidden", hidden)
    rng = np.random.default_rng(rng)
    return Sequential(Linear(width, hidden, bias, rng=rng, dtype=dtype),
                      activation(activation_name, dtype),
                      Linear(hidden, width, bias, rng=rng, dtype=dtype), dtype=dtype)


# -- the SwiGLU gate ----------------------------------------------------------------------------
class GateCache(NamedTuple):
    silu: SiLUCache             # silu's cache of g = W_gate x
    activated: np.ndarray       # (..., F) a = silu(g)
    up: np.ndarray              # (..., F) u = W_up x


def swiglu_gate_forward(gate: np.ndarray, up: np.ndarray):
    """h = silu(g) * u, elementwise."""
    validate.same_dtype(gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape; got {gate.shape} and "
                         f"{up.shape}")
    activated, silu_cache = silu_forward(gate)
    return activated * up, GateCache(silu_cache, activated, up)


def swiglu_gate_backward(dhidden: np.ndarray, cache: GateCache):
    """h = a u with a = silu(g), so by the product rule
        du = dh a          and       da = dh u,  dg = silu_backward(da)
    (silu's own derivative, sigma(g) (1 + g (1 - sigma(g))), derived in activations.py).
    Returns (dgate, dup)."""
    silu_cache, activated, up = cache
    return silu_backward(dhidden * up, silu_cache), dhidden * activated


class SwiGLUCache(NamedTuple):
    gate: LinearCache
    up: LinearCache
    product: GateCache
    down: LinearCache


def swiglu_forward(x: np.ndarray, gate_weight: np.ndarray, up_weight: np.ndarray,
                   down_weight: np.ndarray):
    """y = W_down (silu(W_gate x) * (W_up x)); weights (F, C), (F, C), (C, F)."""
    g, gate_cache = linear_forward(x, gate_weight)                  # (..., F)
    u, up_cache = linear_forward(x, up_weight)                      # (..., F)
    h, product_cache = swiglu_gate_forward(g, u)                    # (..., F)
    y, down_cache = linear_forward(h, down_weight)                  # (..., C)
    return y, SwiGLUCache(gate_cache, up_cache, product_cache, down_cache)


def swiglu_backward(dout: np.ndarray, cache: SwiGLUCache):
    """The forward in reverse: the down projection, the gate (swiglu_gate_backward), then both
    input projections, whose input gradients add (x feeds both):
        dx = dg W_gate + du W_up.
    Returns (dx, dgate_weight, dup_weight, ddown_weight)."""
    dh, ddown, _ = linear_backward(dout, cache.down)
    dg, du = swiglu_gate_backward(dh, cache.product)
    dx_gate, dgate, _ = linear_backward(dg, cache.gate)
    dx_up, dup, _ = linear_backward(du, cache.up)
    return dx_gate + dx_up, dgate, dup, ddown


class SwiGLU(Module):
    """Llama's MLP: gate_proj (F, C), up_proj (F, C), down_proj (C, F), no biases (HF names)."""

    def __init__(self, width: int, hidden: int, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        self.gate_proj = Linear(width, hidden, bias=False, rng=rng, dtype=dtype)
        self.up_proj = Linear(width, hidden, bias=False, rng=rng, dtype=dtype)
        self.down_proj = Linear(hidden, width, bias=False, rng=rng, dtype=dtype)

    def forward(self, x):
        return swiglu_forward(x, self.gate_proj.weight.data, self.up_proj.weight.data,
                              self.down_proj.weight.data)

    def backward(self, dout, cache):
        dx, dgate, dup, ddown = swiglu_backward(dout, cache)
        self.gate_proj.weight.grad += dgate
        self.up_proj.weight.grad += dup
        self.down_proj.weight.grad += ddown
        return dx
