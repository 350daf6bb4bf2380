"""erf and erfc for numpy arrays, which NumPy lacks, in the array's own dtype.

This is the reference: each region's formula, written out, applied to the elements in that
region. numpy_tf.kernels.erf computes the same values (bit for bit, tested) in cache-sized
blocks on worker threads; GELU runs that one.

With y = |x|, in both dtypes, near zero (W. J. Cody's first rational Chebyshev approximation,
Math. Comp. 23, 1969; the CALERF routine of SPECFUN):

    y <= 0.46875        erf(x)  = x R1(x^2),        erfc(x) = 1 - erf(x)

Beyond, erfc(y) is computed and erf(x) = sign(x) (1 - erfc(y)), erfc(-y) = 2 - erfc(y):

    float64 (Cody, about 1e-16 relative):
        0.46875 < y <= 4    erfc(y) = exp(-y^2) R2(y)
        y > 4               erfc(y) = exp(-y^2) / y (1/sqrt(pi) + R3(1/y^2) / y^2)
    float32 (the Chebyshev fit of Numerical Recipes, Press et al., `erfcc`, whose relative
    error is below 1.2e-7 for every y >= 0, under float32's own rounding of a few operations):
        y > 0.46875         erfc(y) = t exp(-y^2 + P(t)),   t = 2 / (2 + y),   P of degree 9

exp(-y^2) is evaluated as exp(-s^2) exp(-(y - s)(y + s)) with s = y rounded down to a multiple
of 1/16: s^2 is exact and the second exponent small, which keeps the rounding error of y^2
(up to 4e-6 relative at y = 8 in float32) out of the result. Past y = 27.5 erfc is 0 in both
dtypes. NaN stays NaN, erf(+-inf) = +-1, erfc(-inf) = 2.
"""
from __future__ import annotations

import numpy as np

R1_NUMERATOR = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
                 3.20937758913846947e03, 1.85777706184603153e-1)
R1_DENOMINATOR = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
                   2.84423683343917062e03)
R2_NUMERATOR = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
                 2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
                 2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
R2_DENOMINATOR = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
                   1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
                   3.43936767414372164e03, 1.23033935480374942e03)
R3_NUMERATOR = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
                 1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
R3_DENOMINATOR = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
                   6.05183413124413191e-2, 2.33520497626869185e-3)
NR_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
            -1.13520398, 1.48851587, -0.82215223, 0.17087277)     # P(t), lowest power first
ONE_OVER_SQRT_PI = 5.6418958354775628695e-1
SMALL = 0.46875
MEDIUM = 4.0
UNDERFLOW = 27.5   # erfc(27.5) < 1e-330: past here erfc is 0 in float64 (and float32)


# -- the formulas, one region each (Horner's rule; Cody stores the leading coefficient last) --
def erf_near_zero(x: np.ndarray) -> np.ndarray:
    """erf(x) = x R1(x^2), for |x| <= 0.46875."""
    a, b = R1_NUMERATOR, R1_DENOMINATOR
    z = x * x
    numerator = ((((a[4] * z + a[0]) * z + a[1]) * z + a[2]) * z + a[3]) * x
    denominator = (((z + b[0]) * z + b[1]) * z + b[2]) * z + b[3]
    return numerator / denominator


def exp_minus_square(y: np.ndarray) -> np.ndarray:
    """exp(-y^2) = exp(-s^2) exp(-(y - s)(y + s)), s = floor(16 y) / 16 (s^2 is exact)."""
    s = np.floor(y * 16.0) / 16.0
    return np.exp(-s * s) * np.exp(-(y - s) * (y + s))


def erfc_medium(y: np.ndarray) -> np.ndarray:
    """erfc(y) = exp(-y^2) R2(y), for 0.46875 < y <= 4 (float64)."""
    c, d = R2_NUMERATOR, R2_DENOMINATOR
    numerator = c[8] * y
    for coefficient in c[:7]:
        numerator = (numerator + coefficient) * y
    denominator = y + d[0]
    for coefficient in d[1:]:
        denominator = denominator * y + coefficient
    return (numerator + c[7]) / denominator * exp_minus_square(y)


def erfc_large(y: np.ndarray) -> np.ndarray:
    """erfc(y) = exp(-y^2) / y (1/sqrt(pi) + R3(1/y^2) / y^2), for y > 4 (float64)."""
    p, q = R3_NUMERATOR, R3_DENOMINATOR
    y = np.minimum(y, UNDERFLOW)
    z = 1.0 / (y * y)
    numerator = p[5] * z
    for coefficient in p[:4]:
        numerator = (numerator + coefficient) * z
    denominator = z + q[0]
    for coefficient in q[1:]:
        denominator = denominator * z + coefficient
    tail = (numerator + p[4]) * z / denominator                     # R3(1/y^2) / y^2
    return (ONE_OVER_SQRT_PI - tail) / y * exp_minus_square(y)


def erfc_fit_float32(y: np.ndarray) -> np.ndarray:
    """erfc(y) = t exp(P(t) - y^2), t = 2 / (2 + y), for y > 0.46875 (float32)."""
    y = np.minimum(y, UNDERFLOW)
    t = 2.0 / (2.0 + y)
    polynomial = NR_ERFC[9] * t
    for coefficient in NR_ERFC[8:0:-1]:
        polynomial = (polynomial + coefficient) * t
    polynomial = polynomial + NR_ERFC[0]
    s = np.floor(y * 16.0) / 16.0                                   # as in exp_minus_square
    return t * (np.exp(polynomial - (y - s) * (y + s)) * np.exp(-s * s))


def erfc_beyond(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 0.46875 (and NaN, which stays NaN) in y's dtype."""
    if y.dtype == np.float32:
        return erfc_fit_float32(y)
    out = np.empty_like(y)
    large = y > MEDIUM
    out[~large] = erfc_medium(y[~large])                            # NaN falls here
    out[large] = erfc_large(y[large])
    return out


# -- erf and erfc -----------------------------------------------------------------------------
def as_float_array(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a float array; got dtype {x.dtype}")
    return x


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in the dtype of `x` (float32 or float64)."""
    x = as_float_array(x)
    near = np.abs(x) <= SMALL
    far = ~near                                                     # NaN is far
    out = np.empty_like(x)
    out[near] = erf_near_zero(x[near])
    out[far] = np.copysign(1.0 - erfc_beyond(np.abs(x[far])), x[far])
    return out


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function 1 - erf(x), accurate also where it is tiny."""
    x = as_float_array(x)
    near = np.abs(x) <= SMALL
    far = ~near
    out = np.empty_like(x)
    out[near] = 1.0 - erf_near_zero(x[near])
    tail = erfc_beyond(np.abs(x[far]))                              # erfc(|x|)
    out[far] = np.where(np.signbit(x[far]), 2.0 - tail, tail)       # erfc(-y) = 2 - erfc(y)
    return out
