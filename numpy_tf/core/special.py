"""erf and erfc for numpy arrays, which NumPy lacks, in the array's own dtype.

float64: W. J. Cody's rational Chebyshev approximations (Math. Comp. 23, 1969; the CALERF
routine of SPECFUN), accurate to about 1e-16 relative. With y = |x|:

    y <= 0.46875        erf(y)  = y R1(y^2)
    0.46875 < y <= 4    erfc(y) = exp(-y^2) R2(y)
    y > 4               erfc(y) = exp(-y^2) / y (1/sqrt(pi) + R3(1/y^2) / y^2)

and erf(-x) = -erf(x), erfc(-x) = 2 - erfc(x). exp(-y^2) is evaluated as
exp(-s^2) exp(-(y - s)(y + s)) with s = y rounded down to a multiple of 1/16, which keeps the
rounding error of y^2 out of the exponent.

float32: the same R1 near zero for erf, and for erfc everywhere (erf beyond 0.46875) the
Chebyshev fit of Numerical Recipes (Press et al., `erfcc`), whose relative error is below
1.2e-7 for every y >= 0, far under float32's own 6e-8 per operation times the few operations:

    erfc(y) = t exp(-y^2 + P(t)),   t = 2 / (2 + y),   P a polynomial of degree 9

One formula for the whole half-line is what makes it fast: GELU's erfc runs on every hidden
activation, and each extra NumPy pass over the array costs as much as a term of the polynomial.
Its exponent is split as for float64 (exp(-s^2) exp(P(t) - (y - s)(y + s))): y^2 rounded to
float32 would otherwise cost up to 4e-6 relative at y = 8.

Each region's formula runs on the elements in that region, gathered by index, except that when
most of a block lies near zero the small-|x| formula runs on the whole block (cheaper than the
gather and scatter) and the other regions overwrite their elements; the array is processed in
cache-sized blocks.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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
_NR_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
            -1.13520398, 1.48851587, -0.82215223, 0.17087277)     # P(t), lowest power first
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


def _split_square(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s^2, (y - s)(y + s)) with s = floor(16 y) / 16, so y^2 = s^2 + (y - s)(y + s) where
    s^2 is exact (s has four fraction bits) and the second term is small."""
    s = np.floor(y * 16.0)
    s /= 16.0
    rest = y - s
    rest *= y + s
    s *= s
    return s, rest


def _exp_minus_square(y: np.ndarray) -> np.ndarray:
    """exp(-y^2) = exp(-s^2) exp(-(y - s)(y + s))."""
    square, rest = _split_square(y)
    np.negative(rest, out=rest)
    np.exp(rest, out=rest)
    np.negative(square, out=square)
    np.exp(square, out=square)
    square *= rest
    return square


