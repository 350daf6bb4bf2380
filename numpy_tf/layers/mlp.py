"""Position-wise feed-forward networks: the classic two-layer MLP and SwiGLU.

Both act on each position alone: x (..., C) -> (..., C) through a hidden width F (4C by default
for the MLP; Llama's intermediate_size for SwiGLU).

    MLP:     y = W2 act(W1 x + b1) + b2                      Linear, activation, Linear
    SwiGLU:  y = W_down (silu(W_gate x) * (W_up x))          three Linears, Llama's without
                                                             bias (HF's mlp_bias adds them)
    GeGLU:   y = W_down (gelu_tanh(W_gate x) * (W_up x))     Gemma's: SwiGLU with the tanh
                                                             GELU as the gate

SwiGLU is not the MLP with its activation renamed: it has two input projections, one of them
gating the other through silu.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Sequential, SequentialCache
from .activations import (GELU, GELUCache, SiLUCache, activation, gelu_backward, gelu_forward,
                          silu_backward, silu_forward)

GATES = ("silu", "gelu_tanh")       # SwiGLU's silu (Llama) and GeGLU's tanh GELU (Gemma)
from .linear import Linear, LinearCache, LinearKernelCache, linear_backward, linear_forward


def feedforward(width: int, hidden: int | None = None, activation_name: str = "gelu",
                bias: bool = True, *, rng: np.random.Generator | int = 0,
                dtype=np.float64) -> "MLP":
    """MLP(Linear(C, F), activation, Linear(F, C)), a Sequential: parameters `0.weight`,
    `0.bias`, `2.weight`, `2.bias`, as torch.nn.Sequential names them (the activation is
    module 1)."""
    width = validate.positive_int("width", width)
    hidden = 4 * width if hidden is None else validate.positive_int("hidden", hidden)
    rng = np.random.default_rng(rng)
    return MLP(Linear(width, hidden, bias, rng=rng, dtype=dtype),
               activation(activation_name, dtype),
               Linear(hidden, width, bias, rng=rng, dtype=dtype), dtype=dtype)


class MLP(Sequential):
    """The classic feed-forward, Sequential(Linear, activation, Linear), as `feedforward`
    builds it: Sequential's forward and backward, but for one thing. When the kernel tier ran a
    GELU after a Linear, backward lets GELU write its gradient into the (..., F) gradient the
    second Linear's backward has just returned, instead of into a new array: that array was
    made by this backward and nobody else holds it, so no module's backward writes into what
    it was given. The values are the same bits (kernels.gelu: each element is slope * dout
    either way); this backward's peak is one (..., F) array lower. At the benchmarks' small
    float32 GPT, whose step peaked here, the step's peak fell from 44.78 to 44.31 MB (the peak
    then moved to attention's backward). Any other content, a reference-path cache, or a module
    whose backward is watched on the instance (record_activations, rounding_every_module:
    Module.backward_is_watched) runs Sequential's backward unchanged."""

    def backward(self, dout: np.ndarray, cache: SequentialCache):
        validate.cache_kind(cache, SequentialCache)
        modules = list(self)
        if len(modules) != 3 or len(cache.caches) != 3:
            return super().backward(dout, cache)
        first, act, second = modules
        first_cache, act_cache, second_cache = cache.caches
        if not (type(act) is GELU and type(second) is Linear and
                type(second_cache) is LinearKernelCache and
                not act.backward_is_watched() and not second.backward_is_watched()):
            return super().backward(dout, cache)
        dhidden = second.backward(dout, second_cache)   # a new array (kernels.linear's dx)
        dhidden = act.backward(dhidden, act_cache, overwrite_dout=True)
        return first.backward(dhidden, first_cache)


# -- the SwiGLU gate ----------------------------------------------------------------------------
class GateCache(NamedTuple):
    act: SiLUCache | GELUCache  # the gate activation's cache of g = W_gate x
    activated: np.ndarray       # (..., F) a = act(g)
    up: np.ndarray              # (..., F) u = W_up x

    @property
    def output_spec(self):  # the (shape, dtype) dhidden must have
        return self.up.shape, self.up.dtype


def swiglu_gate_forward(gate: np.ndarray, up: np.ndarray, activation: str = "silu"):
    """h = act(g) * u, elementwise; act is silu (SwiGLU) or the tanh GELU (GeGLU)."""
    validate.same_dtype(gate=gate, up=up)
    validate.choice("activation", activation, GATES)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape; got {gate.shape} and "
                         f"{up.shape}")
    if activation == "silu":
        activated, act_cache = silu_forward(gate)
    else:
        activated, act_cache = gelu_forward(gate, "tanh")
    return activated * up, GateCache(act_cache, activated, up)


def swiglu_gate_backward(dhidden: np.ndarray, cache: GateCache):
    """h = a u with a = act(g), so by the product rule
        du = dh a          and       da = dh u,  dg = act'(g) da
    (silu's derivative sigma(g) (1 + g (1 - sigma(g))), or the tanh GELU's, each derived in
    activations.py). Returns (dgate, dup)."""
    validate.backward_inputs(dhidden, cache, GateCache, "dhidden")
    act_cache, activated, up = cache
    if isinstance(act_cache, SiLUCache):
        dgate = silu_backward(dhidden * up, act_cache)
    else:
        dgate = gelu_backward(dhidden * up, act_cache)
    return dgate, dhidden * activated


