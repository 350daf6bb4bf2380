"""FlashAttention-2 as a reference: equal to plain attention for every tile size and mask, its
tile statistics, the flash-decoding combine, fully masked rows, finite differences."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck
from numpy_tf.layers import flash_attention as flash
from numpy_tf.layers.attention import attention_backward, attention_forward
from numpy_tf.layers.flash_attention import (flash_attention_backward, flash_attention_forward,
                                             flash_attention_statistics, flash_decoding)

RELATIVE = 1e-12        # the bound: float64, relative to the largest |value| compared


def assert_equal_within(theirs, ours, scale=None):
    """|theirs - ours| <= 1e-12 max|ours| (S: the largest |value| of the set compared, so a
    tensor that is zero by definition, a softmax over one key, is held to its group's noise)."""
    scale = max(np.abs(ours).max(initial=0.0), 1e-300) if scale is None else scale
    assert np.all(np.isfinite(theirs))
    error = np.abs(theirs - ours).max(initial=0.0)
    assert error <= RELATIVE * scale, f"error {error:.2e} > {RELATIVE:g} x {scale:.2e}"


def draw_inputs(rng, batch, groups, ratio, tq, tk, d, dv, mask_kind, padding, causal, offset):
    q = rng.standard_normal((batch, groups * ratio, tq, d))
    k = rng.standard_normal((batch, groups, tk, d))
    v = rng.standard_normal((batch, groups, tk, dv))
    attn_mask = None
    if mask_kind == "bool":                                 # some rows fully blocked
        attn_mask = rng.random((tq, tk)) < 0.3
        attn_mask[rng.integers(tq)] = True
    elif mask_kind == "float per head":
        attn_mask = rng.standard_normal((1, groups * ratio, tq, tk))
    elif mask_kind == "bool per batch":
        attn_mask = rng.random((batch, 1, tq, tk)) < 0.4
    key_padding_mask = None
    if padding:
        key_padding_mask = rng.random((batch, tk)) < 0.3
        key_padding_mask[-1] = rng.random() < 0.3           # sometimes a sequence all padding
    return q, k, v, dict(attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                         is_causal=causal, causal_offset=offset)


@given(batch=st.integers(1, 2), groups=st.integers(1, 2), ratio=st.integers(1, 3),
       tq=st.integers(1, 9), tk=st.integers(1, 11), d=st.integers(1, 4), dv=st.integers(1, 3),
       mask_kind=st.sampled_from([None, "bool", "float per head", "bool per batch"]),
       padding=st.booleans(), causal=st.booleans(), offset=st.integers(0, 3),
       block_q=st.integers(1, 10), block_k=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_equals_plain_attention_for_every_tile_size_and_mask(batch, groups, ratio, tq, tk, d, dv,
                                                            mask_kind, padding, causal, offset,
                                                            block_q, block_k, seed):
    rng = np.random.default_rng(seed)
    q, k, v, masks = draw_inputs(rng, batch, groups, ratio, tq, tk, d, dv, mask_kind, padding,
                                 causal, offset)
    plain, plain_cache = attention_forward(q, k, v, **masks)
    out, cache = flash_attention_forward(q, k, v, **masks, block_q=block_q, block_k=block_k)
    assert_equal_within(out, plain)
    dout = rng.standard_normal(plain.shape)
    expected = attention_backward(dout, plain_cache)
    scale = max(np.abs(g).max() for g in expected)
    for got, want in zip(flash_attention_backward(dout, cache), expected):
        assert got.shape == want.shape
        assert_equal_within(got, want, scale)
    # the cached L is the row logsumexp of plain attention's scores (+inf where P is all 0)
    probs = plain_cache.probs
    seen = probs.sum(axis=-1) > 0
    assert np.array_equal(np.isfinite(cache.logsumexp), seen)
    shape = (*q.shape[:3], tk)
    scores = flash._tile_scores(q, flash._heads(k, q.shape[1]), cache.blocked, cache.bias,
                                shape, slice(0, tq), slice(0, tk), cache.scale)
    assert_equal_within(np.exp(scores - cache.logsumexp[..., None]), probs)   # P = exp(S - L)
    decoding = flash_decoding(q, k, v, **masks, chunk_size=block_k)
    assert_equal_within(decoding.out, plain)
    np.testing.assert_allclose(decoding.logsumexp[seen], cache.logsumexp[seen], rtol=1e-13)
    statistics = flash_attention_statistics(q, k, **masks, block_k=block_k)
    assert statistics.row_max.shape == (*q.shape[:3], math.ceil(tk / block_k))
    np.testing.assert_allclose(statistics.logsumexp[seen], cache.logsumexp[seen], rtol=1e-13)
    assert np.all(np.isposinf(statistics.logsumexp[~seen]))


def test_the_tile_statistics_of_a_worked_row():
    """One query, scores 1, 3, 2 (q . k_j with scale 1), one key per tile:
    m = 1, 3, 3 and l = 1, 1 + e^-2, 1 + e^-2 + e^-1; L = 3 + log l."""
    q = np.ones((1, 1, 1, 1))
    k = np.array([1.0, 3.0, 2.0]).reshape(1, 1, 3, 1)
    statistics = flash_attention_statistics(q, k, scale=1.0, block_k=1)
    np.testing.assert_array_equal(statistics.row_max[0, 0, 0], [1.0, 3.0, 3.0])
    np.testing.assert_allclose(statistics.row_sum[0, 0, 0],
                               [1.0, 1.0 + math.exp(-2.0), 1.0 + math.exp(-2.0) + math.exp(-1.0)],
                               rtol=1e-15)
    expected_l = 3.0 + math.log(1.0 + math.exp(-2.0) + math.exp(-1.0))
    assert statistics.logsumexp[0, 0, 0] == pytest.approx(expected_l, rel=1e-15)
    two = flash_attention_statistics(q, k, scale=1.0, block_k=2)       # tiles {1, 3}, {2}
    np.testing.assert_array_equal(two.row_max[0, 0, 0], [3.0, 3.0])
    # the forward's own running L after t tiles is the L of the keys of those tiles
    for tiles in (1, 2, 3):
        _, cache = flash_attention_forward(q, k[:, :, :tiles], k[:, :, :tiles], scale=1.0,
                                           block_k=1)
        m, l_ = statistics.row_max[0, 0, 0, tiles - 1], statistics.row_sum[0, 0, 0, tiles - 1]
        assert cache.logsumexp[0, 0, 0] == pytest.approx(m + math.log(l_), rel=1e-15)


def test_statistics_before_the_first_visible_key_are_minus_inf_and_zero():
    q = np.ones((1, 1, 2, 2))
    k = np.ones((1, 1, 4, 2))
    padding = np.array([[True, True, False, False]])
    statistics = flash_attention_statistics(q, k, key_padding_mask=padding, block_k=2)
    assert np.all(np.isneginf(statistics.row_max[..., 0]))
    assert np.all(statistics.row_sum[..., 0] == 0)
    np.testing.assert_allclose(statistics.row_sum[..., 1], 2.0, rtol=1e-15)


def test_tiles_above_the_causal_diagonal_are_skipped(monkeypatch):
    """T = 8 in tiles of 2: the forward computes 4 + 3 + 2 + 1 = 10 of the 16 tiles, the
    backward the same 10; with an offset of 2 (two cached keys) one diagonal more."""
    calls = []
    original = flash._tile_scores
    monkeypatch.setattr(flash, "_tile_scores", lambda *a: calls.append(1) or original(*a))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 2)) for _ in range(3))
    out, cache = flash_attention_forward(q, k, v, is_causal=True, block_q=2, block_k=2)
    assert len(calls) == 10
    flash_attention_backward(rng.standard_normal(out.shape), cache)
    assert len(calls) == 20
    calls.clear()
    k10, v10 = (rng.standard_normal((1, 1, 10, 2)) for _ in range(2))
    flash_attention_forward(q, k10, v10, is_causal=True, causal_offset=2, block_q=2, block_k=2)
    assert len(calls) == 5 + 4 + 3 + 2
    calls.clear()
    flash_attention_forward(q, k, v, block_q=2, block_k=2)             # not causal: all 16
    assert len(calls) == 16


