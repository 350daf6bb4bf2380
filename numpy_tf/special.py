"""erf and erfc for numpy arrays, which NumPy lacks, in the array's own dtype.

W. J. Cody's rational Chebyshev approximations (Math. Comp. 23, 1969; the CALERF routine of
SPECFUN), accurate to about 1e-16 relative in float64. With y = |x|:

    y <= 0.46875        erf(y)  = y R1(y^2)
    0.46875 < y <= 4    erfc(y) = exp(-y^2) R2(y)
    y > 4               erfc(y) = exp(-y^2) / y (1/sqrt(pi) + R3(1/y^2) / y^2)

and erf(-x) = -erf(x), erfc(-x) = 2 - erfc(x). exp(-y^2) is evaluated as
exp(-s^2) exp(-(y - s)(y + s)) with s = y rounded down to a multiple of 1/16, which keeps the
rounding error of y^2 out of the exponent. The array is processed in cache-sized blocks,
because GELU calls this on every hidden activation.
"""
from __future__ import annotations

import numpy as np

_R1_NUMERATOR = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
                 3.20937758913846947e03, 1.85777706184603153e-1)
_R1_DENOMINATOR = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
                   2.84423683343917062e03)
_R2_NUMERATOR = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
                 2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
                 2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_R2_DENOMINATOR = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
                   1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
                   3.43936767414372164e03, 1.23033935480374942e03)
_R3_NUMERATOR = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
                 1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_R3_DENOMINATOR = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
                   6.05183413124413191e-2, 2.33520497626869185e-3)
_ONE_OVER_SQRT_PI = 5.6418958354775628695e-1
_SMALL = 0.46875
_MEDIUM = 4.0
_UNDERFLOW = 27.5   # erfc(27.5) < 1e-330: past here erfc is 0 in float64 (and float32)


def _erf_small(y: np.ndarray) -> np.ndarray:
    """erf(y) for |y| <= 0.46875."""
    a, b = _R1_NUMERATOR, _R1_DENOMINATOR
    z = y * y
    numerator = a[4] * z
    denominator = z + b[0]
    for i in range(3):                      # Horner's rule, in place: no temporaries
        numerator += a[i]
        numerator *= z
    for i in range(1, 4):
        denominator *= z
        denominator += b[i]
    numerator += a[3]
    numerator *= y
    numerator /= denominator
    return numerator


def _exp_minus_square(y: np.ndarray) -> np.ndarray:
    """exp(-y^2), with y^2 split as s^2 + (y - s)(y + s), s = floor(16 y) / 16."""
    s = np.floor(y * 16.0)
    s /= 16.0
    rest = y - s
    rest *= -(y + s)
    np.exp(rest, out=rest)
    s *= s
    np.negative(s, out=s)
    np.exp(s, out=s)
    s *= rest
    return s


def _erfc_medium(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 0.46875 < y <= 4."""
    c, d = _R2_NUMERATOR, _R2_DENOMINATOR
    numerator = c[8] * y
    denominator = y + d[0]
    for i in range(7):
        numerator += c[i]
        numerator *= y
    for i in range(1, 8):
        denominator *= y
        denominator += d[i]
    numerator += c[7]
    numerator /= denominator
    numerator *= _exp_minus_square(y)
    return numerator


def _erfc_large(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 4 (0 past the underflow point; NaN stays NaN)."""
    p, q = _R3_NUMERATOR, _R3_DENOMINATOR
    y = np.minimum(y, _UNDERFLOW)
    z = 1.0 / (y * y)
    numerator = p[5] * z
    denominator = z + q[0]
    for i in range(4):
        numerator += p[i]
        numerator *= z
    for i in range(1, 5):
        denominator *= z
        denominator += q[i]
    numerator += p[4]
    numerator *= z
    numerator /= denominator                # the tail R3(1/y^2) / y^2
    np.subtract(_ONE_OVER_SQRT_PI, numerator, out=numerator)
    numerator /= y
    numerator *= _exp_minus_square(y)
    return numerator


_CHUNK = 32768     # elements per block: each block's temporaries stay in the CPU cache


def _erf_block(x: np.ndarray, out: np.ndarray, complement: bool) -> None:
    """out = erf(x), or erfc(x) if `complement`, for one flat block.

    Every region's formula runs on the whole block (with its argument clamped into the
    region) and np.where picks: cheaper than gathering each region's elements apart."""
    y = np.abs(x)
    small = y <= _SMALL
    tail = _erfc_medium(np.clip(y, _SMALL, _MEDIUM))     # erfc(|x|) for |x| > 0.46875
    large = y > _MEDIUM
    if large.any():
        tail = np.where(large, _erfc_large(np.maximum(y, _MEDIUM)), tail)
    head = _erf_small(np.where(small, x, 0.0))           # erf(x) for |x| <= 0.46875
    if complement:
        np.subtract(2.0, tail, out=out, where=x < 0)
        np.copyto(out, tail, where=x >= 0)
        np.subtract(1.0, head, out=out, where=small)
    else:
        np.copysign(1.0 - tail, x, out=out)
        np.copyto(out, head, where=small)
    np.copyto(out, x, where=np.isnan(x))


def _blockwise(x, complement: bool) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a float array; got dtype {x.dtype}")
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    for start in range(0, flat.size, _CHUNK):
        block = slice(start, start + _CHUNK)
        _erf_block(flat[block], out[block], complement)
    return out.reshape(x.shape)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in the dtype of `x` (float32 or float64)."""
    return _blockwise(x, complement=False)


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function 1 - erf(x), accurate also where it is tiny."""
    return _blockwise(x, complement=True)
