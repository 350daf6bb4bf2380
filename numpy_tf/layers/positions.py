"""Absolute positions added to the token embeddings: a learned table, or fixed sinusoids.

Shapes: x (B, T, C) token embeddings -> out (B, T, C) = x + P[offset : offset + T], where P is

- a learned (max_context, C) table (GPT-2's `wpe`; torch nn.Embedding(max_context, C) looked up
  at positions offset .. offset + T - 1), or
- the sinusoidal table of "Attention Is All You Need" (no parameters, C even):

      PE(t, 2i)     = sin(t omega_i)
      PE(t, 2i + 1) = cos(t omega_i),        omega_i = 10000^(-2i / C),  i = 0 .. C/2 - 1

`offset` is the position of x's first token: 0 for a whole sequence, the number of tokens
already processed when decoding with a KV cache. A learned table has no row for a position
>= max_context, so a longer input is refused (SPEC §5); the sinusoids extend to any length.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter, float_dtype
from .embedding import normal_init

SINUSOID_BASE = 10000.0


def inverse_frequencies(width: int, base: float, dtype) -> np.ndarray:
    """omega_i = 1 / base^(2i / width), i = 0 .. width/2 - 1, (width/2,), in `dtype`, with the
    operations of HF transformers' RoPE (`1.0 / (base ** (arange(0, D, 2, dtype) / D))`), so a
    float32 table matches its float32 model.

    The power alone is taken in float64 and rounded once to `dtype`: torch's float32 pow is
    (almost always) correctly rounded, NumPy's is off by up to 0.9 ulp (9 of the 64 entries
    differ for head_dim 128), and at position 4096 one ulp of omega moves the angle by 2e-4.
    The exponents, the reciprocal and everything after stay in `dtype`."""
    width = validate.even_positive_int("width", width, "sin and cos in pairs")
    base = validate.number("base", base, low=0.0, low_open=True)
    dtype = float_dtype(dtype)
    exponents = np.arange(0, width, 2, dtype=dtype) / width                 # (width/2,) 2i/width
    powers = (base ** exponents.astype(np.float64)).astype(dtype)           # base^(2i/width)
    return 1.0 / powers


def sinusoidal_table(length: int, width: int, dtype=np.float64, offset: int = 0) -> np.ndarray:
    """PE for positions offset .. offset + length - 1: (length, width), computed in `dtype`
    (positions, frequencies, angles, sin and cos all in that dtype)."""
    width = validate.even_positive_int("width", width, "sin and cos fill the pairs (2i, 2i+1)")
    length = validate.non_negative_int("length", length)
    offset = validate.non_negative_int("offset", offset)
    dtype = float_dtype(dtype)
    positions = np.arange(offset, offset + length).astype(dtype)            # (T,)
    angles = positions[:, None] * inverse_frequencies(width, SINUSOID_BASE, dtype)  # (T, C/2)
    table = np.empty((length, width), dtype=dtype)                          # (T, C)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table


# -- learned positions ------------------------------------------------------------------------
class LearnedPositionsCache(NamedTuple):
    offset: int             # the position of x's first token
    length: int             # T, the number of positions looked up
    max_context: int        # the table's rows, for dweight's shape
    x_shape: tuple          # (B, T, C), the output's shape
    dtype: np.dtype         # x's and the table's, the output's

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_shape, self.dtype


def learned_positions_forward(x: np.ndarray, weight: np.ndarray, offset=0):
    """out = x + weight[offset : offset + T]. x (B, T, C), weight (max_context, C)."""
    validate.float_array("x", x, ndim=3, shape="(B, T, C)")
    validate.float_array("weight", weight, ndim=2, shape="(max_context, C)")
    validate.same_dtype(weight=weight, x=x)
    validate.last_dim("x", x, weight.shape[1], "the position table's width C")
    offset = validate.non_negative_int("offset", offset)
    length, max_context = x.shape[1], weight.shape[0]
    if offset + length > max_context:
        raise ValueError(
            f"x has T={length} tokens at offset {offset}, so it needs positions {offset} .. "
            f"{offset + length - 1}, but the learned position table has max_context="
            f"{max_context} rows (positions 0 .. {max_context - 1}); a learned table has no "
            "row beyond its last, so crop the input (and any cached context) to fit")
    out = x + weight[offset:offset + length]                        # (B, T, C)
    return out, LearnedPositionsCache(offset, length, max_context, x.shape, x.dtype)


def learned_positions_backward(dout: np.ndarray, cache: LearnedPositionsCache):
    """out[b, t] = x[b, t] + W[offset + t], so

        dx[b, t]           = dout[b, t]
        dW[offset + t]     = sum_b dout[b, t]      (row offset + t is used once per batch row)
        dW[other rows]     = 0

    Nothing but the offset, T and the table's size is cached. Returns (dx, dweight); dx is a
    new array (not dout itself), so a caller may add into it in place.
    """
    validate.backward_inputs(dout, cache, LearnedPositionsCache)
    offset, length, max_context, _, _ = cache
    dx = dout.copy()                                                            # (B, T, C)
    dweight = np.zeros((max_context, dout.shape[-1]), dtype=dout.dtype)         # (max_context, C)
    dweight[offset:offset + length] = dout.sum(axis=0)
    return dx, dweight


# -- sinusoidal positions ---------------------------------------------------------------------
class SinusoidalPositionsCache(NamedTuple):
    x_shape: tuple          # (B, T, C), the output's shape
    dtype: np.dtype         # x's, the output's

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_shape, self.dtype


def sinusoidal_positions_forward(x: np.ndarray, offset=0):
    """out = x + PE[offset : offset + T], the table built in x's dtype. x (B, T, C), C even.
    The derivative of a constant shift needs nothing: the cache holds only the output's shape
    and dtype, for the check of dout."""
    validate.float_array("x", x, ndim=3, shape="(B, T, C)")
    if x.shape[-1] % 2:
        raise ValueError("x must have an even last dimension C for sinusoidal positions (sin "
                         f"and cos fill the pairs (2i, 2i+1)); got shape {x.shape}")
    table = sinusoidal_table(x.shape[1], x.shape[2], x.dtype, offset)          # (T, C)
    return x + table, SinusoidalPositionsCache(x.shape, x.dtype)


def sinusoidal_positions_backward(dout: np.ndarray, cache: SinusoidalPositionsCache | None):
    """out = x + PE with PE constant, so dx = dout (a new array, as above). The derivative
    needs no cache: with None, dout is checked only for being a float array."""
    if cache is None:
        validate.float_array("dout", dout)
    else:
        validate.backward_inputs(dout, cache, SinusoidalPositionsCache)
    return dout.copy()


# -- thin classes -----------------------------------------------------------------------------
class LearnedPositions(Module):
    """A learned position table added to x (B, T, C): Parameter `weight` (max_context, width),
    N(0, 1) at init as torch.nn.Embedding(max_context, width) (a model may re-initialise it).
    As a model's `positions` attribute its name is `positions.weight`.
    forward(x, offset=0) -> (x + weight[offset : offset + T], cache)."""

    def __init__(self, max_context: int, width: int, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        self.max_context = validate.positive_int("max_context", max_context)
        self.width = validate.positive_int("width", width)
        self.weight = Parameter(normal_init(np.random.default_rng(rng),
                                            (self.max_context, self.width), 1.0, self.dtype))

    def forward(self, x, offset=0):
        return learned_positions_forward(x, self.weight.data, offset)

    def backward(self, dout, cache):
        if isinstance(cache, LearnedPositionsCache):
            validate.cache_fits("weight", ((cache.max_context, cache.x_shape[-1]), cache.dtype),
                                self.weight.data)
        dx, dweight = learned_positions_backward(dout, cache)
        self.weight.grad += dweight
        return dx


class SinusoidalPositions(Module):
    """The fixed sinusoidal table added to x (B, T, width); no parameters, width even.
    forward(x, offset=0) -> (x + PE[offset : offset + T], cache); backward is the identity."""

    def __init__(self, width: int, dtype=np.float64):
        super().__init__(dtype)
        self.width = validate.even_positive_int("width", width,
                                                "sin and cos fill the pairs (2i, 2i+1)")

    def forward(self, x, offset=0):
        validate.float_array("x", x, ndim=3, shape="(B, T, C)")
        validate.last_dim("x", x, self.width, "the sinusoidal width")
        return sinusoidal_positions_forward(x, offset)

    def backward(self, dout, cache):
        return sinusoidal_positions_backward(dout, cache)
