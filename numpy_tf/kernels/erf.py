"""erf and erfc in cache-sized blocks, in place: the values of numpy_tf.core.special's erf and
erfc (the reference, which states the formulas), bit for bit, computed faster.

What makes it faster, in words:
- Horner's rule runs in place, so a polynomial makes no temporaries (float32 has no cheaper
  passes than float64 otherwise, and a fresh array per operation doubled its time).
- The array is cut into blocks (numpy_tf.kernels.blocks), on worker threads if so configured.
- Each region's formula runs on that region's elements, gathered by index (a boolean mask's
  gather and scatter cost several times more when the regions interleave at random), except
  when at least half a block lies near zero (|x| <= 0.46875), as GELU's inputs mostly do: the
  near-zero formula then runs on the whole block, which costs less than a gather and a
  scatter, and the other regions overwrite their own elements afterwards. float32's erfc,
  whose far formula holds for every |x|, has only these two paths: the near-zero formula on
  the whole block when at least 30% of it lies near zero (the share where the two cost the
  same), else the far formula on the whole block with the near elements overwritten.
- erfc(-y) = 2 - erfc(y) is written as (1 - sign) + sign erfc(y) with sign = +-1, which is
  exactly erfc(y) for x >= 0 and one rounding of 2 - erfc(y) for x < 0: arithmetic instead of
  a masked subtraction, which is slow on signs in random order.
Every element's value is its region's formula evaluated in the same order of operations as the
reference, whatever its neighbours.
"""
from __future__ import annotations

import numpy as np

from ..core import special
from ..core.special import (MEDIUM, NR_ERFC, ONE_OVER_SQRT_PI, R1_DENOMINATOR, R1_NUMERATOR,
                            R2_DENOMINATOR, R2_NUMERATOR, R3_DENOMINATOR, R3_NUMERATOR, SMALL,
                            UNDERFLOW)
from .blocks import block_size, map_blocks


# -- the region formulas in place (special.erf_near_zero, ... in the same order) -------------
def _polynomials(z: np.ndarray, numerator_coefficients, denominator_coefficients):
    """Cody's numerator and denominator at z by Horner's rule, in place: p[-1] z^n + p[0]
    z^(n-1) + ... + p[-2] (the leading coefficient is stored last) and z^m + q[0] z^(m-1) +
    ... + q[-1], in the reference's order of operations."""
    p, q = numerator_coefficients, denominator_coefficients
    numerator = p[-1] * z
    for coefficient in p[:-2]:
        numerator += coefficient
        numerator *= z
    numerator += p[-2]
    denominator = z + q[0]
    for coefficient in q[1:]:
        denominator *= z
        denominator += coefficient
    return numerator, denominator


def _erf_near_zero(x: np.ndarray) -> np.ndarray:
    numerator, denominator = _polynomials(x * x, R1_NUMERATOR, R1_DENOMINATOR)
    numerator *= x
    numerator /= denominator
    return numerator


def _split_square(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s^2, (y - s)(y + s)), s = floor(16 y) / 16."""
    s = np.floor(y * 16.0)
    s /= 16.0
    rest = y - s
    rest *= y + s
    s *= s
    return s, rest


def _exp_minus_square(y: np.ndarray) -> np.ndarray:
    square, rest = _split_square(y)
    np.negative(rest, out=rest)
    np.exp(rest, out=rest)
    np.negative(square, out=square)
    np.exp(square, out=square)
    square *= rest
    return square


def erfc_fit_float32(y: np.ndarray) -> np.ndarray:
    """special.erfc_fit_float32 in place: erfc(y) = t exp(P(t) - y^2), t = 2 / (2 + y), the
    far formula of float32 (kernels.gelu also takes it for every element of a block)."""
    y = np.minimum(y, UNDERFLOW)
    t = y + 2.0
    np.divide(2.0, t, out=t)
    polynomial = t * NR_ERFC[9]
    for coefficient in NR_ERFC[8:0:-1]:
        polynomial += coefficient
        polynomial *= t
    polynomial += NR_ERFC[0]
    square, rest = _split_square(y)
    polynomial -= rest
    np.exp(polynomial, out=polynomial)
    np.negative(square, out=square)
    np.exp(square, out=square)
    polynomial *= square
    polynomial *= t
    return polynomial


def _erfc_medium(y: np.ndarray) -> np.ndarray:
    numerator, denominator = _polynomials(y, R2_NUMERATOR, R2_DENOMINATOR)
    numerator /= denominator
    numerator *= _exp_minus_square(y)
    return numerator


def _erfc_large(y: np.ndarray) -> np.ndarray:
    y = np.minimum(y, UNDERFLOW)
    z = 1.0 / (y * y)
    numerator, denominator = _polynomials(z, R3_NUMERATOR, R3_DENOMINATOR)
    numerator *= z
    numerator /= denominator                # the tail R3(1/y^2) / y^2
    np.subtract(ONE_OVER_SQRT_PI, numerator, out=numerator)
    numerator /= y
    numerator *= _exp_minus_square(y)
    return numerator


def _erfc_beyond(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 0.46875 (and inf, NaN): R2 on min(y, 4) everywhere, R3 overwriting
    the elements past 4 (float64); the fit (float32)."""
    if y.dtype == np.float32:
        return erfc_fit_float32(y)
    tail = _erfc_medium(np.minimum(y, MEDIUM))
    large = np.flatnonzero(y > MEDIUM)
    if large.size:
        tail[large] = _erfc_large(y[large])
    return tail


