"""softmax and log_softmax."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_tf import (gradcheck, log_softmax_backward, log_softmax_forward, softmax_backward,
                      softmax_forward)
from numpy_tf.layers.softmax import LogSoftmax, Softmax

arrays = hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
                    elements=st.floats(-10, 10))


@given(x=arrays, axis=st.integers(-1, 0))
def test_gradcheck(x, axis):
    for forward, backward in [(softmax_forward, softmax_backward),
                              (log_softmax_forward, log_softmax_backward)]:
        report = gradcheck(forward, backward, {"x": x, "axis": axis})
        assert report.passed, str(report)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_huge_logits_do_not_overflow():
    x = np.array([[1e4, 1e4 - 1.0, -1e4]])
    probs, _ = softmax_forward(x)
    np.testing.assert_allclose(probs, [[1 / (1 + np.exp(-1)), 1 / (1 + np.e), 0.0]], rtol=1e-15)
    logs, _ = log_softmax_forward(x)
    np.testing.assert_allclose(logs[0, :2], [-np.log1p(np.exp(-1)), -1 - np.log1p(np.exp(-1))],
                               rtol=1e-15)


@pytest.mark.parametrize("make", [lambda d: Softmax(-1, d), lambda d: LogSoftmax(-1, d)])
def test_contract(make):
    check_contract(make, (np.random.default_rng(1).standard_normal((2, 5)),))
