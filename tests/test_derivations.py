"""The intermediate identities the backward docstrings state, each evaluated against central
finite differences in float64 (the final closed forms are gradchecked in each layer's tests;
these are the steps a student follows to reach them).

Each check differentiates a small function of its own, built from the definitions in the
docstring, so a wrong step fails even where the final formula is right (the LayerNorm and
RMSNorm steps once said -inv_std x_hat_j / C: the tests below show that value is not the
derivative).
"""
import math

import numpy as np
import pytest

from numpy_tf.core.special import erfc
from numpy_tf.layers.activations import gelu_forward, silu_forward
from numpy_tf.layers.attention import attention_backward, attention_forward, masked_softmax
from numpy_tf.layers.cross_entropy_loss import cross_entropy_forward
from numpy_tf.layers.norm import layernorm_forward, rmsnorm_forward
from numpy_tf.layers.rope import rope_backward, rope_forward, rope_rotate, rope_tables
from numpy_tf.layers.softmax import log_softmax_forward, softmax_forward

STEP = 1e-6
RTOL, ATOL = 1e-7, 1e-9         # central differences in float64: error ~ STEP^2 + 1e-16 / STEP


def jacobian(function, x: np.ndarray) -> np.ndarray:
    """d function(x)_i / d x_j by central differences: (out size, x size)."""
    x = np.asarray(x, dtype=np.float64)
    columns = []
    for j in range(x.size):
        step = np.zeros_like(x)
        step.flat[j] = STEP
        columns.append((np.ravel(function(x + step)) - np.ravel(function(x - step))) / (2 * STEP))
    return np.stack(columns, axis=-1)


def close(got, want, rtol=RTOL, atol=ATOL) -> bool:
    return bool(np.allclose(got, want, rtol=rtol, atol=atol))


ROW = np.array([0.3, -1.2, 2.0, 0.7, -0.4])           # one row of C = 5 features
EPS = 1e-5


# -- LayerNorm --------------------------------------------------------------------------------
def _layernorm_parts(x):
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    inv_std = (var + EPS) ** -0.5
    return mean, var, inv_std, (x - mean) * inv_std


def test_layernorm_d_inv_std_is_minus_inv_std_squared_x_hat_over_c():
    _, _, inv_std, x_hat = _layernorm_parts(ROW)
    numeric = jacobian(lambda x: _layernorm_parts(x)[2], ROW)[0]
    assert close(numeric, -inv_std ** 2 * x_hat / ROW.size)
    assert not close(numeric, -inv_std * x_hat / ROW.size)         # the old, wrong step


def test_layernorm_d_mean_and_d_var():
    mean = ROW.mean()
    assert close(jacobian(lambda x: _layernorm_parts(x)[0], ROW)[0], np.full(5, 1 / 5))
    assert close(jacobian(lambda x: _layernorm_parts(x)[1], ROW)[0], 2 / 5 * (ROW - mean))


def test_layernorm_d_x_hat_is_inv_std_times_identity_minus_1_over_c_minus_outer():
    _, _, inv_std, x_hat = _layernorm_parts(ROW)
    c = ROW.size
    want = inv_std * (np.eye(c) - 1 / c - np.outer(x_hat, x_hat) / c)
    assert close(jacobian(lambda x: _layernorm_parts(x)[3], ROW), want)


def test_layernorm_the_parts_are_layernorm_forwards():
    out, cache = layernorm_forward(ROW[None], eps=EPS)
    _, _, inv_std, x_hat = _layernorm_parts(ROW)
    assert close(cache.inv_std[0, 0], inv_std, 1e-15, 0) and close(cache.x_hat[0], x_hat,
                                                                     1e-15, 1e-16)


# -- RMSNorm ----------------------------------------------------------------------------------
def _rmsnorm_parts(x):
    inv_rms = ((x * x).mean() + EPS) ** -0.5
    return inv_rms, x * inv_rms


def test_rmsnorm_d_inv_rms_is_minus_inv_rms_squared_x_hat_over_c():
    inv_rms, x_hat = _rmsnorm_parts(ROW)
    numeric = jacobian(lambda x: _rmsnorm_parts(x)[0], ROW)[0]
    assert close(numeric, -inv_rms ** 2 * x_hat / ROW.size)
    assert not close(numeric, -inv_rms * x_hat / ROW.size)         # the old, wrong step


def test_rmsnorm_d_x_hat_is_inv_rms_times_identity_minus_outer():
    inv_rms, x_hat = _rmsnorm_parts(ROW)
    want = inv_rms * (np.eye(5) - np.outer(x_hat, x_hat) / 5)
    assert close(jacobian(lambda x: _rmsnorm_parts(x)[1], ROW), want)
    _, cache = rmsnorm_forward(ROW[None], eps=EPS)
    assert close(cache.inv_rms[0, 0], inv_rms, 1e-15, 0)


# -- softmax: the Jacobian and its contraction --------------------------------------------------
def test_softmax_jacobian_is_p_times_identity_minus_p():
    p = softmax_forward(ROW)[0]
    assert close(jacobian(lambda x: softmax_forward(x)[0], ROW), p[:, None] *
                 (np.eye(5) - p[None, :]))


def test_log_softmax_jacobian_is_identity_minus_p():
    p = softmax_forward(ROW)[0]
    assert close(jacobian(lambda x: log_softmax_forward(x)[0], ROW), np.eye(5) - p[None, :])


