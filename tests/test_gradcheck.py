"""numpy_tf.gradcheck catches wrong backward passes and reports where."""
import numpy as np
import pytest

from numpy_tf import (Linear, gelu_backward, gelu_forward, gradcheck, gradcheck_module,
                      linear_backward, linear_forward)
from numpy_tf.activations import GELUCache


def _wrong_gelu_backward(dout, cache: GELUCache):
    """The derivative of the exact GELU applied to the tanh variant: numpy-ml's mistake."""
    _, exact = gelu_forward(cache.x, "none")
    return gelu_backward(dout, exact)


def test_full_mode_catches_a_backward_of_the_wrong_variant():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(lambda x: gelu_forward(x, "tanh"), _wrong_gelu_backward, {"x": x})
    assert not report.passed
    assert "FAIL" in str(report)


def test_fast_mode_catches_it_too():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(lambda x: gelu_forward(x, "tanh"), _wrong_gelu_backward, {"x": x},
                       fast=True)
    assert not report.passed


def test_worst_index_points_at_the_wrong_element():
    def backward(dout, cache):
        dx, dweight, dbias = linear_backward(dout, cache)
        dweight = dweight.copy()
        dweight[1, 2] += 1e-3
        return dx, dweight, dbias

    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((2, 3)), "weight": rng.standard_normal((4, 3)),
              "bias": rng.standard_normal(4)}
    report = gradcheck(linear_forward, backward, inputs)
    rows = {row.name: row for row in report.rows}
    assert rows["x"].passed and rows["bias"].passed
    assert not rows["weight"].passed and rows["weight"].worst_index == (1, 2)
    assert rows["weight"].max_abs_error == pytest.approx(1e-3, rel=1e-4)


def test_positional_inputs_wrt_and_float32_inputs_checked_in_float64():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    report = gradcheck(linear_forward, linear_backward, [x, w], wrt=["input1"])
    assert report.passed and [row.name for row in report.rows] == ["input1"]
    with pytest.raises(ValueError, match="wrt names 'w'"):
        gradcheck(linear_forward, linear_backward, {"x": x, "weight": w}, wrt=["w"])


def test_module_check_perturbs_a_copy_and_restores_nothing_of_the_original():
    layer = Linear(3, 2, rng=0, dtype=np.float32)
    before = layer.weight.data.copy()
    report = gradcheck_module(layer, np.ones((1, 3), dtype=np.float32))
    assert report.passed
    np.testing.assert_array_equal(layer.weight.data, before)
    assert not layer.weight.grad.any()


def test_report_text_and_dict():
    x = np.random.default_rng(3).standard_normal((2, 2))
    report = gradcheck(gelu_forward, gelu_backward, {"x": x})
    text = str(report)
    assert "max abs err" in text and "worst index" in text and "all passed" in text
    data = report.to_dict()
    assert data["passed"] and data["rows"][0]["name"] == "x"
