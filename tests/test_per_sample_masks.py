"""Per-sample 3-D attention masks (B, Tq, Tk), the same for every head, bool (True = blocked) or
float (added): the same meaning as the 2-D and 4-D masks, checked against attention computed
sample by sample, by finite differences and against torch's SDPA with the mask given one head
axis. torch.nn.MultiheadAttention's 3-D mask is (B * num_heads, Tq, Tk); TorchMultiheadAttention
keeps that meaning."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck, interop
from numpy_tf.layers.attention import attention_backward, attention_forward
from numpy_tf.layers.multihead import MultiHeadAttention, TorchMultiheadAttention


def _qkv(rng, batch, heads, groups, tq, tk, d=3):
    return (rng.standard_normal((batch, heads, tq, d)), rng.standard_normal((batch, groups, tk, d)),
            rng.standard_normal((batch, groups, tk, d)))


def _masks(rng, batch, tq, tk):
    """A bool mask that differs per sample (every row keeps at least one key, but the last
    sample's first row keeps none: a fully masked row), and a float mask."""
    blocked = rng.random((batch, tq, tk)) < 0.4
    blocked[:, :, 0] = False
    blocked[-1, 0, :] = True
    return blocked, rng.standard_normal((batch, tq, tk))


@given(batch=st.integers(1, 3), groups=st.integers(1, 2), ratio=st.integers(1, 2),
       tq=st.integers(1, 4), tk=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_a_3d_mask_is_one_mask_per_sample_for_every_head(batch, groups, ratio, tq, tk, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, batch, groups * ratio, groups, tq, tk)
    blocked, bias = _masks(rng, batch, tq, tk)
    for mask in (blocked, bias):
        out, cache = attention_forward(q, k, v, attn_mask=mask)
        for b in range(batch):                          # sample by sample, the 2-D mask
            one, one_cache = attention_forward(q[b:b + 1], k[b:b + 1], v[b:b + 1],
                                               attn_mask=mask[b])
            np.testing.assert_array_equal(out[b:b + 1], one)
            np.testing.assert_array_equal(cache.probs[b:b + 1], one_cache.probs)
        four_d, _ = attention_forward(q, k, v, attn_mask=mask[:, None])   # (B, 1, Tq, Tk)
        np.testing.assert_array_equal(out, four_d)
    _, cache = attention_forward(q, k, v, attn_mask=blocked)
    assert not cache.probs[-1, :, 0].any()              # the fully masked row: zeros, no NaN


def test_gradcheck_with_3d_masks_and_with_a_3d_mask_of_ones_along_the_batch():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 2, 4, 2, 3, 5)
    blocked, bias = _masks(rng, 2, 3, 5)
    for mask in (blocked, bias, bias[:1]):              # (1, Tq, Tk): the same for the batch
        def forward(q, k, v, mask=mask):
            return attention_forward(q, k, v, attn_mask=mask, key_padding_mask=None)
        report = gradcheck(forward, attention_backward, {"q": q, "k": k, "v": v}, seed=2)
        assert report.passed, str(report)


def test_the_llama_layout_takes_3d_masks():
    layer = MultiHeadAttention(8, 4, 2, rng=0)
    x = np.random.default_rng(3).standard_normal((2, 4, 8))
    blocked, _ = _masks(np.random.default_rng(4), 2, 4, 4)
    out, _ = layer.forward(x, attn_mask=blocked)
    for b in range(2):
        one, _ = layer.forward(x[b:b + 1], attn_mask=blocked[b])
        np.testing.assert_allclose(out[b:b + 1], one, rtol=1e-13, atol=1e-15)


def test_bad_3d_masks_are_named():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 3, 3, 4, 5)
    with pytest.raises(ValueError, match=r"attn_mask must broadcast to \(B, H, Tq, Tk\) = "
                                         r"\(2, 3, 4, 5\) from \(Tq, Tk\), \(B, Tq, Tk\) \(one "
                                         r"mask per sample, for every head\) .*; got \(3, 4, 5\)"):
        attention_forward(q, k, v, attn_mask=np.zeros((3, 4, 5), dtype=bool))   # (H, Tq, Tk)
    with pytest.raises(ValueError, match=r"got \(2, 5, 4\)"):
        attention_forward(q, k, v, attn_mask=np.zeros((2, 5, 4)))
    with pytest.raises(TypeError, match="attn_mask must be bool .* float32"):
        attention_forward(*(a.astype(np.float32) for a in (q, k, v)),
                          attn_mask=np.zeros((2, 4, 5)))