def test_fully_masked_rows_give_zero_output_zero_gradients_and_no_nan():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 2, 4, 3)) for _ in range(3))
    padding = np.zeros((2, 4), dtype=bool)
    padding[1] = True                                   # sequence 1: every key is padding
    blocked = np.zeros((4, 4), dtype=bool)
    blocked[2] = True                                   # query 2 sees nothing
    out, cache = flash_attention_forward(q, k, v, attn_mask=blocked, key_padding_mask=padding,
                                         block_q=3, block_k=3)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, :, 2], 0.0)
    assert np.all(np.isposinf(cache.logsumexp[1])) and np.all(np.isposinf(cache.logsumexp[0, :, 2]))
    dq, dk, dv = flash_attention_backward(rng.standard_normal(out.shape), cache)
    for gradient in (dq, dk, dv):
        assert np.all(np.isfinite(gradient))
    for gradient in (dq[1], dk[1], dv[1], dq[0, :, 2]):
        np.testing.assert_array_equal(gradient, 0.0)
    decoding = flash_decoding(q, k, v, attn_mask=blocked, key_padding_mask=padding,
                              chunk_size=2)
    np.testing.assert_array_equal(decoding.out[1], 0.0)
    assert np.all(np.isneginf(decoding.chunk_max[:, 1])) and np.all(decoding.chunk_sum[:, 1] == 0)