def _erfc_of_signed(tail: np.ndarray, x: np.ndarray) -> np.ndarray:
    """erfc(x) from tail = erfc(|x|), in place: (1 - sign) + sign tail."""
    sign = np.copysign(1.0, x, dtype=tail.dtype)
    tail *= sign
    np.subtract(1.0, sign, out=sign)
    tail += sign
    return tail


# -- one block, and the whole array ------------------------------------------------------------
_FLOAT32_ERFC_NEAR_SHARE = 0.3     # where float32 erfc's two whole-block paths cost the same


def erf_block(x: np.ndarray, complement: bool) -> np.ndarray:
    """erf(x), or erfc(x) if `complement`, of one flat block, as a new array."""
    y = np.abs(x)
    near = y <= SMALL
    inside = np.count_nonzero(near)
    if complement and x.dtype == np.float32:
        if inside < _FLOAT32_ERFC_NEAR_SHARE * near.size:
            # float32's far formula holds for every |x|: it runs on the whole block (cheaper
            # than gathering the far elements) and the few near elements are overwritten.
            out = _erfc_of_signed(erfc_fit_float32(y), x)
            inner = np.flatnonzero(near)
            if inner.size:
                head = _erf_near_zero(x[inner])
                out[inner] = np.subtract(1.0, head, out=head)
            return out
        mostly_near = True
    else:
        mostly_near = 2 * inside >= near.size
    if mostly_near:
        if inside == near.size:         # R1 of |x| <= SMALL cannot overflow (and errstate
            out = _erf_near_zero(x)     # costs a small block's forward several microseconds)
        else:
            # R1 of a large |x| may overflow to inf or NaN on the way; the far region's
            # elements are overwritten below, so those values are never kept.
            with np.errstate(over="ignore", invalid="ignore"):
                out = _erf_near_zero(x)
        if complement:
            np.subtract(1.0, out, out=out)
        if inside == near.size:
            return out
    else:
        out = np.empty_like(x)
        inner = np.flatnonzero(near)
        if inner.size:
            head = _erf_near_zero(x[inner])
            out[inner] = np.subtract(1.0, head, out=head) if complement else head
    outer = np.flatnonzero(~near)                   # NaN is far
    x_outer = x[outer]
    tail = _erfc_beyond(y[outer])                   # erfc(|x|)
    if complement:
        _erfc_of_signed(tail, x_outer)
    else:
        np.subtract(1.0, tail, out=tail)
        np.copysign(tail, x_outer, out=tail)
    out[outer] = tail
    return out


def _blockwise(x, complement: bool) -> np.ndarray:
    x = special.as_float_array(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.size <= block_size(flat.itemsize):
        return erf_block(flat, complement).reshape(x.shape)
    out = np.empty_like(flat)

    def evaluate(block: slice) -> None:
        out[block] = erf_block(flat[block], complement)

    map_blocks(evaluate, flat.size, flat.itemsize)
    return out.reshape(x.shape)


def blocked_erf(x: np.ndarray) -> np.ndarray:
    """special.erf(x), computed in blocks."""
    return _blockwise(x, complement=False)


def blocked_erfc(x: np.ndarray) -> np.ndarray:
    """special.erfc(x), computed in blocks."""
    return _blockwise(x, complement=True)
