"""GELU's forward and backward in cache-sized blocks, in place: the values of
layers.activations' gelu_forward and gelu_backward (the reference, whose docstring is the
derivation), bit for bit.

Faster because each block's few temporaries are reused by in-place operations (the slope of
the backward is built inside dx's own block), the blocks may run on worker threads
(numpy_tf.kernels.blocks), and the exact GELU's erfc is the blocked one of kernels.erf. The
operations, and their order, are the reference's.
"""
from __future__ import annotations

import math

import numpy as np

from .blocks import map_blocks
from .erf import erf_block

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715


def _tanh_of_u(x: np.ndarray) -> np.ndarray:
    """t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3), in one array."""
    u = x * x
    u *= x
    u *= _TANH_CUBIC
    u += x
    u *= _SQRT_2_OVER_PI
    return np.tanh(u, out=u)


def gelu_forward_blocks(x: np.ndarray, approximate: str) -> np.ndarray:
    """y = x Phi(x) (approximate="none") or x (1 + t) / 2 ("tanh"), for an x the caller has
    checked."""
    if approximate != "none":
        out = _tanh_of_u(x)
        out += 1.0
        out *= x * 0.5                                   # torch's order: 0.5 x (1 + t)
        return out
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)

    def evaluate(block: slice) -> None:
        cdf = erf_block(flat[block] * -_SQRT_HALF, complement=True)
        cdf *= 0.5                                       # Phi(x) = erfc(-x / sqrt 2) / 2
        np.multiply(flat[block], cdf, out=out[block])

    map_blocks(evaluate, flat.size)
    return out.reshape(x.shape)


def gelu_backward_blocks(dout: np.ndarray, x: np.ndarray, out: np.ndarray,
                         approximate: str) -> np.ndarray:
    """dx = dout dy/dx from GELU's input x and output y = out (its cache)."""
    if np.shape(dout) != x.shape:
        raise ValueError(f"dout must have the shape of GELU's output {x.shape}; got "
                         f"{np.shape(dout)}")
    x_flat = np.ascontiguousarray(x).reshape(-1)
    y_flat = np.ascontiguousarray(out).reshape(-1)
    dout_flat = np.ascontiguousarray(dout).reshape(-1)
    dx = np.empty_like(x_flat)

    def evaluate(block: slice) -> None:
        x = x_flat[block]
        if approximate == "none":
            with np.errstate(invalid="ignore"):          # 0 / 0 where x = 0, mended below
                cdf = y_flat[block] / x                  # Phi(x) = y / x
            if not x.all():
                cdf[x == 0] = 0.5
            slope = np.multiply(x, x, out=dx[block])     # built in dx's own block
            slope *= -0.5
            np.exp(slope, out=slope)
            slope *= _INV_SQRT_2PI                       # phi(x)
            slope *= x
            slope += cdf                                 # Phi(x) + x phi(x)
        else:
            t = _tanh_of_u(x)
            du_dx = x * x
            du_dx *= 3.0 * _TANH_CUBIC
            du_dx += 1.0
            du_dx *= _SQRT_2_OVER_PI
            slope = np.multiply(t, t, out=dx[block])
            np.subtract(1.0, slope, out=slope)
            slope *= du_dx
            slope *= x
            slope += t
            slope += 1.0
            slope *= 0.5
        slope *= dout_flat[block]

    map_blocks(evaluate, x_flat.size)
    return dx.reshape(x.shape)