class SwiGLUCache(NamedTuple):
    gate: LinearCache           # x, W_gate
    up: LinearCache             # x, W_up
    product: GateCache          # silu's cache of g, a = silu(g), u
    down: LinearCache           # h, W_down

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.down.output_spec


def swiglu_forward(x: np.ndarray, gate_weight: np.ndarray, up_weight: np.ndarray,
                   down_weight: np.ndarray, gate_bias: np.ndarray | None = None,
                   up_bias: np.ndarray | None = None, down_bias: np.ndarray | None = None,
                   activation: str = "silu"):
    """y = W_down (silu(W_gate x + b_gate) * (W_up x + b_up)) + b_down, as HF's LlamaMLP
    (activation "gelu_tanh": GeGLU, HF's GemmaMLP). x (..., C), weights (F, C), (F, C),
    (C, F), optional biases (F,), (F,), (C,) -> y (..., C). Llama has no biases
    (mlp_bias=False); HF's config can ask for them."""
    validate.float_array("x", x, min_ndim=1, shape="(..., C)")
    for name, weight in (("gate_weight", gate_weight), ("up_weight", up_weight),
                         ("down_weight", down_weight)):
        validate.float_array(name, weight, ndim=2, shape="(F, C) or (C, F)")
    hidden, width = gate_weight.shape
    if up_weight.shape != (hidden, width) or down_weight.shape != (width, hidden):
        raise ValueError(f"gate_weight (F, C), up_weight (F, C) and down_weight (C, F) must "
                         f"agree; got {gate_weight.shape}, {up_weight.shape} and "
                         f"{down_weight.shape}")
    g, gate_cache = linear_forward(x, gate_weight, gate_bias)       # (..., F)
    u, up_cache = linear_forward(x, up_weight, up_bias)             # (..., F)
    h, product_cache = swiglu_gate_forward(g, u, activation)        # (..., F)
    y, down_cache = linear_forward(h, down_weight, down_bias)       # (..., C)
    return y, SwiGLUCache(gate_cache, up_cache, product_cache, down_cache)


def swiglu_backward(dout: np.ndarray, cache: SwiGLUCache):
    """The forward in reverse, with dout = dL/dy:

        y = W_down h + b_down:    dh = dout W_down,    dW_down = dout^T h,  db_down = sum dout
        h = a u, a = silu(g):     du = dh a,           dg = silu'(g) (dh u)
                                  (swiglu_gate_backward; silu'(g) = s (1 + g (1 - s)),
                                   s = sigma(g), derived in activations.py)
        g = W_gate x + b_gate:    dW_gate = dg^T x,    db_gate = sum dg
        u = W_up x + b_up:        dW_up = du^T x,      db_up = sum du

    x feeds both input projections, so its gradient is the sum of the two paths:

        dx = dg W_gate + du W_up.

    The sums run over every leading (batch, time) position. Cached: x and the weights (in the
    Linear caches), g's sigmoid, a and u (no exp is recomputed). Returns (dx, dgate_weight,
    dup_weight, ddown_weight, dgate_bias, dup_bias, ddown_bias); a bias gradient is None
    where the forward had no bias.
    """
    validate.backward_inputs(dout, cache, SwiGLUCache)
    dh, ddown, ddown_bias = linear_backward(dout, cache.down)       # (..., F)
    dg, du = swiglu_gate_backward(dh, cache.product)                # (..., F) each
    dx_gate, dgate, dgate_bias = linear_backward(dg, cache.gate)    # (..., C)
    dx_up, dup, dup_bias = linear_backward(du, cache.up)            # (..., C)
    return dx_gate + dx_up, dgate, dup, ddown, dgate_bias, dup_bias, ddown_bias


class SwiGLU(Module):
    """Llama's MLP (HF LlamaMLP): gate_proj (F, C), up_proj (F, C), down_proj (C, F), without
    biases unless bias=True (HF's mlp_bias). Initialised as torch.nn.Linear. With
    activation="gelu_tanh" it is GeGLU, Gemma's MLP (HF's gelu_pytorch_tanh gate)."""

    def __init__(self, width: int, hidden: int, bias: bool = False, *,
                 activation: str = "silu", rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        validate.choice("activation", activation, GATES)
        self.activation = activation
        width = validate.positive_int("width", width)
        hidden = validate.positive_int("hidden", hidden)
        rng = np.random.default_rng(rng)
        self.gate_proj = Linear(width, hidden, bias, rng=rng, dtype=dtype)
        self.up_proj = Linear(width, hidden, bias, rng=rng, dtype=dtype)
        self.down_proj = Linear(hidden, width, bias, rng=rng, dtype=dtype)

    def _projections(self) -> tuple[Linear, Linear, Linear]:
        return self.gate_proj, self.up_proj, self.down_proj

    def forward(self, x):
        weights = [layer.weight.data for layer in self._projections()]
        biases = [None if layer.bias is None else layer.bias.data
                  for layer in self._projections()]
        return swiglu_forward(x, *weights, *biases, self.activation)

    def backward(self, dout, cache):
        if isinstance(cache, SwiGLUCache):
            for layer, linear_cache in zip(self._projections(), (cache.gate, cache.up,
                                                                  cache.down)):
                layer.check_cache(linear_cache)
        dx, *grads = swiglu_backward(dout, cache)
        for layer, dweight, dbias in zip(self._projections(), grads[:3], grads[3:]):
            layer.weight.grad += dweight
            if layer.bias is not None:
                layer.bias.grad += dbias
        return dx