def test_flash_decoding_one_query_against_a_long_cache():
    """One new token (Tq = 1) at position 40 of a 41-key cache, GQA, chunks of 16, 16, 9:
    each chunk's partials and the combine give plain attention's output."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 1, 8))
    k, v = rng.standard_normal((2, 2, 41, 8)), rng.standard_normal((2, 2, 41, 5))
    padding = np.zeros((2, 41), dtype=bool)
    padding[0, :20] = True                              # the first chunk of row 0: all padding
    masks = dict(key_padding_mask=padding, is_causal=True, causal_offset=40)
    plain, _ = attention_forward(q, k, v, **masks)
    decoding = flash_decoding(q, k, v, **masks, chunk_size=16)
    assert decoding.chunk_out.shape == (3, 2, 4, 1, 5)
    assert_equal_within(decoding.out, plain)
    assert np.all(np.isneginf(decoding.chunk_max[0, 0])) and np.all(decoding.chunk_sum[0, 0] == 0)
    # each chunk's O_c is attention over that chunk's keys alone
    second, _ = attention_forward(q, k[:, :, 16:32], v[:, :, 16:32],
                                  key_padding_mask=padding[:, 16:32])
    assert_equal_within(decoding.chunk_out[1], second)
    # a wrong combine (averaging the chunks' outputs) is far from the answer
    assert np.abs(decoding.chunk_out.mean(axis=0) - plain).max() > 1e-2


@pytest.mark.parametrize("block", [1, 2, 5])
def test_gradcheck_with_padding_causal_offset_and_grouped_heads(block):
    rng = np.random.default_rng(3 + block)
    q = rng.standard_normal((2, 4, 3, 2))
    k, v = rng.standard_normal((2, 2, 5, 2)), rng.standard_normal((2, 2, 5, 3))
    padding = np.array([[False, False, True, False, False], [False, False, False, False, True]])
    report = gradcheck(flash_attention_forward, flash_attention_backward,
                       {"q": q, "k": k, "v": v, "attn_mask": rng.standard_normal((3, 5)),
                        "key_padding_mask": padding, "is_causal": True, "causal_offset": 2,
                        "block_q": block, "block_k": block}, wrt=["q", "k", "v"], seed=block)
    assert report.passed, str(report)


def test_float32_stays_float32_and_backward_changes_nothing():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((5, 5)).astype(np.float32)
    out, cache = flash_attention_forward(q, k, v, attn_mask=bias, is_causal=True, block_q=2,
                                         block_k=2)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    copies = [a.copy() for a in (dout, q, k, v, cache.out, cache.logsumexp)]
    grads = flash_attention_backward(dout, cache)
    assert out.dtype == cache.logsumexp.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads)
    for before, after in zip(copies, (dout, q, k, v, cache.out, cache.logsumexp)):
        np.testing.assert_array_equal(before, after)
    plain, _ = attention_forward(q, k, v, attn_mask=bias, is_causal=True)
    np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-6)
    decoding = flash_decoding(q, k, v, attn_mask=bias, chunk_size=2)
    assert decoding.out.dtype == decoding.chunk_max.dtype == np.float32


def test_bad_input():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="block_q must be a positive integer .* got 0"):
        flash_attention_forward(q, q, q, block_q=0)
    with pytest.raises(ValueError, match="block_k must be a positive integer .* got 2.5"):
        flash_attention_forward(q, q, q, block_k=2.5)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        flash_decoding(q, q, q, chunk_size=True)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\)"):
        flash_attention_forward(q, q, q, key_padding_mask=np.zeros((1, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"the key/value heads \(2\) must divide"):
        flash_attention_forward(np.zeros((1, 3, 3, 4)), q, q)
    with pytest.raises(ValueError, match="causal_offset must be >= 0"):
        flash_decoding(q, q, q, is_causal=True, causal_offset=-1)


# -- the case file with per-tile statistics ---------------------------------------------------
def test_the_flash_case_holds_the_tile_statistics_and_compares_tile_by_tile(tmp_path):
    from numpy_tf.checking.case_file import Case
    from numpy_tf.checking.compare import compare_files
    from numpy_tf.checking.flash_case import export_flash_attention_case

    case = export_flash_attention_case(seed=3, block_q=2, block_k=3)
    path = tmp_path / "flash.npz"
    case.save(path)
    loaded = Case.load(path)
    a = loaded.arrays
    assert a["act/tiles.row_max"].shape == (2, 4, 5, 3)          # Tk = 7 in tiles of 3
    last = a["act/tiles.row_max"][..., -1] + np.log(a["act/tiles.row_sum"][..., -1])
    np.testing.assert_allclose(last, a["act/logsumexp"], rtol=1e-14)
    plain, cache = attention_forward(a["input/q"], a["input/k"], a["input/v"],
                                     key_padding_mask=a["input/key_padding_mask"],
                                     is_causal=True, causal_offset=2)
    assert_equal_within(a["output/out"], plain)
    expected = attention_backward(a["grad_output/out"], cache)
    for name, want in zip("qkv", expected):
        assert_equal_within(a[f"grad_input/{name}"], want, max(np.abs(g).max() for g in expected))
    assert compare_files(path, path).passed
    # a kernel that forgets to rescale l when m grows shows at the statistic, before the output
    theirs = dict(a)
    m, l_ = a["act/tiles.row_max"], a["act/tiles.row_sum"]
    assert np.isfinite(m).all()                           # every row sees key 0
    wrong = l_.copy()                                     # l_t = l_(t-1) + rowsum exp(S_t - m_t)
    for t in range(1, m.shape[-1]):
        wrong[..., t] = wrong[..., t - 1] + l_[..., t] - l_[..., t - 1] * np.exp(
            m[..., t - 1] - m[..., t])
    assert np.abs(wrong - l_).max() > 1e-3
    theirs["act/tiles.row_sum"] = wrong
    Case(loaded.meta, theirs).save(tmp_path / "theirs.npz")
    result = compare_files(path, tmp_path / "theirs.npz")
    assert result.first_divergence.comparison.key == "act/tiles.row_sum"


def test_infinite_statistics_compare_equal_and_only_equal(tmp_path):
    """Leading padding leaves m = -inf after the first tile: compare treats equal infinities
    as agreeing (their difference is NaN) and a finite stand-in for -inf as a divergence."""
    from numpy_tf.checking.compare import compare_files
    from numpy_tf.checking.flash_case import export_flash_attention_case

    case = export_flash_attention_case(seed=1, block_k=2, pad=0)
    padding = np.zeros((2, 7), dtype=bool)
    padding[:, :2] = True
    statistics = flash_attention_statistics(case.arrays["input/q"], case.arrays["input/k"],
                                            key_padding_mask=padding, is_causal=True,
                                            causal_offset=2, block_k=2)
    case.arrays["act/tiles.row_max"] = statistics.row_max
    assert np.isneginf(statistics.row_max[..., 0]).all()
    case.save(tmp_path / "ours.npz")
    assert compare_files(tmp_path / "ours.npz", tmp_path / "ours.npz").passed
    case.arrays["act/tiles.row_max"] = np.where(np.isneginf(statistics.row_max), -1e30,
                                                statistics.row_max)
    case.save(tmp_path / "theirs.npz")
    result = compare_files(tmp_path / "ours.npz", tmp_path / "theirs.npz")
    assert result.first_divergence.comparison.key == "act/tiles.row_max"
    assert [row.comparison.key for row in result.rows if not row.comparison.passed] == \
        ["act/tiles.row_max"]


@pytest.mark.parametrize("scale", [0.37, 2.5])
def test_gradcheck_an_explicit_scale(scale):
    """The tiled backward recomputes the scores with cache.scale: a scale that is not
    1/sqrt(d), grouped-query heads, a causal offset, tiles smaller than the sequence."""
    rng = np.random.default_rng(41)
    q = rng.standard_normal((2, 4, 3, 4))
    k, v = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 3))
    report = gradcheck(flash_attention_forward, flash_attention_backward,
                       {"q": q, "k": k, "v": v, "is_causal": True, "causal_offset": 2,
                        "scale": scale, "block_q": 2, "block_k": 2}, wrt=["q", "k", "v"],
                       seed=42)
    assert report.passed, str(report)
