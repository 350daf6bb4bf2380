"""Multi-head attention in its three layouts: torch agreement, gradients, causality, GQA,
cross-attention, the KV cache, and the layouts' agreement with one another."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck_module
from numpy_tf.layers.multihead import FusedAttention, MultiHeadAttention, TorchMultiheadAttention


def _x(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("name", ["mha_self", "mha_cross", "mha_float_mask", "mha_3d_mask",
                                  "gqa_kv2", "gqa_mqa", "gqa_mha"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


@given(heads_per_group=st.integers(1, 3), groups=st.integers(1, 2), head_dim=st.integers(1, 3),
       length=st.integers(1, 4), bias=st.booleans(), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gradcheck_grouped_query_self_attention(heads_per_group, groups, head_dim, length, bias,
                                                causal, seed):
    heads = heads_per_group * groups
    width = 5
    layer = MultiHeadAttention(width, heads, groups, head_dim, bias=bias, rng=seed)
    padding = np.zeros((2, length), dtype=bool)
    padding[1, length - 1:] = length > 1
    report = gradcheck_module(layer, _x(seed, 2, length, width), seed=seed,
                              forward_kwargs={"is_causal": causal,
                                              "key_padding_mask": padding})
    assert report.passed, str(report)


@given(tq=st.integers(1, 3), tk=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_gradcheck_cross_attention_returns_both_gradients(tq, tk, seed):
    layer = MultiHeadAttention(6, 3, 1, bias=True, rng=seed)
    memory_padding = np.zeros((2, tk), dtype=bool)
    memory_padding[0, -1] = tk > 1
    report = gradcheck_module(layer, _x(seed, 2, tq, 6), _x(seed + 1, 2, tk, 6), seed=seed,
                              forward_kwargs={"key_padding_mask": memory_padding})
    assert report.passed and {"input0", "input1"} <= {r.name for r in report.rows}, str(report)


def test_gradcheck_fused_and_torch_layouts():
    fused = FusedAttention(8, 2, bias=True, rng=1)
    assert gradcheck_module(fused, _x(1, 2, 4, 8), forward_kwargs={"is_causal": True}).passed
    # with RoPE the head gradients are rotated back first, then copied into dqkv
    rotary = FusedAttention(8, 2, bias=True, rope=True, rng=4)
    assert gradcheck_module(rotary, _x(8, 2, 4, 8), forward_kwargs={"is_causal": True}).passed
    torch_layout = TorchMultiheadAttention(6, 2, rng=2)
    torch_layout.in_proj_bias.data[:] = _x(3, 18)
    report = gradcheck_module(torch_layout, _x(4, 2, 3, 6), _x(5, 2, 5, 6), _x(6, 2, 5, 6),
                              forward_kwargs={"attn_mask": _x(7, 3, 5)})
    assert report.passed, str(report)


@given(length=st.integers(2, 6), changed=st.data(), seed=st.integers(0, 2**16))
def test_causality_a_later_token_never_changes_an_earlier_output(length, changed, seed):
    layer = FusedAttention(8, 2, bias=True, rng=seed)
    x = _x(seed, 1, length, 8)
    position = changed.draw(st.integers(1, length - 1))
    y = x.copy()
    y[0, position:] = _x(seed + 1, length - position, 8)
    a, _ = layer.forward(x, is_causal=True)
    b, _ = layer.forward(y, is_causal=True)
    np.testing.assert_array_equal(a[0, :position], b[0, :position])


def _split_fused(fused: FusedAttention) -> MultiHeadAttention:
    """The same weights in the separate q/k/v/o layout."""
    separate = MultiHeadAttention(fused.width, fused.num_heads, bias=True)
    q, k, v = np.split(fused.qkv.weight.data, 3)
    qb, kb, vb = np.split(fused.qkv.bias.data, 3)
    separate.load_state_dict({"q_proj.weight": q, "q_proj.bias": qb, "k_proj.weight": k,
                              "k_proj.bias": kb, "v_proj.weight": v, "v_proj.bias": vb,
                              "o_proj.weight": fused.output.weight.data,
                              "o_proj.bias": fused.output.bias.data})
    return separate


def test_the_three_layouts_agree():
    fused = FusedAttention(8, 4, bias=True, rng=3)
    separate = _split_fused(fused)
    torch_layout = TorchMultiheadAttention(8, 4)
    torch_layout.load_state_dict({"in_proj_weight": fused.qkv.weight.data,
                                  "in_proj_bias": fused.qkv.bias.data,
                                  "out_proj.weight": fused.output.weight.data,
                                  "out_proj.bias": fused.output.bias.data})
    x = _x(4, 2, 5, 8)
    a, ca = fused.forward(x, is_causal=True)
    b, cb = separate.forward(x, is_causal=True)
    c, cc = torch_layout.forward(x, x, x, is_causal=True)
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(a, c, rtol=1e-13, atol=1e-14)
    dout = _x(5, 2, 5, 8)
    dx_fused = fused.backward(dout, ca)
    dx_separate = separate.backward(dout, cb)
    dq, dk, dv = torch_layout.backward(dout, cc)
    np.testing.assert_allclose(dx_fused, dx_separate, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dx_fused, dq + dk + dv, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(fused.qkv.weight.grad, torch_layout.in_proj_weight.grad,
                               rtol=1e-12, atol=1e-13)


def test_every_key_padded_in_one_row_gives_only_the_output_bias():
    layer = MultiHeadAttention(6, 2, bias=True, rng=5)
    padding = np.array([[False, False, False], [True, True, True]])
    out, cache = layer.forward(_x(6, 2, 3, 6), key_padding_mask=padding)
    np.testing.assert_array_equal(cache.attention.probs[1], 0.0)
    np.testing.assert_allclose(out[1], np.broadcast_to(layer.o_proj.bias.data, (3, 6)),
                               rtol=1e-15)
    dx = layer.backward(_x(7, 2, 3, 6), cache)
    assert np.all(np.isfinite(dx)) and not dx[1].any()


def test_single_position_and_multi_query():
    layer = MultiHeadAttention(8, 4, num_kv_heads=1, rng=8)
    assert layer.k_proj.weight.shape == (2, 8)
    out, cache = layer.forward(_x(9, 3, 1, 8), is_causal=True)
    assert out.shape == (3, 1, 8)
    np.testing.assert_array_equal(cache.attention.probs, 1.0)


def test_kv_cache_step_by_step_equals_the_full_causal_forward():
    layer = MultiHeadAttention(8, 4, num_kv_heads=2, bias=True, rng=10)
    x = _x(11, 2, 6, 8)
    full, _ = layer.forward(x, is_causal=True)
    past = None
    steps = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 6)]:      # a prompt, then one at a time
        out, cache = layer.forward(x[:, start:stop], is_causal=True, past_kv=past)
        past = cache.present
        steps.append(out)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-13, atol=1e-14)
    assert past[0].shape == (2, 2, 6, 2)


def test_static_kv_equals_projecting_the_memory():
    layer = MultiHeadAttention(6, 2, bias=True, rng=12)
    query, memory = _x(13, 2, 3, 6), _x(14, 2, 5, 6)
    a, _ = layer.forward(query, memory)
    b, cache = layer.forward(query, static_kv=layer.project_kv(memory))
    np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
    assert cache.present[0].shape == (2, 2, 5, 3)


def test_contract():
    x = _x(15, 2, 3, 8)
    check_contract(lambda dtype: MultiHeadAttention(8, 4, 2, bias=True, dtype=dtype), (x,),
                   is_causal=True)
    check_contract(lambda dtype: FusedAttention(8, 2, dtype=dtype), (x,), is_causal=True)
    check_contract(lambda dtype: TorchMultiheadAttention(8, 2, dtype=dtype), (x, x, x))
    check_contract(lambda dtype: MultiHeadAttention(8, 2, dtype=dtype), (x, _x(16, 2, 4, 8)))


def test_bad_input():
    with pytest.raises(ValueError, match=r"width \(10\) must be divisible by num_heads \(4\)"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        MultiHeadAttention(8, 4, 3)
    with pytest.raises(ValueError, match=r"embed_dim \(6\) must be divisible by num_heads"):
        TorchMultiheadAttention(6, 4)
    layer = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="key and value must have the same batch and length"):
        layer.forward(_x(0, 1, 2, 8), _x(1, 1, 3, 8), _x(2, 1, 4, 8))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\)"):
        layer.forward(_x(0, 1, 2, 8), key_padding_mask=np.zeros((1, 3), dtype=bool))
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \(B, Tq, C\)"):
        layer.forward(_x(0, 2, 8))
    with pytest.raises(TypeError, match="x has dtype float32 but weight has dtype float64"):
        layer.forward(_x(0, 1, 2, 8).astype(np.float32))
    with pytest.raises(ValueError, match=r"a 3-D attn_mask must have shape \(B \* num_heads"):
        TorchMultiheadAttention(8, 2).forward(*[_x(0, 1, 2, 8)] * 3,
                                              attn_mask=np.zeros((3, 2, 2), dtype=bool))


KV_CACHED_LAYERS = {
    "grouped-query heads with RoPE": lambda: MultiHeadAttention(8, 4, 2, bias=True, rope=True,
                                                                rng=20),
    "fused qkv": lambda: FusedAttention(8, 2, bias=True, rng=21),
    "torch layout": lambda: TorchMultiheadAttention(8, 2, rng=22),
}


@pytest.mark.parametrize("tier", ["kernels", "reference"])
@pytest.mark.parametrize("name", list(KV_CACHED_LAYERS))
def test_gradcheck_through_a_kv_cached_forward(name, tier):
    """The backward of a forward that continued a KV cache (past_kv, P = 3 positions held, 2
    new): the gradients reach only the new keys and values, the LAST 2 of the 5 the attention
    saw (a backward that takes the first 2, or shifts RoPE's positions, fails here), through
    the kernel's attention backward and the reference's."""
    from numpy_tf import reference_path
    layer = KV_CACHED_LAYERS[name]()
    torch_layout = isinstance(layer, TorchMultiheadAttention)
    prompt, new = _x(23, 2, 3, 8), _x(24, 2, 2, 8)
    past = layer.forward(*([prompt] * (3 if torch_layout else 1)), is_causal=True)[1].present
    padding = np.zeros((2, 5), dtype=bool)
    padding[1, 0] = True                                    # a padded position in the cache
    kwargs = {"is_causal": True, "past_kv": past, "key_padding_mask": padding}
    inputs = [new, _x(25, 2, 2, 8), _x(26, 2, 2, 8)] if torch_layout else [new]
    if tier == "reference":
        with reference_path():
            report = gradcheck_module(layer, *inputs, seed=27, forward_kwargs=kwargs)
    else:
        report = gradcheck_module(layer, *inputs, seed=27, forward_kwargs=kwargs)
    assert report.passed, str(report)