def _erfc_float32(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y >= 0 (and y = inf, NaN) in float32: t exp(P(t) - y^2), t = 2 / (2 + y);
    0 past the underflow point."""
    y = np.minimum(y, _UNDERFLOW)
    t = y + 2.0
    np.divide(2.0, t, out=t)
    polynomial = t * _NR_ERFC[9]
    for coefficient in _NR_ERFC[8:0:-1]:               # Horner's rule, in place
        polynomial += coefficient
        polynomial *= t
    polynomial += _NR_ERFC[0]
    square, rest = _split_square(y)
    polynomial -= rest
    np.exp(polynomial, out=polynomial)
    np.negative(square, out=square)
    np.exp(square, out=square)
    polynomial *= square
    polynomial *= t
    return polynomial


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


_CHUNK = 32768     # elements per block. Small enough that a block's temporaries (128 KB each
                   # in float32) come back from the allocator's heap: with 131072 they were
                   # fresh pages, 4,500 page faults per GELU call inside the small GPT's
                   # forward, which then took 42 ms of GELU instead of 23. Large enough that
                   # the Python calls per block cost little next to the arithmetic.


def _erfc_tail(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 0.46875 (and inf, NaN), in y's dtype."""
    if y.dtype == np.float32:
        return _erfc_float32(y)
    tail = _erfc_medium(np.minimum(y, _MEDIUM))
    large = np.flatnonzero(y > _MEDIUM)
    if large.size:
        tail[large] = _erfc_large(y[large])
    return tail


def _erfc_of_signed(tail: np.ndarray, x: np.ndarray) -> np.ndarray:
    """erfc(x) from tail = erfc(|x|), in place: erfc(-y) = 2 - erfc(y). Written as
    (1 - sign) + sign tail, sign = +-1 the sign of x (of -0.0 too), which is exactly tail for
    x >= 0 and 2 - tail (one rounding) for x < 0: arithmetic instead of a masked subtract,
    which costs ten times as much on signs in random order."""
    sign = np.copysign(1.0, x, dtype=tail.dtype)
    tail *= sign
    np.subtract(1.0, sign, out=sign)
    tail += sign
    return tail


def _erf_block(x: np.ndarray, complement: bool) -> np.ndarray:
    """erf(x), or erfc(x) if `complement`, of one flat block.

    Each region's formula runs on that region's elements, gathered by index (a boolean mask's
    gather and scatter cost several times more when the regions interleave at random), but
    when at least half the block lies in the small region its formula runs on the whole block:
    GELU's float64 forward on N(0, 0.3^2) inputs took 30.9 ms per 2M elements with the gather
    and 22.2 ms without. NaN falls in the tail region and stays NaN. float32 erfc needs no
    regions, one formula holds for every |x|, but R1 is half its cost: it is used the same way
    when most of the block is small (GELU's float32 forward on N(0, 0.3^2): 15.4 -> 11.9 ms
    per 2M elements)."""
    y = np.abs(x)
    small = y <= _SMALL
    inside = np.count_nonzero(small)
    mostly_small = 2 * inside >= small.size
    if complement and x.dtype == np.float32 and not mostly_small:
        return _erfc_of_signed(_erfc_float32(y), x)     # one formula, no regions
    if mostly_small:
        # Most elements are near zero (GELU's inputs, typically): R1 runs on the whole block
        # in place of a gather and a scatter, and the tail overwrites its own elements below
        # (R1 of a large |x| may be inf or NaN on the way; those values are never kept).
        with np.errstate(over="ignore", invalid="ignore"):
            out = _erf_small(x)                         # erf(x) for |x| <= 0.46875
        if complement:
            np.subtract(1.0, out, out=out)
        if inside == small.size:
            return out
    else:
        out = np.empty_like(x)
        inner = np.flatnonzero(small)
        if inner.size:
            head = _erf_small(x[inner])
            out[inner] = np.subtract(1.0, head, out=head) if complement else head
    outer = np.flatnonzero(~small)
    x_outer = x[outer]
    tail = _erfc_tail(y[outer])                         # erfc(|x|) for |x| > 0.46875
    if complement:
        _erfc_of_signed(tail, x_outer)
    else:
        np.subtract(1.0, tail, out=tail)
        np.copysign(tail, x_outer, out=tail)
    out[outer] = tail
    return out


def worker_threads() -> int:
    """The threads map_blocks uses: NUMPY_TF_NUM_THREADS if it is set to a positive count,
    else 1. Not every CPU by default: after each product, NumPy's OpenBLAS keeps its own
    threads spinning on the other cores, and blocks handed to Python threads then wait for a
    core. Measured with OpenBLAS on 2 threads (2 cores): the medium GPT's float64 training step
    took 784 ms with GELU's blocks on 1 thread and 894 ms on 2 (float32: 394 and 413 ms)."""
    return _threads_for(os.environ.get("NUMPY_TF_NUM_THREADS"))


@functools.lru_cache(maxsize=16)
def _threads_for(setting: str | None) -> int:
    value = (setting or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


@functools.lru_cache(maxsize=None)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="numpy_tf")


def map_blocks(function: Callable[[slice], None], size: int) -> None:
    """function(block) for the consecutive slices of range(size), _CHUNK elements each,
    spread over worker_threads() threads (in order on the calling thread when one suffices).
    `function` writes its block's results into arrays the caller owns; blocks never overlap."""
    if size <= _CHUNK:
        function(slice(0, size))
        return
    blocks = [slice(start, start + _CHUNK) for start in range(0, size, _CHUNK)]
    threads = min(worker_threads(), len(blocks))
    if threads <= 1:
        for block in blocks:
            function(block)
        return
    for _ in _pool(threads).map(function, blocks):     # re-raises a block's exception
        pass


def _blockwise(x, complement: bool) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a float array; got dtype {x.dtype}")
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.size <= _CHUNK:
        return _erf_block(flat, complement).reshape(x.shape)
    out = np.empty_like(flat)

    def evaluate(block: slice) -> None:
        out[block] = _erf_block(flat[block], complement)

    map_blocks(evaluate, flat.size)
    return out.reshape(x.shape)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in the dtype of `x` (float32 or float64)."""
    return _blockwise(x, complement=False)


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function 1 - erf(x), accurate also where it is tiny."""
    return _blockwise(x, complement=True)
