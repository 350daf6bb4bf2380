"""Sequence-first tensors (batch_first=False, torch's default: (S, B, C)) in the torch-layout
modules: TorchMultiheadAttention, TransformerEncoderLayer / DecoderLayer, the stacks and the
Transformer, and interop.from_torch. Checked against torch in both layouts, forward and every
gradient; the two layouts of numpy_tf against each other (bit for bit, but the stacks' final
norms' parameter gradients, to rounding) and by finite differences."""
import numpy as np
import pytest
from contract import spread_parameters as _spread

from numpy_tf import gradcheck_module, interop
from numpy_tf.layers.multihead import TorchMultiheadAttention
from numpy_tf.models.encoder_decoder.transformer import (Transformer, TransformerDecoder,
                                                         TransformerDecoderLayer,
                                                         TransformerEncoder,
                                                         TransformerEncoderLayer)

B, S, T, C, H = 2, 5, 3, 8, 2
LAYER = dict(d_model=C, nhead=H, dim_feedforward=12, dropout=0.0)


def _x(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _padding(lengths, length):
    return np.arange(length) >= np.array(lengths)[:, None]          # (B, L) True at padding


def _layout(x, batch_first):
    """A (B, L, C) array in the module's layout."""
    return x if batch_first else np.ascontiguousarray(x.swapaxes(0, 1))


# (name, numpy_tf factory(batch_first), its inputs in (B, L, C), forward kwargs)
MODULES = {
    "encoder_layer": (lambda bf, norm_first: TransformerEncoderLayer(
        **LAYER, batch_first=bf, norm_first=norm_first), ("src",),
        lambda: {"src_key_padding_mask": _padding([S, 3], S)}),
    "decoder_layer": (lambda bf, norm_first: TransformerDecoderLayer(
        **LAYER, batch_first=bf, norm_first=norm_first), ("tgt", "memory"),
        lambda: {"tgt_mask": np.triu(np.ones((T, T), dtype=bool), 1),
                 "memory_key_padding_mask": _padding([S, 3], S)}),
    "encoder": (lambda bf, norm_first: TransformerEncoder(
        TransformerEncoderLayer(**LAYER, batch_first=bf, norm_first=norm_first), 2,
        _norm()), ("src",), lambda: {"src_key_padding_mask": _padding([S, 4], S)}),
    "decoder": (lambda bf, norm_first: TransformerDecoder(
        TransformerDecoderLayer(**LAYER, batch_first=bf, norm_first=norm_first), 2, _norm()),
        ("tgt", "memory"), lambda: {"tgt_is_causal": True,
                                    "memory_key_padding_mask": _padding([S, 2], S)}),
    "transformer": (lambda bf, norm_first: Transformer(
        **LAYER, num_encoder_layers=2, num_decoder_layers=1, batch_first=bf,
        norm_first=norm_first), ("src", "tgt"),
        lambda: {"src_key_padding_mask": _padding([S, 3], S), "tgt_is_causal": True,
                 "memory_key_padding_mask": _padding([S, 3], S)}),
}
SHAPES = {"src": S, "memory": S, "tgt": T}


def _norm():
    from numpy_tf.layers.norm import LayerNorm
    return LayerNorm(C)


def _inputs(names, batch_first, seed=0):
    return [_layout(_x(seed + i, B, SHAPES[name], C), batch_first)
            for i, name in enumerate(names)]


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("norm_first", [False, True])
def test_sequence_first_is_batch_first_with_the_axes_swapped_bit_for_bit(name, norm_first):
    make, names, kwargs = MODULES[name]
    first, sequence_first = make(True, norm_first), make(False, norm_first)
    _spread(first, 1)
    sequence_first.load_state_dict(first.state_dict())              # the same weights
    out, cache = first.forward(*_inputs(names, True), **kwargs())
    out_sf, cache_sf = sequence_first.forward(*_inputs(names, False), **kwargs())
    assert out_sf.shape == (out.shape[1], out.shape[0], C)
    assert out_sf.swapaxes(0, 1).tobytes() == np.ascontiguousarray(out).tobytes()
    dout = _x(9, *out.shape)
    grads = first.backward(dout, cache)
    grads_sf = sequence_first.backward(_layout(dout, False), cache_sf)
    grads, grads_sf = (g if isinstance(g, tuple) else (g,) for g in (grads, grads_sf))
    for g, g_sf in zip(grads, grads_sf):
        assert g_sf.shape == (g.shape[1], g.shape[0], C)
        np.testing.assert_array_equal(g_sf.swapaxes(0, 1), g)
    for (key, a), b in zip(first.grad_dict().items(), sequence_first.grad_dict().values()):
        if key.startswith("norm.") or ".norm." in key:
            # a stack's final norm runs on the layers' output in the caller's layout, so its
            # sums over the positions go in the other memory order: equal to rounding
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-15 * np.abs(a).max(), err_msg=key)
        else:
            np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.parametrize("name", ["encoder_layer", "decoder_layer"])
