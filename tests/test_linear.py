"""Linear: the STYLE.md checklist."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import Linear, gradcheck, gradcheck_module, linear_backward, linear_forward


@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), fan_in=st.integers(1, 5),
       fan_out=st.integers(1, 5), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_gradcheck_drawn_shapes(lead, fan_in, fan_out, bias, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((*lead, fan_in)),
              "weight": rng.standard_normal((fan_out, fan_in)),
              "bias": rng.standard_normal(fan_out) if bias else None}
    report = gradcheck(linear_forward, linear_backward, inputs, seed=seed)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", ["linear", "linear_nobias"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    check_contract(lambda dtype: Linear(4, 5, rng=1, dtype=dtype), (x,))
    check_contract(lambda dtype: Linear(4, 5, bias=False, rng=1, dtype=dtype), (x,))


def test_module_gradcheck():
    x = np.random.default_rng(0).standard_normal((3, 4))
    assert gradcheck_module(Linear(4, 2, rng=3), x).passed


def test_bad_input():
    layer = Linear(4, 5)
    with pytest.raises(ValueError, match=r"x must have last dimension 4 .*got shape \(2, 3\)"):
        layer.forward(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="x has dtype float32 but weight has dtype float64"):
        layer.forward(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="x must be float32 or float64; got dtype int64"):
        layer.forward(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(TypeError, match="x must be a numpy array; got list"):
        layer.forward([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\); got \(4,\)"):
        linear_forward(np.zeros((1, 4)), np.zeros((5, 4)), np.zeros(4))
    with pytest.raises(ValueError, match="out_features must be a positive integer; got 0"):
        Linear(4, 0)
