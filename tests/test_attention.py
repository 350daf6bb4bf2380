"""Scaled dot-product attention: the worked example, every mask, fully masked rows, GQA, dropout."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck
from numpy_tf.layers.attention import (ScaledDotProductAttention, attention_backward,
                                       attention_forward, causal_mask)


def _qkv(rng, batch=2, heads=2, groups=2, tq=3, tk=3, d=4, dv=4):
    return (rng.standard_normal((batch, heads, tq, d)), rng.standard_normal((batch, groups, tk, d)),
            rng.standard_normal((batch, groups, tk, dv)))


def test_two_tokens_of_causal_attention_worked_by_hand():
    q = k = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = np.array([[[[2.0, 0.0], [0.0, 4.0]]]])
    out, cache = attention_forward(q, k, v, is_causal=True)
    np.testing.assert_allclose(cache.probs[0, 0], [[1.0, 0.0], [0.330238, 0.669762]], atol=5e-7)
    np.testing.assert_allclose(out[0, 0], [[2.0, 0.0], [0.660477, 2.679046]], atol=5e-7)
    # the second row by hand: softmax([0, 1/sqrt 2])
    second = 1.0 / (1.0 + math.exp(-1.0 / math.sqrt(2.0)))
    assert cache.probs[0, 0, 1, 1] == pytest.approx(second, rel=1e-15)


@pytest.mark.parametrize("name", ["sdpa_causal", "sdpa_bool_mask", "sdpa_float_mask",
                                  "sdpa_cross", "sdpa_fully_masked", "sdpa_gqa"])
def test_agrees_with_torch_sdpa(name):
    assert_fixture_agrees(name)


@given(batch=st.integers(1, 2), groups=st.integers(1, 2), ratio=st.integers(1, 3),
       tq=st.integers(1, 4), tk=st.integers(1, 4), d=st.integers(1, 3), dv=st.integers(1, 3),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_gradcheck_drawn_shapes_and_masks(batch, groups, ratio, tq, tk, d, dv, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, batch, groups * ratio, groups, tq, tk, d, dv)
    padding = rng.random((batch, tk)) < 0.3
    bias = rng.standard_normal((tq, tk))
    report = gradcheck(attention_forward, attention_backward,
                       {"q": q, "k": k, "v": v, "attn_mask": bias, "key_padding_mask": padding,
                        "is_causal": causal, "causal_offset": max(0, tk - tq)},
                       wrt=["q", "k", "v"], seed=seed)
    assert report.passed, str(report)


def test_fully_masked_rows_give_zero_output_and_gradients_not_nan():
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng)
    padding = np.zeros((2, 3), dtype=bool)
    padding[1] = True                                   # every key of batch row 1 is padding
    blocked = np.zeros((3, 3), dtype=bool)
    blocked[0] = True                                   # query 0 may see nothing
    out, cache = attention_forward(q, k, v, attn_mask=blocked, key_padding_mask=padding)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, :, 0], 0.0)
    dq, dk, dv = attention_backward(rng.standard_normal(out.shape), cache)
    for gradient in (dq, dk, dv):
        assert np.all(np.isfinite(gradient))
    np.testing.assert_array_equal(dq[1], 0.0)
    np.testing.assert_array_equal(dq[0, :, 0], 0.0)
    np.testing.assert_array_equal(dk[1], 0.0)
    np.testing.assert_array_equal(dv[1], 0.0)
    # a float mask of -inf on a whole row behaves the same
    minus_inf = np.where(blocked, -np.inf, 0.0)
    out2, _ = attention_forward(q, k, v, attn_mask=minus_inf, key_padding_mask=padding)
    np.testing.assert_array_equal(out2, out)


def test_bool_mask_equals_float_minus_inf_mask_and_padding_equals_its_bool_mask():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, tk=5)
    blocked = rng.random((2, 1, 3, 5)) < 0.4
    blocked[..., 0] = False
    a, _ = attention_forward(q, k, v, attn_mask=blocked)
    b, _ = attention_forward(q, k, v, attn_mask=np.where(blocked, -np.inf, 0.0))
    np.testing.assert_allclose(a, b, rtol=1e-15, atol=1e-15)
    padding = np.array([[False, False, True, False, True], [False] * 5])
    c, _ = attention_forward(q, k, v, key_padding_mask=padding)
    d, _ = attention_forward(q, k, v, attn_mask=padding[:, None, None, :])
    np.testing.assert_array_equal(c, d)


def test_causal_offset_matches_slicing_a_longer_causal_run():
    """With a KV cache of P earlier positions, the last queries see exactly what they see in a
    full causal run."""
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, tq=6, tk=6)
    full, _ = attention_forward(q, k, v, is_causal=True)
    tail, _ = attention_forward(q[:, :, 4:], k, v, is_causal=True, causal_offset=4)
    np.testing.assert_allclose(tail, full[:, :, 4:], rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(causal_mask(2, 4, 2), [[False] * 3 + [True], [False] * 4])


def test_grouped_query_equals_repeated_key_value_heads():
    """KV head j serves query heads j r .. j r + r - 1 (repeat_interleave, HF Llama)."""
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, heads=6, groups=2, tq=4, tk=4)
    grouped, cache = attention_forward(q, k, v, is_causal=True)
    repeated, _ = attention_forward(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1),
                                    is_causal=True)
    np.testing.assert_allclose(grouped, repeated, rtol=1e-14, atol=1e-15)
    dout = rng.standard_normal(grouped.shape)
    dq, dk, dv = attention_backward(dout, cache)
    _, rcache = attention_forward(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1),
                                  is_causal=True)
    rdq, rdk, rdv = attention_backward(dout, rcache)
    np.testing.assert_allclose(dq, rdq, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dk, rdk.reshape(2, 2, 3, 4, 4).sum(axis=2), rtol=1e-13,
                               atol=1e-14)
    np.testing.assert_allclose(dv, rdv.reshape(2, 2, 3, 4, 4).sum(axis=2), rtol=1e-13,
                               atol=1e-14)


def test_permutation_equivariance_without_masks():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, tq=5, tk=5)
    order = rng.permutation(5)
    out, _ = attention_forward(q, k, v)
    permuted, _ = attention_forward(q[:, :, order], k[:, :, order], v[:, :, order])
    np.testing.assert_allclose(permuted, out[:, :, order], rtol=1e-13, atol=1e-14)


def test_single_position():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, tq=1, tk=1)
    out, cache = attention_forward(q, k, v, is_causal=True)
    np.testing.assert_allclose(out, v, rtol=1e-15)          # one key: weight exactly 1
    np.testing.assert_array_equal(cache.probs, 1.0)


def test_dropout_uses_its_mask_in_backward_and_is_unbiased():
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, tq=4, tk=4)
    out, cache = attention_forward(q, k, v, dropout_p=0.5, rng=np.random.default_rng(1))
    assert set(np.unique(cache.dropout)) <= {0.0, 2.0}
    np.testing.assert_allclose(out, (cache.probs * cache.dropout) @ v, rtol=1e-14)
    report = gradcheck(lambda q, k, v: attention_forward(q, k, v, dropout_p=0.5,
                                                         rng=np.random.default_rng(1)),
                       attention_backward, {"q": q, "k": k, "v": v})
    assert report.passed, str(report)
    means = np.mean([attention_forward(q, k, v, dropout_p=0.3, rng=np.random.default_rng(s))[0]
                     for s in range(400)], axis=0)
    np.testing.assert_allclose(means, attention_forward(q, k, v)[0], atol=0.15)
    layer = ScaledDotProductAttention(dropout=0.5).eval()
    np.testing.assert_array_equal(layer.forward(q, k, v)[0], attention_forward(q, k, v)[0])
    with pytest.raises(TypeError, match="needs rng"):
        attention_forward(q, k, v, dropout_p=0.1)


def test_contract():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, heads=4, groups=2)
    check_contract(lambda dtype: ScaledDotProductAttention(is_causal=True, dtype=dtype),
                   (q, k, v), key_padding_mask=np.array([[False, False, True], [False] * 3]))


def test_float32_masks_and_tables_stay_float32():
    rng = np.random.default_rng(8)
    q, k, v = (a.astype(np.float32) for a in _qkv(rng))
    out, cache = attention_forward(q, k, v, attn_mask=np.zeros((3, 3), np.float32),
                                   is_causal=True)
    assert out.dtype == np.float32 and cache.probs.dtype == np.float32
    with pytest.raises(TypeError, match="float mask of the query dtype float32"):
        attention_forward(q, k, v, attn_mask=np.zeros((3, 3)))


def test_bad_input():
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, heads=3, groups=2)
    with pytest.raises(ValueError, match=r"key/value heads \(2\) must divide the query heads "
                                         r"\(3\)"):
        attention_forward(q, k, v)
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="key and value lengths must agree"):
        attention_forward(q, k, v[:, :, :2])
    with pytest.raises(ValueError, match=r"attn_mask must broadcast to \(B, H, Tq, Tk\) = "
                                         r"\(2, 2, 3, 3\) .*; got \(3, 4\)"):
        attention_forward(q, k, v, attn_mask=np.zeros((3, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"attn_mask must broadcast .*; got \(6, 3, 3\)"):
        attention_forward(q, k, v, attn_mask=np.zeros((6, 3, 3), dtype=bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        attention_forward(q, k, v, attn_mask=np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\) = "
                                         r"\(2, 3\); got \(3, 2\)"):
        attention_forward(q, k, v, key_padding_mask=np.zeros((3, 2), dtype=bool))
    with pytest.raises(ValueError, match="k must have the query head width"):
        attention_forward(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \(B, H, Tq, d\)"):
        attention_forward(q[0], k, v)


@pytest.mark.parametrize("scale", [0.37, 2.5, -0.8])
def test_gradcheck_an_explicit_scale(scale):
    """The backward must use the scale the forward used (cache.scale), not 1/sqrt(d): each
    scale here differs from 1/sqrt(4) = 0.5, with grouped-query heads and a causal offset."""
    rng = np.random.default_rng(31)
    q, k, v = _qkv(rng, batch=2, heads=4, groups=2, tq=3, tk=5, d=4, dv=3)
    report = gradcheck(attention_forward, attention_backward,
                       {"q": q, "k": k, "v": v, "is_causal": True, "causal_offset": 2,
                        "scale": scale}, wrt=["q", "k", "v"], seed=32)
    assert report.passed, str(report)


@pytest.mark.parametrize("scale", [0.37, 2.5])
def test_the_kernel_backward_uses_an_explicit_scale(scale):
    """ScaledDotProductAttention runs kernels.attention's backward on the fields of the cache,
    the scale among them: equal to the reference's (to rounding) for a scale that is not
    1/sqrt(d)."""
    from numpy_tf.kernels.attention import attention_backward_into
    rng = np.random.default_rng(33)
    q, k, v = _qkv(rng, batch=2, heads=4, groups=2, tq=3, tk=5, d=4, dv=3)
    _, cache = attention_forward(q, k, v, key_padding_mask=rng.random((2, 5)) < 0.3,
                                 scale=scale)
    dout = rng.standard_normal((2, 4, 3, 3))
    for ours, reference in zip(attention_backward_into(dout, *cache),
                               attention_backward(dout, cache)):
        np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-13)


def test_the_one_test_fast_paths_accept_only_what_the_full_checks_accept(monkeypatch):
    """check_qkv's and MultiHeadAttention's one-expression tests of the usual inputs: every
    input they accept, over shapes that break each rule in turn and mixed dtypes, also passes
    the full checks (run with the fast test switched off)."""
    from itertools import product

    from numpy_tf.layers import attention as attention_module
    from numpy_tf.layers.multihead import FusedAttention

    fast_qkv = attention_module._plain_qkv
    shapes = [(2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6), (1, 2, 5, 8), (2, 3, 5, 8), (2, 0, 5, 8),
              (2, 4, 3), (2, 2, 4, 8)]
    dtypes = [np.float32, np.float64, np.int64]
    accepted = 0
    for (qs, ks, vs), (qd, kd, vd) in product(product(shapes, repeat=3),
                                              [(a, a, a) for a in dtypes] +
                                              [(np.float32, np.float64, np.float32)]):
        q, k, v = np.zeros(qs, qd), np.zeros(ks, kd), np.zeros(vs, vd)
        if fast_qkv(q, k, v):
            accepted += 1
            monkeypatch.setattr(attention_module, "_plain_qkv", lambda *a: False)
            attention_module.check_qkv(q, k, v)             # raises if the fast test erred
            monkeypatch.setattr(attention_module, "_plain_qkv", fast_qkv)
    assert accepted > 10

    layer = FusedAttention(8, 2, rng=0)                     # heads of width 4, G = 2
    query = np.zeros((2, 3, 8))
    pasts = [(np.zeros((2, 2, p, 4)), np.zeros((2, 2, p, 4))) for p in (0, 5)] + [
        (np.zeros((2, 2, 5, 4)), np.zeros((2, 2, 4, 4))),
        (np.zeros((1, 2, 5, 4)), np.zeros((1, 2, 5, 4))),
        (np.zeros((2, 2, 5, 4), np.float32), np.zeros((2, 2, 5, 4), np.float32)),
        (np.zeros((2, 2, 5, 2)), np.zeros((2, 2, 5, 2))),
        (np.zeros((2, 1, 5, 4)), np.zeros((2, 1, 5, 4))),
        (np.zeros((2, 2, 5, 4)),), [np.zeros((2, 2, 5, 4))] * 2]
    accepted = 0
    for past in pasts:
        if layer._plain_kv(past, query):
            accepted += 1
            layer._check_kv("past_kv", past, query)        # raises if the fast test erred
    assert accepted == 2                                    # the two plain caches
