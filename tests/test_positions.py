"""Learned and sinusoidal absolute positions: the STYLE.md checklist, max_context, the table's
values and its shift identity."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (LearnedPositions, SinusoidalPositions, gradcheck, gradcheck_module,
                      learned_positions_backward, learned_positions_forward,
                      sinusoidal_positions_backward, sinusoidal_positions_forward, sinusoidal_table)


# -- learned positions --------------------------------------------------------------------------
@given(batch=st.integers(1, 3), length=st.integers(1, 5), width=st.sampled_from([1, 2, 5, 64]),
       spare=st.integers(0, 3), offset=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_learned_gradcheck_drawn(batch, length, width, spare, offset, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((batch, length, width)),
              "weight": rng.standard_normal((offset + length + spare, width)),
              "offset": offset}
    report = gradcheck(learned_positions_forward, learned_positions_backward, inputs,
                       seed=seed + 1)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", ["learned_positions", "learned_positions_offset",
                                  "sinusoidal_positions", "sinusoidal_positions_offset"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    check_contract(lambda dtype: LearnedPositions(6, 4, rng=1, dtype=dtype), (x,))
    check_contract(lambda dtype: LearnedPositions(6, 4, rng=1, dtype=dtype), (x,), offset=3)
    check_contract(lambda dtype: SinusoidalPositions(4, dtype), (x,), offset=5)


def test_module_gradcheck():
    x = np.random.default_rng(7).standard_normal((2, 3, 4))
    assert gradcheck_module(LearnedPositions(5, 4, rng=2), x, forward_kwargs={"offset": 2}).passed
    assert gradcheck_module(SinusoidalPositions(4), x).passed


def test_learned_rows_and_their_gradients():
    layer = LearnedPositions(5, 2, rng=0)
    x = np.zeros((2, 3, 2))
    out, cache = layer.forward(x, offset=1)
    np.testing.assert_array_equal(out[1], layer.weight.data[1:4])
    dout = np.arange(12.0).reshape(2, 3, 2)
    dx = layer.backward(dout, cache)
    np.testing.assert_array_equal(dx, dout)
    assert dx is not dout
    expected = np.zeros((5, 2))
    expected[1:4] = dout[0] + dout[1]                  # each row used once per sequence
    np.testing.assert_array_equal(layer.weight.grad, expected)


def test_torch_name_and_init():
    layer = LearnedPositions(8, 3, rng=0)
    assert list(layer.state_dict()) == ["weight"] and layer.weight.shape == (8, 3)
    assert SinusoidalPositions(4).state_dict() == {}


def test_max_context_exactly_filled_then_refused():
    layer = LearnedPositions(4, 2)
    out, _ = layer.forward(np.zeros((1, 4, 2)))             # T = max_context: every row
    np.testing.assert_array_equal(out[0], layer.weight.data)
    out, _ = layer.forward(np.zeros((1, 1, 2)), offset=3)  # the last row alone
    np.testing.assert_array_equal(out[0, 0], layer.weight.data[3])
    with pytest.raises(ValueError, match=r"x has T=5 tokens at offset 0, so it needs positions "
                                         r"0 \.\. 4, but the learned position table has "
                                         r"max_context=4 rows"):
        layer.forward(np.zeros((1, 5, 2)))
    with pytest.raises(ValueError, match=r"T=2 tokens at offset 3, so it needs positions "
                                         r"3 \.\. 4.*max_context=4"):
        layer.forward(np.zeros((1, 2, 2)), offset=3)
    with pytest.raises(ValueError, match="T=1 tokens at offset 9"):
        layer.forward(np.zeros((1, 1, 2)), offset=9)


def test_learned_bad_input():
    layer = LearnedPositions(4, 2)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions \(B, T, C\); got shape "
                                         r"\(3, 2\)"):
        layer.forward(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"x must have last dimension 2 \(the position "
                                         r"table's width C\); got shape \(1, 3, 5\)"):
        layer.forward(np.zeros((1, 3, 5)))
    with pytest.raises(TypeError, match="x has dtype float32 but weight has dtype float64"):
        layer.forward(np.zeros((1, 3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="offset must be a non-negative integer; got -1"):
        layer.forward(np.zeros((1, 3, 2)), offset=-1)
    with pytest.raises(ValueError, match="offset must be a non-negative integer; got 1.0"):
        layer.forward(np.zeros((1, 3, 2)), offset=1.0)
    with pytest.raises(ValueError, match="max_context must be a positive integer; got 0"):
        LearnedPositions(0, 2)


# -- sinusoidal positions -----------------------------------------------------------------------
def test_sinusoidal_values_from_the_formula():
    width = 6
    table = sinusoidal_table(5, width)
    for t in range(5):
        for i in range(width // 2):
            omega = 10000.0 ** (-2 * i / width)
            assert table[t, 2 * i] == pytest.approx(math.sin(t * omega), rel=1e-15, abs=1e-16)
            assert table[t, 2 * i + 1] == pytest.approx(math.cos(t * omega), rel=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_zero_alternates_zero_and_one(dtype):
    table = sinusoidal_table(3, 8, dtype)
    assert table.dtype == dtype
    np.testing.assert_array_equal(table[0], np.tile(np.array([0.0, 1.0], dtype), 4))


def test_float32_table_is_float32_throughout():
    x = np.zeros((1, 4, 6), dtype=np.float32)
    out, _ = SinusoidalPositions(6).forward(x, offset=100)
    assert out.dtype == np.float32
    exact = sinusoidal_table(4, 6, np.float64, offset=100)
    np.testing.assert_allclose(out[0], exact, rtol=0, atol=1e-5)    # float32 angles near 100


def test_offset_continues_the_table():
    np.testing.assert_array_equal(sinusoidal_table(3, 4, offset=5), sinusoidal_table(8, 4)[5:])
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    whole, _ = sinusoidal_positions_forward(np.concatenate([x, x], axis=1))
    tail, _ = sinusoidal_positions_forward(x, offset=3)
    np.testing.assert_array_equal(whole[:, 3:], tail)


def _shift_rotation(k_omega: float) -> np.ndarray:
    """[sin((p+k)w), cos((p+k)w)] = M [sin(pw), cos(pw)] by the angle-addition formulas."""
    return np.array([[math.cos(k_omega), math.sin(k_omega)],
                     [-math.sin(k_omega), math.cos(k_omega)]])


def test_shift_identity_seed_example_is_exact():
    p, k, omega = 3, 2, 0.1
    at_p = np.array([math.sin(p * omega), math.cos(p * omega)])
    at_p_plus_k = np.array([math.sin((p + k) * omega), math.cos((p + k) * omega)])
    assert np.abs(_shift_rotation(k * omega) @ at_p - at_p_plus_k).max() == 0.0


@given(p=st.integers(0, 200), k=st.integers(0, 200), half=st.integers(1, 16))
def test_shift_identity_for_every_pair(p, k, half):
    """PE(p + k) is PE(p) with every pair (2i, 2i+1) rotated by an angle k omega_i that depends
    on k alone, not on p."""
    width = 2 * half
    table = sinusoidal_table(p + k + 1, width)
    omegas = 10000.0 ** (-np.arange(0, width, 2) / width)
    for i, omega in enumerate(omegas):
        rotated = _shift_rotation(k * omega) @ table[p, 2 * i:2 * i + 2]
        np.testing.assert_allclose(rotated, table[p + k, 2 * i:2 * i + 2], rtol=0,
                                   atol=1e-12)


def test_sinusoidal_backward_is_identity_and_needs_nothing():
    dout = np.random.default_rng(1).standard_normal((2, 3, 4))
    dx = sinusoidal_positions_backward(dout, None)
    np.testing.assert_array_equal(dx, dout)
    assert dx is not dout


def test_sinusoidal_bad_input():
    with pytest.raises(ValueError, match=r"width must be even \(sin and cos fill the pairs "
                                         r"\(2i, 2i\+1\)\); got 5"):
        SinusoidalPositions(5)
    with pytest.raises(ValueError, match="width must be even"):
        sinusoidal_table(4, 3)
    with pytest.raises(ValueError, match=r"x must have an even last dimension C.*got shape "
                                         r"\(1, 2, 3\)"):
        sinusoidal_positions_forward(np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match=r"x must have last dimension 4 \(the sinusoidal "
                                         r"width\); got shape \(1, 2, 6\)"):
        SinusoidalPositions(4).forward(np.zeros((1, 2, 6)))
    with pytest.raises(ValueError, match="offset must be a non-negative integer; got -2"):
        sinusoidal_table(3, 4, offset=-2)
