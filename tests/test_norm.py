"""LayerNorm and RMSNorm: the STYLE.md checklist, and the rows where eps dominates."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (LayerNorm, RMSNorm, gradcheck, gradcheck_module, layernorm_backward,
                      layernorm_forward, rmsnorm_backward, rmsnorm_forward)

WIDTHS = st.sampled_from([1, 2, 3, 5, 8, 33])


def drawn_rows(rng, lead, width, flat, center):
    """x (*lead, width): N(0, 1) rows, or with flat=True rows of nearly equal values (noise of
    std 1e-4 around `center`: variance 1e-8, far below eps). The center stays within [-1, 1]:
    the check's step is 1e-6 max(1, |x|) while the function varies on the scale sqrt(eps), so a
    larger center would measure the finite difference's own truncation error."""
    if flat:
        return center + 1e-4 * rng.standard_normal((*lead, width))
    return rng.standard_normal((*lead, width)) * 2.0 + center


# -- 1. finite differences --------------------------------------------------------------------
@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), width=WIDTHS,
       affine=st.booleans(), flat=st.booleans(), center=st.floats(-1.0, 1.0),
       eps=st.sampled_from([1e-5, 1e-3]), seed=st.integers(0, 2**16))
def test_layernorm_gradcheck_drawn(lead, width, affine, flat, center, eps, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": drawn_rows(rng, lead, width, flat, center),
              "weight": rng.standard_normal(width) if affine else None,
              "bias": rng.standard_normal(width) if affine else None, "eps": eps}
    # another seed for the upstream gradient: the same seed would draw dout proportional to x,
    # a direction in which LayerNorm's gradient is nearly zero (eps / (var + eps) of it)
    report = gradcheck(layernorm_forward, layernorm_backward, inputs, seed=seed + 1)
    assert report.passed, str(report)


@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), width=WIDTHS,
       affine=st.booleans(), flat=st.booleans(), center=st.floats(-1.0, 1.0),
       eps=st.sampled_from([1e-6, 1e-5]), seed=st.integers(0, 2**16))
def test_rmsnorm_gradcheck_drawn(lead, width, affine, flat, center, eps, seed):
    rng = np.random.default_rng(seed)
    # for RMSNorm the "flat" rows that let eps dominate are the rows near zero
    inputs = {"x": drawn_rows(rng, lead, width, flat, 0.0 if flat else center),
              "weight": rng.standard_normal(width) if affine else None, "eps": eps}
    report = gradcheck(rmsnorm_forward, rmsnorm_backward, inputs, seed=seed + 1)
    assert report.passed, str(report)


@pytest.mark.parametrize("width", [512, 1024])
def test_gradcheck_large_width_single_token(width):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((1, 1, width)) + 3.0
    weight, bias = rng.standard_normal(width), rng.standard_normal(width)
    report = gradcheck(layernorm_forward, layernorm_backward,
                       {"x": x, "weight": weight, "bias": bias})
    assert report.passed, str(report)
    report = gradcheck(rmsnorm_forward, rmsnorm_backward, {"x": x, "weight": weight,
                                                           "eps": 1e-6})
    assert report.passed, str(report)


def test_module_gradcheck():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 6))
    layer = LayerNorm(6, eps=1e-4)
    layer.weight.data[:] = rng.standard_normal(6)
    layer.bias.data[:] = rng.standard_normal(6)
    assert gradcheck_module(layer, x).passed
    norm = RMSNorm(6, eps=1e-6)
    norm.weight.data[:] = rng.standard_normal(6)
    assert gradcheck_module(norm, x).passed


# -- 2. torch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["layernorm", "layernorm_nobias", "layernorm_noaffine",
                                  "layernorm_flat_rows", "rmsnorm", "rmsnorm_noaffine",
                                  "rmsnorm_flat_rows"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


# -- 3-5. dtype, accumulation, nothing mutated ------------------------------------------------
def _with_random_params(module, seed=1):
    rng = np.random.default_rng(seed)
    for parameter in module.parameters():
        parameter.data[:] = rng.standard_normal(parameter.shape)
    return module


def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 5))
    check_contract(lambda dtype: _with_random_params(LayerNorm(5, dtype=dtype)), (x,))
    check_contract(lambda dtype: _with_random_params(LayerNorm(5, bias=False, dtype=dtype)),
                   (x,))
    check_contract(lambda dtype: LayerNorm(5, elementwise_affine=False, dtype=dtype), (x,))
    check_contract(lambda dtype: _with_random_params(RMSNorm(5, 1e-6, dtype=dtype)), (x,))
    check_contract(lambda dtype: RMSNorm(5, 1e-5, elementwise_affine=False, dtype=dtype), (x,))


def test_float32_stays_float32_even_with_a_numpy_float64_eps():
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    out, cache = layernorm_forward(x, eps=np.float64(1e-5))
    assert out.dtype == np.float32 and cache.inv_std.dtype == np.float32
    out, cache = rmsnorm_forward(x, eps=np.float64(1e-6))
    assert out.dtype == np.float32 and cache.inv_rms.dtype == np.float32


def test_parameters_are_torch_named_and_initialised():
    assert list(LayerNorm(4).state_dict()) == ["weight", "bias"]
    np.testing.assert_array_equal(LayerNorm(4).weight.data, np.ones(4))
    np.testing.assert_array_equal(LayerNorm(4).bias.data, np.zeros(4))
    assert list(LayerNorm(4, bias=False).state_dict()) == ["weight"]
    assert LayerNorm(4, elementwise_affine=False).state_dict() == {}
    assert list(RMSNorm(4, 1e-6).state_dict()) == ["weight"]
    np.testing.assert_array_equal(RMSNorm(4, 1e-6).weight.data, np.ones(4))
    assert RMSNorm(4, 1e-6, elementwise_affine=False).state_dict() == {}


