"""ReLU, GELU (exact and tanh) and SiLU."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_tf import (GELU, ReLU, SiLU, gelu_backward, gelu_forward, gradcheck, relu_backward,
                      relu_forward, silu_backward, silu_forward)

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
values = st.floats(-6, 6, allow_nan=False, allow_infinity=False)


@given(x=hnp.arrays(np.float64, shapes, elements=values), approximate=st.sampled_from(
    ["none", "tanh"]))
def test_gelu_gradcheck(x, approximate):
    report = gradcheck(gelu_forward, gelu_backward, {"x": x, "approximate": approximate})
    assert report.passed, str(report)


@given(x=hnp.arrays(np.float64, shapes, elements=st.floats(-30, 30)))
def test_silu_gradcheck(x):
    assert gradcheck(silu_forward, silu_backward, {"x": x}).passed


@given(x=hnp.arrays(np.float64, shapes, elements=values))
def test_relu_gradcheck_away_from_the_kink(x):
    # finite differences are meaningless across the kink at 0: keep every value a step away
    x = np.where(np.abs(x) < 1e-3, 0.5, x)
    assert gradcheck(relu_forward, relu_backward, {"x": x}).passed


@pytest.mark.parametrize("name", ["relu", "gelu_none", "gelu_tanh", "silu"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_gelu_values_against_math():
    x = np.linspace(-8, 8, 161)
    # Phi(x) = erfc(-x / sqrt 2) / 2 keeps its relative accuracy in the negative tail, where
    # 1 + erf(x / sqrt 2) cancels
    # 1 + erf(x / sqrt 2) cancels. erfc's condition number at y is 2 y^2 (64 at x = -8), so one
    # ulp of difference in the rounding of x / sqrt 2 can become 64 * 2.2e-16 = 1.4e-14.
    exact = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    np.testing.assert_allclose(gelu_forward(x)[0], exact, rtol=3e-14, atol=1e-300)
    tanh = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
                     for v in x])
    # 1 + tanh(u) cancels for negative x (it is the formula torch and GPT-2 use), leaving an
    # absolute error of about 1 ulp of 1 times |x| / 2
    np.testing.assert_allclose(gelu_forward(x, "tanh")[0], tanh, rtol=1e-14, atol=1e-15)
    # the two variants differ: a check that confused them would fail here
    assert np.abs(gelu_forward(x)[0] - gelu_forward(x, "tanh")[0]).max() > 1e-4


def test_tanh_backward_is_its_own_derivative_not_the_exact_one():
    x = np.array([-2.0, -0.7, 0.3, 1.9])
    out, cache = gelu_forward(x, "tanh")
    _, exact_cache = gelu_forward(x, "none")
    dout = np.array([0.3, -1.2, 0.8, 2.0])
    own, other = gelu_backward(dout, cache), gelu_backward(dout, exact_cache)
    step = 1e-6
    numeric = dout * (gelu_forward(x + step, "tanh")[0] - gelu_forward(x - step, "tanh")[0]) \
        / (2 * step)
    np.testing.assert_allclose(own, numeric, rtol=1e-8)
    assert np.abs(other - numeric).max() > 1e-5


def test_extreme_inputs_stay_finite():
    x = np.array([-1e4, -800.0, -40.0, 0.0, 40.0, 800.0, 1e4])
    for forward, backward in [(gelu_forward, gelu_backward), (silu_forward, silu_backward),
                              (lambda v: gelu_forward(v, "tanh"), gelu_backward)]:
        out, cache = forward(x)
        dout = np.random.default_rng(0).standard_normal(x.shape)
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(backward(dout, cache)))
    np.testing.assert_array_equal(silu_forward(x)[0][[0, 1]], [-0.0, -0.0])


@pytest.mark.parametrize("make", [lambda d: ReLU(d), lambda d: GELU("none", d),
                                  lambda d: GELU("tanh", d), lambda d: SiLU(d)])
def test_contract(make):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    check_contract(make, (x,))


def test_bad_input():
    with pytest.raises(ValueError, match="approximate must be one of 'none', 'tanh'; got 'erf'"):
        GELU("erf")
    with pytest.raises(TypeError, match="x must be float32 or float64"):
        gelu_forward(np.arange(3))


def test_gelu_backward_against_the_closed_form_including_zero():
    """dy/dx from math, independent of the forward's erf: Phi(x) + x phi(x), and for the tanh
    variant (1 + t) / 2 + x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2) / 2. At x = 0 (and -0) the
    cache's y / x is 0 / 0 and the slope must still be 1/2."""
    x = np.concatenate([np.linspace(-9, 9, 181), [0.0, -0.0, 1e-300, -1e-300]])
    dout = np.random.default_rng(5).uniform(0.5, 2.0, x.shape)
    exact = np.array([0.5 * math.erfc(-v / math.sqrt(2)) +
                      v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi) for v in x])
    c = math.sqrt(2 / math.pi)
    tanh = np.array([0.5 * (1 + math.tanh(c * (v + 0.044715 * v**3))) + 0.5 * v *
                     (1 - math.tanh(c * (v + 0.044715 * v**3)) ** 2) * c *
                     (1 + 3 * 0.044715 * v * v) for v in x])
    got = gelu_backward(dout, gelu_forward(x)[1])
    np.testing.assert_allclose(got, dout * exact, rtol=2e-14, atol=1e-15)
    np.testing.assert_array_equal(got[-4:], dout[-4:] * 0.5)
    # tanh: for x < -2, 1 + t cancels in the forward (torch's formula) and in this reference
    # alike, leaving an absolute error of about 1 ulp of 1 times |x| du/dx (2.5e-15 measured
    # at |x| <= 9 against 50-digit arithmetic)
    got = gelu_backward(dout, gelu_forward(x, "tanh")[1])
    clean = x >= -2.0
    np.testing.assert_allclose(got[clean], (dout * tanh)[clean], rtol=2e-13, atol=1e-15)
    np.testing.assert_allclose(got[~clean], (dout * tanh)[~clean], rtol=0, atol=2e-14)
    np.testing.assert_array_equal(got[-4:], dout[-4:] * 0.5)


def test_gelu_backward_names_a_dout_of_the_wrong_shape():
    _, cache = gelu_forward(np.linspace(-2, 2, 6).reshape(2, 3))
    with pytest.raises(ValueError, match=r"dout must have the shape of GELU's output \(2, 3\); "
                                         r"got \(3,\)"):
        gelu_backward(np.ones(3), cache)


@pytest.mark.parametrize("approximate, bound", [("none", 5e-7), ("tanh", 3e-6)])
def test_gelu_backward_float32_against_float64(approximate, bound):
    """float32 against the float64 computation from the same float32 inputs, relative to the
    size of dout. Measured 2.2e-7 (exact) and 1.2e-6 (tanh, at x = -5.4, where 1 + t cancels
    in the forward itself). Taking the tanh variant's (1 + t) / 2 from y / x instead of
    recomputing t measured 1.1e-5 at x = 5.1: this test would catch it."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-6.0, 6.0, 200_000).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    wide = gelu_backward(dout.astype(np.float64),
                         gelu_forward(x.astype(np.float64), approximate)[1])
    got = gelu_backward(dout, gelu_forward(x, approximate)[1])
    assert got.dtype == np.float32
    assert np.max(np.abs(got - wide) / np.maximum(1.0, np.abs(dout))) < bound
