"""GELU's forward and backward in cache-sized blocks, in place: the values of
layers.activations' gelu_forward and gelu_backward (the reference, whose docstring is the
derivation), bit for bit, except the exact GELU's float32 forward and backward (below).

Faster because each block's few temporaries are reused by in-place operations (the slope of
the backward is built inside dx's own block), the blocks may run on worker threads
(numpy_tf.kernels.blocks), and the exact GELU's erfc is the blocked one of kernels.erf. The
operations, and their order, are the reference's.

The exact GELU in float32 takes one formula for every element of a block, instead of the
reference's two regions, when more than a quarter of the block lies beyond the near region.
With a = |x| and h = Phi(-a) = erfc(a / sqrt 2) / 2, the smaller tail,

    Phi(x) = 1 - h (x >= 0), h (x < 0),   so   y = x Phi(x) = (x + a) / 2 - a h,

and h is half the reference's far formula (core.special: t exp(P(t) - z^2), z = a / sqrt 2,
t = 2 / (2 + z), computed by kernels.erf in the reference's order), which holds near zero too
(relative error below 1.2e-7 for every z >= 0). No element is gathered by
region and (x + a) / 2 is max(x, 0) exactly, so the block is some 35 passes of in-place
arithmetic, about 1.3 times as fast as the two regions on N(0, 1) inputs. Near zero the
reference takes Cody's R1 instead, so the two differ there by up to 9 ulps of the element
(every third float32 with |x| <= 38 measured: the worst at x = -0.0655, where the one formula
is 9.1 ulps from the exact value and the reference 1.6; tests/test_kernels.py holds the
bound); the far formula's rounding of z^2 (up to ~170 ulps at x = -11.6, in
the reference alike) is shared.

A float32 block mostly near zero, as in a freshly initialised model, takes a fit instead of
Cody's R1 (a rational function, some two dozen passes with the region bookkeeping): on the
near region |x| <= 0.6629 (the reference's |x / sqrt 2| <= 0.46875),

    Phi(x) = 1/2 + x Q(x^2),   y = x Phi(x),

Q a polynomial of degree 4 whose relative error is 7.2e-10 (a hundredth of float32's
rounding): 11 passes in place. The elements with |x| >= 0.66 are then gathered, the whole
array's at once, and recomputed by the reference's operations (kernels.erf picks each one's
region as the reference does), their bits. Every float32 with |x| < 0.66 comes out within 3
ulps of the reference's value and of the exact one (tests/test_kernels.py); on the benchmark
model's GELU inputs, N(0, 0.23^2), the forward takes 2.0 ns an element instead of 3.9.

A float32 block with |x| > 38 somewhere (erfc's argument past where the reference clamps it),
an inf or a NaN runs the reference's regions (kernels.erf) instead, bit for bit, and so do
float64 and blocks of fewer than 4096 elements (a decoded token's row costs its calls more
than its arithmetic).

The exact GELU's float32 backward takes a fit of the slope in a block at most a quarter of
whose elements (judged on every 16th) lie beyond the near region. Its exp is the reference
backward's costliest pass: NumPy's float32 exp takes 1.5 ns an element where it has no AVX-512
loop (an AVX2 machine: some 14 times a multiply's pass). On |x| < 0.66,

    dy/dx = Phi(x) + x phi(x) = 1/2 + x T(x^2),

T a polynomial of degree 4 (relative error 4.4e-9): 10 passes in place, no exp and no
division, and Phi is not read back from y. The elements with |x| >= 0.66 get the reference's
operations (their bits), gathered over the whole array once. Against the reference's slope:
within 24 ulps of the element's own (every 7th float32 with 1e-30 < |x| < 0.66, the worst next
to x = -0.66, where the slope 0.043 is 0.5 less 0.457 and the reference is itself 21 ulps from
the exact value; the fit is 14.7), within 2 of the largest in a block; on each side of zero no
farther from the exact slope than the reference (tests/test_kernels.py). Below 1e-30 the
reference's y / x is far off (x = 1e-44: 0.571 for 0.5) and the fit exact. On the benchmark
model's GELU inputs (small GPT, 16 x 64 x 512, 1 thread, AVX2) the backward took 1.14-1.17
ms instead of 1.44.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.special import SMALL
from .blocks import map_blocks
from .erf import blocked_erfc, erfc_fit_float32

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


def _mostly_far(a: np.ndarray, limit: float = _NEAR_ZERO) -> bool:
    """Whether more than 1/4 of a block with a = |x| (judged on every 16th element) lies
    beyond the reference's near-zero region (a > limit; the backward passes x^2 and its
    fit's limit on x^2): the one formula then runs, else the near fit (and the reference's
    operations for the elements beyond). Measured per element on blocks
    of 32,768 elements (noisy machine, best of three, two runs): at a 14 % share beyond, the
    near fit 3.8-4.0 ns and the one formula 5.3-5.5; at 19 % 4.6-4.7 and 5.8-5.9; at 23 %
    4.5-4.8 and 5.2; at 27 % 5.3 and 5.2-6.0; at 31 % 5.4-6.1 and 5.6-6.4; at 35 % 8.7 and
    7.3. Below the cut the fit is also the more accurate (3 ulps of the reference against 9)."""
    sample = a[::16]
    return 4 * np.count_nonzero(sample > limit) > sample.size


# Phi(x) = 1/2 + x Q(x^2) on |x| <= _NEAR_ZERO: Q of degree 4, fitted to (Phi(x) - 1/2) / x
# on 2,000 Chebyshev nodes of x^2 in [0, _NEAR_ZERO^2] by least squares reweighted towards
# equal relative error (max relative error of Q in float64 7.2e-10, a hundredth of float32's
# rounding), Q(0) = 1 / sqrt(2 pi); lowest degree first
_NEAR_FIT = (0.39894228011581484, -0.06649034778906442, 0.009972970340809587,
             -0.001183576000798533, 0.00010554334475874788)
_NEAR_FIT_LIMIT = 0.66              # |x| below which the reference surely takes the near region


def _gelu_near_float32(x: np.ndarray, out: np.ndarray) -> None:
    """out = x (1/2 + x Q(x^2)) for every element of a finite float32 block x: 11 passes in
    place. Right for |x| < _NEAR_FIT_LIMIT; gelu_forward_blocks recomputes the others."""
    square = x * x
    phi = square * _NEAR_FIT[-1]
    for coefficient in _NEAR_FIT[-2:0:-1]:              # Horner's rule in x^2, in place
        phi += coefficient
        phi *= square
    phi += _NEAR_FIT[0]
    phi *= x
    phi += 0.5                                           # Phi(x)
    np.multiply(x, phi, out=out)


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

    fits = flat.dtype == np.float32     # the one formula, or the near fit, per block
    beyond = []                         # the near-fit blocks' elements left to the reference

    def evaluate(block: slice) -> None:
        if fits and block.stop - block.start >= 4096:
            a = np.abs(flat[block])
            largest = a.max()
            if _mostly_far(a):
                if largest <= _ONE_FORMULA_LIMIT:               # False for an inf or a NaN
                    _gelu_one_formula_float32(flat[block], a, out[block])
                    return
            elif np.isfinite(largest):
                _gelu_near_float32(flat[block], out[block])
                beyond.append(np.flatnonzero(a >= _NEAR_FIT_LIMIT) + block.start)
                return
        _reference_gelu(flat[block], out[block])

    map_blocks(evaluate, flat.size, flat.itemsize)
    if beyond:                          # a few per block: their reference values in one go
        where = np.concatenate(beyond)
        if where.size:
            out[where] = _reference_gelu(flat[where])
    return out.reshape(x.shape)


def _reference_gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2, by the reference's operations (kernels.erf
    picks each element's region as the reference does), into `out` or a new array."""
    cdf = blocked_erfc(x * -_SQRT_HALF)
    cdf *= 0.5
    return np.multiply(x, cdf, out=cdf if out is None else out)