def test_sequence_first_layers_pass_a_gradient_check(name):
    make, names, kwargs = MODULES[name]
    layer = _spread(make(False, True), 2)
    report = gradcheck_module(layer, *_inputs(names, False, seed=3), forward_kwargs=kwargs())
    assert report.passed, str(report)


def test_attention_sequence_first_and_bad_layouts():
    attention = _spread(TorchMultiheadAttention(C, H, batch_first=False), 4)
    query, key = _x(5, T, B, C), _x(6, S, B, C)                     # (T, B, C), (S, B, C)
    out, cache = attention.forward(query, key, key, key_padding_mask=_padding([S, 2], S))
    assert out.shape == (T, B, C)
    dquery, dkey, dvalue = attention.backward(_x(7, T, B, C), cache)
    assert dquery.shape == (T, B, C) and dkey.shape == dvalue.shape == (S, B, C)
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \(T, B, E\), "
                                         r"batch_first=False; got shape \(2, 8\)"):
        attention.forward(query[0], key, key)
    with pytest.raises(ValueError, match=r"src must have 3 dimensions \(S, B, C\), "
                                         r"batch_first=False"):
        TransformerEncoderLayer(**LAYER, batch_first=False).forward(query[0])
    transformer = Transformer(**LAYER, num_encoder_layers=1, num_decoder_layers=1,
                              batch_first=False)
    with pytest.raises(ValueError, match="src and tgt must have the same batch size; got 2 "
                                         "and 3"):
        transformer.forward(_x(8, S, 2, C), _x(8, T, 3, C))
    with pytest.raises(ValueError, match=r"src_key_padding_mask must have shape \(B, S\) = "
                                         r"\(2, 5\); got \(5, 2\)"):
        transformer.forward(_x(8, S, B, C), _x(8, T, B, C),
                            src_key_padding_mask=np.zeros((S, B), dtype=bool))
    with pytest.raises(TypeError, match="batch_first must be True or False; got None"):
        TorchMultiheadAttention(C, H, batch_first=None)


# -- against torch, both layouts -------------------------------------------------------------
def _torch_module(torch, name, batch_first, norm_first):
    nn = torch.nn
    options = dict(**LAYER, batch_first=batch_first, norm_first=norm_first, dtype=torch.float64)
    if name == "encoder_layer":
        return nn.TransformerEncoderLayer(**options)
    if name == "decoder_layer":
        return nn.TransformerDecoderLayer(**options)
    if name == "encoder":
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(**options), 2,
                                     nn.LayerNorm(C, dtype=torch.float64),
                                     enable_nested_tensor=False)
    if name == "decoder":
        return nn.TransformerDecoder(nn.TransformerDecoderLayer(**options), 2,
                                     nn.LayerNorm(C, dtype=torch.float64))
    return nn.Transformer(**options, num_encoder_layers=2, num_decoder_layers=1)


