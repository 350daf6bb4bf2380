"""Position-wise feed-forward networks: SwiGLU (Llama's MLP) and the classic MLP, through the
STYLE.md checklist, against HF's LlamaMLP and torch.nn.Sequential."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (SwiGLU, feedforward, gradcheck, gradcheck_module, swiglu_backward,
                      swiglu_forward)
from numpy_tf.layers.mlp import swiglu_gate_backward, swiglu_gate_forward


def _swiglu_inputs(rng, lead, width, hidden, bias):
    return {"x": rng.standard_normal((*lead, width)) * 1.5,
            "gate_weight": rng.standard_normal((hidden, width)),
            "up_weight": rng.standard_normal((hidden, width)),
            "down_weight": rng.standard_normal((width, hidden)),
            "gate_bias": rng.standard_normal(hidden) if bias else None,
            "up_bias": rng.standard_normal(hidden) if bias else None,
            "down_bias": rng.standard_normal(width) if bias else None}


# -- 1. finite differences --------------------------------------------------------------------
@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), width=st.integers(1, 5),
       hidden=st.integers(1, 6), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_swiglu_gradcheck_drawn_shapes(lead, width, hidden, bias, seed):
    rng = np.random.default_rng(seed)
    report = gradcheck(swiglu_forward, swiglu_backward,
                       _swiglu_inputs(rng, lead, width, hidden, bias), seed=seed)
    assert report.passed, str(report)


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_gate_gradcheck_drawn_shapes(shape, seed):
    rng = np.random.default_rng(seed)
    inputs = {"gate": rng.standard_normal(shape) * 3.0, "up": rng.standard_normal(shape)}
    report = gradcheck(swiglu_gate_forward, swiglu_gate_backward, inputs, seed=seed)
    assert report.passed, str(report)


@pytest.mark.parametrize("bias", [False, True])
def test_module_gradcheck(bias):
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    report = gradcheck_module(SwiGLU(4, 7, bias, rng=2), x)
    assert report.passed, str(report)
    checked = {row.name for row in report.rows}
    assert ({"gate_proj.bias", "up_proj.bias", "down_proj.bias"} <= checked) == bias


@given(activation=st.sampled_from(["gelu", "gelu_tanh", "silu"]), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_classic_mlp_gradcheck(activation, bias, seed):
    mlp = feedforward(3, 5, activation, bias, rng=seed)
    report = gradcheck_module(mlp, np.random.default_rng(seed).standard_normal((2, 2, 3)),
                              seed=seed)
    assert report.passed, str(report)


# -- 2. torch (HF LlamaMLP, nn.Sequential) -------------------------------------------------------
@pytest.mark.parametrize("name", ["swiglu", "swiglu_bias", "feedforward_gelu",
                                  "feedforward_gelu_tanh_nobias"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


# -- 3-5. dtype, accumulation, nothing mutated --------------------------------------------------
def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    check_contract(lambda dtype: SwiGLU(4, 6, rng=1, dtype=dtype), (x,))
    check_contract(lambda dtype: SwiGLU(4, 6, bias=True, rng=1, dtype=dtype), (x,))
    check_contract(lambda dtype: feedforward(4, 8, "gelu", rng=1, dtype=dtype), (x,))


# -- 6. values computed by hand ------------------------------------------------------------------
def test_one_feature_by_hand():
    """C = F = 1: y = w_d silu(w_g x) (w_u x), and dy/dx by the product rule."""
    x, w_gate, w_up, w_down = 0.7, 1.3, -0.4, 2.0
    g = w_gate * x
    sigma = 1.0 / (1.0 + math.exp(-g))
    expected = w_down * g * sigma * (w_up * x)
    dsilu = sigma * (1.0 + g * (1.0 - sigma))
    expected_dx = w_down * (dsilu * w_gate * w_up * x + g * sigma * w_up)
    y, cache = swiglu_forward(np.array([[x]]), np.array([[w_gate]]), np.array([[w_up]]),
                              np.array([[w_down]]))
    assert y[0, 0] == pytest.approx(expected, rel=1e-15)
    dx, dgate, dup, ddown, *biases = swiglu_backward(np.array([[1.0]]), cache)
    assert dx[0, 0] == pytest.approx(expected_dx, rel=1e-14)
    assert ddown[0, 0] == pytest.approx(g * sigma * w_up * x, rel=1e-15)
    assert dup[0, 0] == pytest.approx(w_down * g * sigma * x, rel=1e-15)
    assert dgate[0, 0] == pytest.approx(w_down * w_up * x * dsilu * x, rel=1e-14)
    assert biases == [None, None, None]


def test_a_closed_gate_passes_nothing():
    """silu(0) = 0 and silu'(0) = 1/2: with W_gate = 0 the output is zero, up_proj learns
    nothing, and the gate still gets a gradient (the path that can open it)."""
    layer = SwiGLU(3, 4, rng=3)
    layer.gate_proj.weight.data[:] = 0.0
    x = np.random.default_rng(4).standard_normal((2, 3))
    y, cache = layer.forward(x)
    np.testing.assert_array_equal(y, 0.0)
    layer.backward(np.random.default_rng(5).standard_normal((2, 3)), cache)
    np.testing.assert_array_equal(layer.up_proj.weight.grad, 0.0)
    assert np.abs(layer.gate_proj.weight.grad).max() > 0.01


def test_names_are_hugging_face_and_torch_names():
    assert list(SwiGLU(4, 6, bias=True).state_dict()) == [
        "gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
        "down_proj.weight", "down_proj.bias"]
    assert list(feedforward(4).state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert feedforward(4)[0].weight.shape == (16, 4)


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4))
    with pytest.raises(ValueError, match=r"gate_weight \(F, C\), up_weight \(F, C\) and "
                                         r"down_weight \(C, F\) must agree; got \(6, 4\), "
                                         r"\(5, 4\) and \(4, 6\)"):
        swiglu_forward(x, np.zeros((6, 4)), np.zeros((5, 4)), np.zeros((4, 6)))
    with pytest.raises(ValueError, match=r"x must have last dimension 4 .*got shape \(2, 3\)"):
        SwiGLU(4, 6).forward(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="x has dtype float32 but weight has dtype float64"):
        SwiGLU(4, 6).forward(x.astype(np.float32))
    with pytest.raises(ValueError, match="hidden must be a positive integer; got 0"):
        SwiGLU(4, 0)
    with pytest.raises(ValueError, match="activation must be one of"):
        feedforward(4, activation_name="swish")


# -- the classic MLP's backward: GELU's gradient written into the second Linear's -------------
def _mlp_step(activation, dtype, seed=0, lead=(3, 5), width=8, hidden=4096):
    rng = np.random.default_rng(seed)
    mlp = feedforward(width, hidden, activation, rng=seed, dtype=dtype)
    x = (rng.standard_normal((*lead, width)) * 2.0).astype(dtype)
    dout = rng.standard_normal((*lead, width)).astype(dtype)
    out, cache = mlp.forward(x)
    return mlp, x, dout, cache


def _backward_grads(mlp, dout, cache, backward):
    mlp.zero_grad()
    dx = backward(dout, cache)
    return dx, [p.grad.copy() for p in mlp.parameters()]


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_backward_equals_sequentials_bit_for_bit(activation, dtype):
    """MLP.backward lets the kernel's GELU write into the second Linear's input gradient; every
    gradient is the same bits as Sequential's backward, which gives GELU a new array (hidden
    4096 x 15 positions: several of the kernel's blocks)."""
    from numpy_tf.core.module import Sequential

    mlp, _, dout, cache = _mlp_step(activation, dtype)
    dx, grads = _backward_grads(mlp, dout, cache, mlp.backward)
    dx_seq, grads_seq = _backward_grads(mlp, dout, cache,
                                        lambda d, c: Sequential.backward(mlp, d, c))
    assert dx.dtype == dtype and dx.tobytes() == dx_seq.tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(grads, grads_seq))