# dy/dx = Phi(x) + x phi(x) = 1/2 + x T(x^2) on |x| <= _NEAR_ZERO: T of degree 4, fitted to
# (Phi(x) - 1/2) / x + phi(x) as Q was (2,000 Chebyshev nodes of x^2, least squares reweighted
# towards equal relative error; max relative error of T in float64 4.4e-9, a fourteenth of
# float32's rounding); lowest degree first
_SLOPE_FIT = (0.7978845573056008, -0.26596112975696196, 0.059834296655006156,
              -0.009453763091997108, 0.0010362555375777877)
_SLOPE_FIT_SQUARE_LIMIT = _NEAR_FIT_LIMIT * _NEAR_FIT_LIMIT   # x^2 below which the fit is taken


def _slope_near_float32(x: np.ndarray, square: np.ndarray, into: np.ndarray | None) -> np.ndarray:
    """dy/dx = 1/2 + x T(x^2) for a finite float32 block x with square = x * x, built in
    `into` (a new array when None): 10 passes. Right where x^2 < _SLOPE_FIT_SQUARE_LIMIT;
    gelu_backward_blocks recomputes the others."""
    slope = np.multiply(square, _SLOPE_FIT[-1], out=into)
    for coefficient in _SLOPE_FIT[-2:0:-1]:             # Horner's rule in x^2, in place
        slope += coefficient
        slope *= square
    slope += _SLOPE_FIT[0]
    slope *= x
    slope += 0.5
    return slope


def _reference_slope(x: np.ndarray, y: np.ndarray, into: np.ndarray | None) -> np.ndarray:
    """dy/dx = Phi(x) + x phi(x), Phi(x) = y / x (1/2 where x = 0), by the reference's
    operations, built in `into` (a new array when None)."""
    with np.errstate(invalid="ignore"):                  # 0 / 0 where x = 0, mended below
        cdf = y / x                                      # Phi(x) = y / x
    if not x.all():
        cdf[x == 0] = 0.5
    slope = np.multiply(x, x, out=into)
    slope *= -0.5
    np.exp(slope, out=slope)
    slope *= _INV_SQRT_2PI                               # phi(x)
    slope *= x
    slope += cdf                                         # Phi(x) + x phi(x)
    return slope


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
    fits = approximate == "none" and x_flat.dtype == np.float32
    beyond = []                     # (where, their dout) of the fitted blocks' elements left

    def evaluate(block: slice) -> None:
        x = x_flat[block]
        into = None if in_place else dx[block]          # where the slope is built
        if approximate == "none":
            if fits and block.stop - block.start >= 4096:
                square = x * x
                if np.isfinite(square.max()) and \
                        not _mostly_far(square, _SLOPE_FIT_SQUARE_LIMIT):
                    slope = _slope_near_float32(x, square, into)
                    where = np.flatnonzero(square >= _SLOPE_FIT_SQUARE_LIMIT) + block.start
                    beyond.append((where, dout_flat[where]))    # before dx overwrites it
                    np.multiply(slope, dout_flat[block], out=dx[block])
                    return
            slope = _reference_slope(x, y_flat[block], into)
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

    map_blocks(evaluate, x_flat.size, x_flat.itemsize)
    if beyond:                      # a few per block: their reference slopes in one go
        where = np.concatenate([where for where, _ in beyond])
        if where.size:
            slope = _reference_slope(x_flat[where], y_flat[where], None)
            dx[where] = slope * np.concatenate([kept for _, kept in beyond])
    return dx.reshape(x.shape)
