"""Dropout: explicit randomness, the same mask in backward, identity in eval mode."""
import numpy as np
import pytest
from contract import check_contract

from numpy_tf import gradcheck
from numpy_tf.layers.dropout import Dropout, dropout_backward, dropout_forward


def test_mask_values_scale_and_reuse_in_backward():
    x = np.random.default_rng(0).standard_normal((50, 40))
    out, cache = dropout_forward(x, 0.25, np.random.default_rng(1))
    kept = cache.mask != 0
    np.testing.assert_allclose(out[kept], x[kept] / 0.75, rtol=1e-15)
    assert not out[~kept].any()
    assert abs(kept.mean() - 0.75) < 0.03
    dout = np.random.default_rng(2).standard_normal(x.shape)
    np.testing.assert_array_equal(dropout_backward(dout, cache), dout * cache.mask)


def test_gradcheck_with_a_fixed_generator():
    x = np.random.default_rng(3).standard_normal((4, 5))
    report = gradcheck(lambda x: dropout_forward(x, 0.5, np.random.default_rng(7)),
                       dropout_backward, {"x": x})
    assert report.passed


def test_same_seed_same_mask_and_eval_is_identity():
    x = np.ones((3, 3))
    a, _ = dropout_forward(x, 0.5, np.random.default_rng(9))
    b, _ = dropout_forward(x, 0.5, np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)
    layer = Dropout(0.5).eval()
    out, cache = layer.forward(x)
    assert out is x and cache.mask is None
    assert Dropout(0.0).forward(x)[0] is x


def test_contract_in_training_mode():
    x = np.random.default_rng(4).standard_normal((2, 6))
    check_contract(lambda dtype: Dropout(0.3, dtype), (x,), rng=np.random.default_rng(5))


def test_bad_input():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\); got 1.0"):
        Dropout(1.0)
    with pytest.raises(TypeError, match="needs rng=numpy.random.Generator"):
        Dropout(0.1).forward(np.ones(3))