def test_mlp_backward_mutates_neither_dout_nor_the_cache_and_repeats():
    mlp, _, dout, cache = _mlp_step("gelu", np.float32)
    dout_before = dout.copy()
    cached = [a.copy() for a in (cache.caches[1].x, cache.caches[1].out, cache.caches[2].x)]
    first = mlp.backward(dout, cache)
    second = mlp.backward(dout, cache)
    assert np.array_equal(dout, dout_before)
    assert all(np.array_equal(a, b) for a, b in
               zip(cached, (cache.caches[1].x, cache.caches[1].out, cache.caches[2].x)))
    assert first.tobytes() == second.tobytes() and first is not second


def test_mlp_backward_holds_one_hidden_array_fewer():
    """The point of MLP.backward: its peak is one (..., F) array below Sequential's, less a
    block's slope, which is then a temporary of its own (traced by tracemalloc; the hidden
    gradient is 128 x 4096 float32 = 2 MiB, a block 256 KiB)."""
    import tracemalloc

    from numpy_tf.core.module import Sequential
    from numpy_tf.kernels.blocks import BLOCK_BYTES

    mlp, _, dout, cache = _mlp_step("gelu", np.float32, lead=(4, 32))
    hidden_bytes = cache.caches[1].x.nbytes

    def peak(backward):
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            backward(dout, cache)
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
    peak(mlp.backward)                                   # warm: gradient buffers allocated
    sequential = peak(lambda d, c: Sequential.backward(mlp, d, c))
    own = peak(mlp.backward)
    assert sequential - own >= hidden_bytes - BLOCK_BYTES, (sequential, own, hidden_bytes)


def test_mlp_backward_under_record_activations_records_the_gelu_gradient():
    """A module whose backward is wrapped on the instance (here by record_activations) runs
    Sequential's backward, so the wrapper sees GELU's gradient arrive."""
    from numpy_tf.core.module import record_activations

    mlp, x, dout, _ = _mlp_step("gelu", np.float64)
    with record_activations(mlp) as recorder:
        _, cache = mlp.forward(x)
        dx = mlp.backward(dout, cache)
    dx_plain = mlp.backward(dout, mlp.forward(x)[1])
    assert set(recorder.gradients) == {"0", "1", "2"}
    assert dx.tobytes() == dx_plain.tobytes()
