"""numpy_tf.gradcheck (numpy_tf/checking/finite_differences.py) catches wrong backward passes and reports where."""
import importlib

import numpy as np
import pytest

from numpy_tf import (Linear, gelu_backward, gelu_forward, gradcheck, gradcheck_module,
                      linear_backward, linear_forward)


def _tanh_gelu_with_the_exact_backward(x):
    """The tanh GELU whose cache holds the exact GELU's derivative: numpy-ml's mistake."""
    out, _ = gelu_forward(x, "tanh")
    return out, gelu_forward(x, "none")[1]


def test_full_mode_catches_a_backward_of_the_wrong_variant():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(_tanh_gelu_with_the_exact_backward, gelu_backward, {"x": x})
    assert not report.passed
    assert "FAIL" in str(report)


def test_fast_mode_catches_it_too():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(_tanh_gelu_with_the_exact_backward, gelu_backward, {"x": x},
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


# -- the full mode on a Module evaluates only downstream of the perturbed tensor ----------------
def _full_reports(module, *inputs):
    """The full check's report with and without reusing the unperturbed upstream."""
    tool = importlib.import_module("numpy_tf.checking.finite_differences")
    module = module.astype(np.float64)
    rng = np.random.default_rng(0)
    out, cache = module.forward(*inputs)
    dout = rng.standard_normal(np.shape(out))
    module.zero_grad()
    module.backward(dout, cache)
    tensors = {name: p.data for name, p in module.named_parameters()}
    analytic = {name: p.grad.copy() for name, p in module.named_parameters()}
    objective = lambda: float(np.sum(dout * module.forward(*inputs)[0]))  # noqa: E731
    return [tool._full_module_check("m", module, objective, tensors, analytic, 1e-6, rng, {},
                                    downstream).to_dict() for downstream in (True, False)]


@pytest.mark.parametrize("tied", [False, True])
def test_downstream_evaluation_gives_the_same_numbers_bit_for_bit(tied):
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.objectives import NextTokenLoss
    config = GPTConfig.tiny(vocab_size=5, max_context=3, width=4, heads=2, tied=tied,
                            init_std=0.3)
    ids = np.random.default_rng(1).integers(0, 5, (2, 3))
    replayed, plain = _full_reports(NextTokenLoss(GPT(config, rng=2)), ids)
    assert replayed == plain
    assert replayed["passed"]


class _WritesIntoItsChild(Linear):
    """A parent that adds into its child's output in place: reuse must not be fooled."""

    def __init__(self):
        super().__init__(3, 3, rng=0)
        self.inner = Linear(3, 3, rng=1)

    def forward(self, x):
        h, inner = self.inner.forward(x)
        h += 1.0
        y, own = super().forward(h)
        return y, (inner, own)

    def backward(self, dout, cache):
        return self.inner.backward(super().backward(dout, cache[1]), cache[0])


def test_a_caller_writing_into_an_output_falls_back_to_whole_forwards():
    x = np.random.default_rng(3).standard_normal((2, 3))
    replayed, plain = _full_reports(_WritesIntoItsChild(), x)
    assert replayed == plain and replayed["passed"]


def test_a_gradient_that_is_exactly_zero_is_marked_and_kept_out_of_the_summary():
    """Softmax ignores a shift shared by all keys, so the key projection's bias has a zero
    gradient: its finite differences are pure noise and its norm ratio means nothing."""
    from numpy_tf import MultiHeadAttention
    layer = MultiHeadAttention(6, 2, num_kv_heads=1, bias=True, rng=1)
    x = np.random.default_rng(2).standard_normal((2, 3, 6))
    report = gradcheck_module(layer, x)
    rows = {row.name: row for row in report.rows}
    assert report.passed and rows["k_proj.bias"].zero
    assert not any(row.zero for name, row in rows.items() if name != "k_proj.bias")
    assert report.max_norm_rel_error < 1e-7
