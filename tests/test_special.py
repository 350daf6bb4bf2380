"""erf and erfc (the reference, numpy_tf.core.special) against math.erf / math.erfc over the whole
real line. The blocked kernel is tested equal to it in test_kernels.py."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import erf, erfc

TINY = np.finfo(np.float64).tiny


def _reference(values, function):
    return np.array([function(v) for v in values])


def _max_relative(ours, reference):
    normal = np.abs(reference) >= TINY          # subnormal results: compare absolutely
    error = np.abs(ours - reference)
    assert np.all(error[~normal] <= 1e-322)
    return float((error[normal] / np.abs(reference[normal])).max(initial=0.0))


GRID = np.concatenate([np.linspace(-30, 30, 120001), -np.logspace(-300, 1.5, 2000),
                       np.logspace(-300, 1.5, 2000), [0.0, -0.0, 0.46875, -0.46875, 4.0, -4.0,
                                                      np.nextafter(4.0, 5), 26.0, 27.3]])


@pytest.mark.parametrize("function, reference", [(erf, math.erf), (erfc, math.erfc)])
def test_float64_matches_math_to_about_one_ulp(function, reference):
    assert _max_relative(function(GRID), _reference(GRID, reference)) < 2e-15


@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_any_float64(value):
    x = np.array([value])
    assert _max_relative(erf(x), np.array([math.erf(value)])) < 2e-15
    assert _max_relative(erfc(x), np.array([math.erfc(value)])) < 2e-15


def test_infinities_nan_and_signed_zero():
    x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0])
    np.testing.assert_array_equal(erf(x)[[0, 1, 3, 4]], [1.0, -1.0, -0.0, 0.0])
    assert np.signbit(erf(x)[3])
    np.testing.assert_array_equal(erfc(x)[[0, 1, 3, 4]], [0.0, 2.0, 1.0, 1.0])
    assert np.isnan(erf(x)[2]) and np.isnan(erfc(x)[2])


def test_float32_stays_float32_and_accurate():
    x = GRID.astype(np.float32)
    for function, reference in [(erf, math.erf), (erfc, math.erfc)]:
        out = function(x)
        assert out.dtype == np.float32
        want = _reference(x.astype(np.float64), reference)
        assert np.max(np.abs(out - want) / np.maximum(np.abs(want), 1e-30)
                      * (np.abs(want) > 1e-30)) < 1e-5


def test_shape_kept_including_empty_and_zero_d():
    assert erf(np.zeros((0, 3))).shape == (0, 3)
    assert erf(np.array(0.5)).shape == ()
    assert erf(np.ones((2, 70000))).shape == (2, 70000)     # more than one block


@pytest.mark.parametrize("dtype, bound", [(np.float32, 5e-7), (np.float64, 2e-15)])
def test_blocks_mostly_near_zero(dtype, bound):
    """Inputs mostly in |x| <= 0.46875 with some of every region, as GELU sees them (the
    kernel's whole-block path; test_kernels.py checks it equals this): the accuracy there
    (float32 erf: 4.3e-7 at x = -0.474, 1 - erfc near the region's edge), tails included;
    results below the dtype's smallest normal number are compared absolutely."""
    x = np.random.default_rng(3).normal(0.0, 0.3, 100_000)
    x[::97] *= 20.0                                  # some of every region in each block
    x = x.astype(dtype)
    wide = x.astype(np.float64)
    tiny = np.finfo(dtype).tiny
    for function, reference in [(erf, math.erf), (erfc, math.erfc)]:
        want = _reference(wide, reference)
        got = function(x).astype(np.float64)
        normal = np.abs(want) >= tiny
        assert np.max(np.abs(got - want)[normal] / np.abs(want[normal])) < bound
        assert np.max(np.abs(got - want)[~normal], initial=0.0) <= tiny