# -- 6. worked values and edge cases ----------------------------------------------------------
def test_layernorm_uses_biased_variance_and_eps_inside_the_root():
    x = np.array([[0.0, 2.0]])                   # mean 1, biased variance 1 (unbiased: 2)
    out, _ = layernorm_forward(x, eps=0.25)
    expected = 1.0 / math.sqrt(1.0 + 0.25)       # not 1 / (1 + 0.25), not 1 / sqrt(2 + .25)
    np.testing.assert_allclose(out, [[-expected, expected]], rtol=1e-15)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    out, _ = layernorm_forward(x, np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5, 0, 0, 0]))
    x_hat = (x - 2.5) / math.sqrt(1.25 + 1e-5)
    np.testing.assert_allclose(out, x_hat * [1, 2, 3, 4] + [0.5, 0, 0, 0], rtol=1e-15)


def test_rmsnorm_worked_value():
    x = np.array([[3.0, 4.0]])                    # mean(x^2) = 12.5
    out, _ = rmsnorm_forward(x, np.array([2.0, -1.0]), eps=1e-6)
    np.testing.assert_allclose(out, [[2 * 3 / math.sqrt(12.5 + 1e-6),
                                      -4 / math.sqrt(12.5 + 1e-6)]], rtol=1e-15)


def test_constant_row_gives_finite_exact_gradient():
    """A constant row has var = 0: x_hat = 0 and inv_std = eps^(-1/2), so the derivation's
    dx = inv_std (g - mean(g)) with g = dout * w, and dweight = 0."""
    eps = 1e-5
    x = np.full((1, 4), 0.5)
    weight, bias = np.array([1.0, -2.0, 0.5, 3.0]), np.array([0.1, 0.2, 0.3, 0.4])
    dout = np.array([[0.3, -1.2, 2.0, 0.7]])
    out, cache = layernorm_forward(x, weight, bias, eps)
    np.testing.assert_array_equal(out, bias[None])
    dx, dweight, dbias = layernorm_backward(dout, cache)
    g = dout * weight
    np.testing.assert_allclose(dx, (g - g.mean()) / math.sqrt(eps), rtol=1e-14)
    np.testing.assert_array_equal(dweight, 0.0)
    np.testing.assert_array_equal(dbias, dout[0])
    out, cache = rmsnorm_forward(np.zeros((1, 4)), weight, eps=1e-6)
    dx, dweight = rmsnorm_backward(dout, cache)
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_allclose(dx, g / math.sqrt(1e-6), rtol=1e-14)
    np.testing.assert_array_equal(dweight, 0.0)


def test_width_one_layernorm_is_its_bias():
    """One feature: x - mean = 0, so the output is the bias and no gradient reaches x or the
    weight. (torch's float32 backward returns rounding noise of about 1e-5 there instead of 0,
    which is why this case is checked here and not against a torch fixture.)"""
    layer = LayerNorm(1)
    layer.bias.data[:] = 0.7
    x = np.array([[1.5], [-3.0], [0.25]])
    out, cache = layer.forward(x)
    np.testing.assert_array_equal(out, 0.7)
    dx = layer.backward(np.array([[1.0], [2.0], [-0.5]]), cache)
    np.testing.assert_array_equal(dx, 0.0)
    np.testing.assert_array_equal(layer.weight.grad, 0.0)
    np.testing.assert_array_equal(layer.bias.grad, [2.5])


def test_leading_axes_are_independent_rows():
    rng = np.random.default_rng(3)
    x, weight = rng.standard_normal((2, 3, 4)), rng.standard_normal(4)
    whole, _ = layernorm_forward(x, weight)
    for row in np.ndindex(2, 3):
        alone, _ = layernorm_forward(x[row], weight)
        np.testing.assert_allclose(whole[row], alone, rtol=1e-15, atol=1e-15)


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input():
    with pytest.raises(ValueError, match=r"x must have last dimension 4 \(normalized_shape\); "
                                         r"got shape \(2, 3\)"):
        LayerNorm(4).forward(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="x has dtype float32 but weight has dtype float64"):
        LayerNorm(4).forward(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\) to match x's last "
                                         r"dimension; got \(4,\)"):
        layernorm_forward(np.zeros((2, 3)), np.ones(3), np.zeros(4))
    with pytest.raises(TypeError, match="weight must be a numpy array; got list"):
        layernorm_forward(np.zeros((2, 3)), [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="eps must be a finite number > 0; got -1e-05"):
        LayerNorm(4, eps=-1e-5)
    with pytest.raises(ValueError, match="eps must be a finite number > 0; got 0.0"):
        layernorm_forward(np.zeros((2, 3)), eps=0.0)
    with pytest.raises(ValueError, match="normalized_shape must be a positive integer C"):
        LayerNorm((2, 4))
    with pytest.raises(TypeError, match="x must be float32 or float64; got dtype int64"):
        RMSNorm(4, 1e-6).forward(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="x must have at least 1 dimensions"):
        layernorm_forward(np.array(3.0))


def test_rmsnorm_eps_is_required():
    with pytest.raises(TypeError):
        RMSNorm(4)                                            # no default at all
    with pytest.raises(ValueError, match="eps must be given explicitly for RMSNorm"):
        RMSNorm(4, None)
    with pytest.raises(ValueError, match="eps must be given explicitly for RMSNorm"):
        rmsnorm_forward(np.ones((1, 4)))