def test_torch_layout_keeps_torchs_batch_times_heads_meaning():
    layer = TorchMultiheadAttention(8, 2, rng=0)
    x = np.random.default_rng(6).standard_normal((3, 4, 8))
    blocked, _ = _masks(np.random.default_rng(7), 3, 4, 4)
    with pytest.raises(ValueError, match=r"a 3-D attn_mask must have shape \(B \* num_heads, "
                                         r"Tq, Tk\) = \(6, ...\); got \(3, 4, 4\)"):
        layer.forward(x, x, x, attn_mask=blocked)
    per_head, _ = layer.forward(x, x, x, attn_mask=np.repeat(blocked, 2, axis=0))  # (B * H, ...)
    for b in range(3):
        one, _ = layer.forward(x[b:b + 1], x[b:b + 1], x[b:b + 1], attn_mask=blocked[b])
        np.testing.assert_allclose(per_head[b:b + 1], one, rtol=1e-13, atol=1e-15)


# -- against torch ------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("groups", [4, 2])
def test_agrees_with_torch_sdpa_given_the_head_axis(kind, groups):
    """torch's SDPA broadcasts a mask as NumPy does (a 3-D mask's first axis would be the
    heads) and reads bool as True = may attend: numpy_tf's (B, Tq, Tk) blocked mask is SDPA's
    ~mask[:, None]. Forward and every gradient, float64."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 3, 4, groups, 5, 6, d=4)
    blocked, bias = _masks(rng, 3, 5, 6)
    blocked[-1, 0, 0] = False       # torch's SDPA gives NaN for a row with nothing to attend to
    mask = blocked if kind == "bool" else bias
    out, cache = attention_forward(q, k, v, attn_mask=mask)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = attention_backward(dout, cache)

    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    theirs_mask = torch.from_numpy(~blocked[:, None] if kind == "bool" else bias[:, None])
    expected = functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=theirs_mask,
                                                       enable_gqa=groups != 4)
    expected.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-12, atol=1e-13)
    for ours, tensor in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(ours, tensor.grad.numpy(), rtol=1e-11, atol=1e-13)


@pytest.mark.torch
def test_agrees_with_torch_multihead_attention_of_one_head_and_of_repeated_masks():
    """nn.MultiheadAttention takes (B * num_heads, Tq, Tk): with one head that IS (B, Tq, Tk);
    with H heads the per-sample mask is repeated H times along the first axis."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 8))
    blocked, _ = _masks(rng, 3, 4, 4)
    blocked[-1, 0, 0] = False                           # torch gives NaN for an empty row
    for heads in (1, 2):
        kwargs = dict(embed_dim=8, num_heads=heads, batch_first=True)
        torch.manual_seed(heads)
        mha = torch.nn.MultiheadAttention(**kwargs).double()
        state = {name: value.detach().numpy() for name, value in mha.state_dict().items()}
        ours_layer = interop.from_torch("multihead_attention", kwargs, state)
        repeated = np.repeat(blocked, heads, axis=0)    # (B * H, Tq, Tk), torch's order
        x_t = torch.tensor(x, requires_grad=True)
        expected, _ = mha(x_t, x_t, x_t, attn_mask=torch.from_numpy(repeated),
                          need_weights=False)
        ours, cache = ours_layer.forward(x, x, x, attn_mask=repeated)
        np.testing.assert_allclose(ours, expected.detach().numpy(), rtol=1e-12, atol=1e-13)
        # the Llama-layout module reads the per-sample mask itself: the same attention
        llama_layout = MultiHeadAttention(8, heads, bias=True)
        e = 8
        weight, bias = state["in_proj_weight"], state["in_proj_bias"]
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
            getattr(llama_layout, name).weight.data[...] = weight[index * e:(index + 1) * e]
            getattr(llama_layout, name).bias.data[...] = bias[index * e:(index + 1) * e]
        llama_layout.o_proj.weight.data[...] = state["out_proj.weight"]
        llama_layout.o_proj.bias.data[...] = state["out_proj.bias"]
        per_sample, _ = llama_layout.forward(x, attn_mask=blocked)
        np.testing.assert_allclose(per_sample, expected.detach().numpy(), rtol=1e-12,
                                   atol=1e-13)
        dout = rng.standard_normal(ours.shape)
        expected.backward(torch.from_numpy(dout))
        dquery, dkey, dvalue = ours_layer.backward(dout, cache)
        np.testing.assert_allclose(dquery + dkey + dvalue, x_t.grad.numpy(), rtol=1e-11,
                                   atol=1e-13)
