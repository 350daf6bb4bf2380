"""GELU's forward and backward in cache-sized blocks, in place: the values of
layers.activations' gelu_forward and gelu_backward (the reference, whose docstring is the
derivation), bit for bit, except the exact GELU's float32 forward (below).

Faster because each block's few temporaries are reused by in-place operations (the slope of
the backward is built inside dx's own block), the blocks may run on worker threads
(numpy_tf.kernels.blocks), and the exact GELU's erfc is the blocked one of kernels.erf. The
operations, and their order, are the reference's.

The exact GELU in float32 takes one formula for every element of a block, instead of the
reference's two regions, when more than an eighth of the block lies beyond the near region.
With a = |x| and h = Phi(-a) = erfc(a / sqrt 2) / 2, the smaller tail,

    Phi(x) = 1 - h (x >= 0), h (x < 0),   so   y = x Phi(x) = (x + a) / 2 - a h,

and h is half the reference's far formula (core.special: t exp(P(t) - z^2), z = a / sqrt 2,
t = 2 / (2 + z), computed by kernels.erf in the reference's order), which holds near zero too
(relative error below 1.2e-7 for every z >= 0). No element is gathered by
region and (x + a) / 2 is max(x, 0) exactly, so the block is some 35 passes of in-place
arithmetic, about 1.3 times as fast as the two regions on N(0, 1) inputs; a block mostly near
zero, as in a freshly initialised model, runs the two regions, the faster there. Near zero the
reference takes Cody's R1 instead, so the two differ there by a few ulps (the bound is in
tests/test_kernels.py); the far formula's rounding of z^2 (up to ~170 ulps at x = -11.6, in
the reference alike) is shared. A block with |x| > 38 somewhere (erfc's argument past where
the reference clamps it), an inf or a NaN runs the reference's regions (kernels.erf) instead,
bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.special import SMALL
from .blocks import map_blocks
from .erf import erf_block, erfc_fit_float32

_SQRT_HALF = math.sqrt(0.5)
_ONE_FORMULA_LIMIT = 38.0           # |x| up to which the float32 forward takes one formula
_NEAR_ZERO = SMALL / _SQRT_HALF     # |x| of the reference's near-zero region (erfc's |y| <= SMALL)
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


def _gelu_one_formula_float32(x: np.ndarray, a: np.ndarray, out: np.ndarray) -> None:
    """out = (x + a) / 2 - a h, h = erfc(a / sqrt 2) / 2 by float32's far formula (kernels.erf,
    the reference's operations), for one float32 block x with a = |x| <= 38."""
    h = erfc_fit_float32(a * _SQRT_HALF)
    h *= 0.5                                             # h = Phi(-a), exactly halved
    h *= a
    np.add(x, a, out=out)
    out *= 0.5                                           # max(x, 0), exactly
    out -= h
    if not out.all():                                    # a zero has x's sign, as x Phi(x)'s
        np.copysign(out, x, out=out)


def _mostly_far(x: np.ndarray) -> bool:
    """Whether more than 1/8 of a block (judged on every 16th element) lies beyond the
    reference's near-zero region: there the one formula is the faster (at a share of 3 %, as
    in a freshly initialised model, the two regions cost 3.7 ns an element and the one
    formula 5.1; at 18 % 5.9 and 5.3; at 50 %, N(0, 1), 7.5 and 5.6). A block of fewer than
    4096 elements (a decoded token's row) costs its calls more than its arithmetic and runs
    the two regions, without this look."""
    if x.size < 4096:
        return False
    sample = np.abs(x[::16])
    return 8 * np.count_nonzero(sample > _NEAR_ZERO) > sample.size


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

    one_formula = flat.dtype == np.float32

    def evaluate(block: slice) -> None:
        if one_formula and _mostly_far(flat[block]):
            a = np.abs(flat[block])
            if a.max() <= _ONE_FORMULA_LIMIT:                   # False for an inf or a NaN
                _gelu_one_formula_float32(flat[block], a, out[block])
                return
        cdf = erf_block(flat[block] * -_SQRT_HALF, complement=True)
        cdf *= 0.5                                       # Phi(x) = erfc(-x / sqrt 2) / 2
        np.multiply(flat[block], cdf, out=out[block])

    map_blocks(evaluate, flat.size)
    return out.reshape(x.shape)


def gelu_backward_blocks(dout: np.ndarray, x: np.ndarray, out: np.ndarray,
                         approximate: str, *, overwrite_dout: bool = False) -> np.ndarray:
    """dx = dout dy/dx from GELU's input x and output y = out (its cache). With
    overwrite_dout, dx is written into dout's own array and returned (for a C-contiguous dout
    that nobody else holds: layers.mlp.MLP passes the gradient its second Linear has just
    made); each block's slope is then built in a block-sized temporary instead of in dx.
    Either way an element is slope * dout, the same bits."""
    if np.shape(dout) != x.shape:
        raise ValueError(f"dout must have the shape of GELU's output {x.shape}; got "
                         f"{np.shape(dout)}")
    x_flat = np.ascontiguousarray(x).reshape(-1)
    y_flat = np.ascontiguousarray(out).reshape(-1)
    in_place = overwrite_dout and dout.flags.c_contiguous and dout.flags.writeable
    dout_flat = dout.reshape(-1) if in_place else np.ascontiguousarray(dout).reshape(-1)
    dx = dout_flat if in_place else np.empty_like(x_flat)

    def evaluate(block: slice) -> None:
        x = x_flat[block]
        into = None if in_place else dx[block]          # where the slope is built
        if approximate == "none":
            with np.errstate(invalid="ignore"):          # 0 / 0 where x = 0, mended below
                cdf = y_flat[block] / x                  # Phi(x) = y / x
            if not x.all():
                cdf[x == 0] = 0.5
            slope = np.multiply(x, x, out=into)
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
            slope = np.multiply(t, t, out=into)
            np.subtract(1.0, slope, out=slope)
            slope *= du_dx
            slope *= x
            slope += t
            slope += 1.0
            slope *= 0.5
        np.multiply(slope, dout_flat[block], out=dx[block])

    map_blocks(evaluate, x_flat.size)
    return dx.reshape(x.shape)