def test_attention_softmax_contraction_ds_is_p_times_dp_minus_rowsum():
    """dS = P * (dP - rowsum(dP * P)): the vector-Jacobian product of the row softmax,
    here with a blocked entry (S = -inf: P = 0 there, and so dS = 0)."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 6))
    blocked = np.zeros_like(scores, dtype=bool)
    blocked[1, 2] = blocked[2, 0] = True
    dprobs = rng.standard_normal(scores.shape)

    def probs_of(s):
        s = s.reshape(scores.shape).copy()
        s[blocked] = -np.inf
        return masked_softmax(s)

    probs = probs_of(scores)
    numeric = jacobian(lambda s: np.sum(dprobs * probs_of(s)), scores)[0].reshape(scores.shape)
    want = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
    assert close(numeric, want)
    assert np.all(want[blocked] == 0.0)
    assert not close(numeric, dprobs * probs)                       # the rowsum term matters


def test_attention_step_3_dq_is_s_ds_k_and_dk_is_s_ds_transposed_q():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 3, 2)) for _ in range(3))
    dout = rng.standard_normal((1, 1, 3, 2))
    _, cache = attention_forward(q, k, v, is_causal=True)
    dq, dk, _ = attention_backward(dout, cache)
    scale = 1 / math.sqrt(2)

    def loss(q_, k_):
        return np.sum(dout * attention_forward(q_, k_, v, is_causal=True)[0])

    assert close(jacobian(lambda x: loss(x.reshape(q.shape), k), q)[0], dq.ravel())
    assert close(jacobian(lambda x: loss(q, x.reshape(k.shape)), k)[0], dk.ravel())
    # the same through dS: S = s q k^T
    probs = cache.probs
    dprobs = dout @ v.swapaxes(-1, -2)
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))
    assert close(dq, scale * dscores @ k, 1e-14, 1e-15)
    assert close(dk, scale * dscores.swapaxes(-1, -2) @ q, 1e-14, 1e-15)


# -- RoPE -------------------------------------------------------------------------------------
def test_rope_jacobian_of_a_pair_is_the_rotation_and_its_transpose_is_minus_theta():
    theta = 0.7
    cos, sin = np.array([[math.cos(theta)]]), np.array([[math.sin(theta)]])    # (T=1, D/2=1)

    def rotate(pair):
        return rope_rotate(pair.reshape(1, 1, 1, 2), cos, sin, interleaved=True)

    rotation = np.array([[math.cos(theta), -math.sin(theta)],
                         [math.sin(theta), math.cos(theta)]])
    numeric = jacobian(rotate, np.array([0.4, -1.1]))
    assert close(numeric, rotation)
    minus_theta = jacobian(lambda p: rope_rotate(p.reshape(1, 1, 1, 2), cos, -sin, True),
                           np.array([0.4, -1.1]))
    assert close(numeric.T, minus_theta)                            # R(theta)^T = R(-theta)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_backward_is_the_rotation_by_minus_theta_and_undoes_the_forward(interleaved):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 3, 4))
    dout = rng.standard_normal(x.shape)
    positions = np.array([0, 5, 17])
    out, cache = rope_forward(x, positions, interleaved=interleaved)
    cos, sin = rope_tables(positions, 4)
    numeric = jacobian(lambda v: np.sum(dout * rope_forward(v.reshape(x.shape), positions,
                                                            interleaved=interleaved)[0]), x)
    dx = rope_backward(dout, cache)
    assert close(numeric[0], dx.ravel())
    assert close(dx, rope_rotate(dout, cos, -sin, interleaved), 1e-15, 1e-15)
    assert close(rope_backward(out, cache), x, 1e-14, 1e-15)        # the inverse


# -- elementwise slopes -----------------------------------------------------------------------
X = np.array([-6.0, -2.5, -0.7, -1e-3, 0.3, 1.1, 3.9])


def _slope(forward):
    return np.diag(jacobian(lambda x: forward(x)[0], X))


def test_gelu_slope_is_phi_plus_x_times_density():
    cdf = erfc(-X / math.sqrt(2)) / 2
    pdf = np.exp(-X * X / 2) / math.sqrt(2 * math.pi)
    assert close(_slope(gelu_forward), cdf + X * pdf)
    out, _ = gelu_forward(X)
    forwards_cdf = erfc(X * -math.sqrt(0.5)) / 2                     # as the forward rounds it
    assert close(out / X, forwards_cdf, 2 * 2.3e-16, 0)              # Phi(x) = y / x: 2 roundings
    assert not close(_slope(gelu_forward), cdf)


def test_gelu_tanh_slope():
    c = 0.044715
    t = np.tanh(math.sqrt(2 / math.pi) * (X + c * X ** 3))
    du_dx = math.sqrt(2 / math.pi) * (1 + 3 * c * X ** 2)
    want = (1 + t) / 2 + X * (1 - t ** 2) * du_dx / 2
    assert close(_slope(lambda x: gelu_forward(x, "tanh")), want)


def test_silu_slope_is_s_times_1_plus_x_times_1_minus_s():
    s = 1 / (1 + np.exp(-X))
    assert close(jacobian(lambda x: 1 / (1 + np.exp(-x)), X).diagonal(), s * (1 - s))
    assert close(_slope(silu_forward), s * (1 + X * (1 - s)))


# -- cross-entropy ----------------------------------------------------------------------------
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_d_logits_is_p_minus_smoothed_one_hot(smoothing):
    target = 2
    p = softmax_forward(ROW)[0]

    def loss(z):
        return cross_entropy_forward(z[None], np.array([target]), label_smoothing=smoothing)[0]

    one_hot = np.eye(5)[target]
    assert close(jacobian(loss, ROW)[0], p - (1 - smoothing) * one_hot - smoothing / 5)