def _torch_kwargs(torch, kwargs, length):
    out = {}
    for key, value in kwargs.items():
        if key in ("tgt_is_causal", "is_causal"):       # torch wants the mask with the flag
            out["tgt_mask"] = torch.from_numpy(np.triu(np.ones((length, length), dtype=bool),
                                                       1))
            out[key] = True
        else:
            out[key] = torch.from_numpy(value)
    return out


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_agrees_with_torch_in_both_layouts(name, batch_first, norm_first):
    torch = pytest.importorskip("torch")
    make, names, kwargs = MODULES[name]
    torch.manual_seed(0)
    reference = _torch_module(torch, name, batch_first, norm_first)
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    if name == "transformer":
        kw = dict(**LAYER, num_encoder_layers=2, num_decoder_layers=1, batch_first=batch_first,
                  norm_first=norm_first)
        module = interop.from_torch("transformer", kw, state)
    else:
        module = make(batch_first, norm_first)
        module.load_state_dict(state)
    inputs = _inputs(names, batch_first, seed=10)
    out, cache = module.forward(*inputs, **kwargs())
    dout = _x(20, *out.shape)
    grads = module.backward(dout, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)

    tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
    expected = reference(*tensors, **_torch_kwargs(torch, kwargs(), T))
    expected.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    for ours, tensor in zip(grads, tensors):
        np.testing.assert_allclose(ours, tensor.grad.numpy(), rtol=1e-9, atol=1e-12)
    ours = module.grad_dict()
    for key, parameter in reference.named_parameters():
        np.testing.assert_allclose(ours[key], parameter.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=key)


@pytest.mark.torch
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_agrees_with_torch_in_both_layouts(batch_first):
    torch = pytest.importorskip("torch")
    kwargs = dict(embed_dim=C, num_heads=H, batch_first=batch_first)
    torch.manual_seed(1)
    reference = torch.nn.MultiheadAttention(**kwargs).double()
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    module = interop.from_torch("multihead_attention", kwargs, state)
    assert module.batch_first is batch_first
    query = _layout(_x(30, B, T, C), batch_first)
    key, value = (_layout(_x(seed, B, S, C), batch_first) for seed in (31, 32))
    padding = _padding([S, 3], S)
    mask = _x(33, T, S) > 0.8                       # bool, as the padding (torch wants both so)
    mask[:, 0] = False                              # every query keeps a key
    out, cache = module.forward(query, key, value, key_padding_mask=padding, attn_mask=mask)
    dout = _x(34, *out.shape)
    grads = module.backward(dout, cache)
    tensors = [torch.tensor(x, requires_grad=True) for x in (query, key, value)]
    expected, _ = reference(*tensors, key_padding_mask=torch.from_numpy(padding),
                            attn_mask=torch.from_numpy(mask), need_weights=False)
    expected.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    for ours, tensor in zip(grads, tensors):
        np.testing.assert_allclose(ours, tensor.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_from_torch_weights_are_the_same_in_either_layout():
    """torch's default is batch_first=False: kwargs without it build a sequence-first module;
    the state_dict is the same, so to_torch does not ask which layout the kwargs name."""
    torch = pytest.importorskip("torch")
    kwargs = dict(**LAYER, num_encoder_layers=1, num_decoder_layers=1)
    reference = torch.nn.Transformer(**kwargs, batch_first=True).double()
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    default = interop.from_torch("transformer", kwargs, state)      # torch's default layout
    assert default.batch_first is False and default.encoder.layers[0].batch_first is False
    exported = interop.to_torch(default, "transformer", {**kwargs, "batch_first": True})
    assert all(exported[k].tobytes() == state[k].tobytes() for k in state)
    src, tgt = _x(40, S, B, C), _x(41, T, B, C)
    out, _ = default.forward(src, tgt)
    expected = reference(torch.from_numpy(src.swapaxes(0, 1).copy()),
                         torch.from_numpy(tgt.swapaxes(0, 1).copy()))
    np.testing.assert_allclose(out.swapaxes(0, 1), expected.detach().numpy(), rtol=1e-10,
                               atol=1e-12)
