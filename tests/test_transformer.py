"""The encoder-decoder Transformer (torch.nn.Transformer, batch_first=True), its two layers, the
sequence-to-sequence model and its loss, and the conversion to and from torch's names."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract, random_like
from contract import spread_parameters as _spread
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck, gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from numpy_tf.models.encoder_decoder.transformer import (Transformer, TransformerDecoder,
                                                         TransformerDecoderLayer,
                                                         TransformerEncoder,
                                                         TransformerEncoderLayer)
from numpy_tf.models.objectives import Seq2SeqLoss
from numpy_tf.text.datasets import reverse_digits

SMALL = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
             dim_feedforward=16, dropout=0.0)


def _x(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _padding(real_lengths, length, left=False):
    """(B, length) bool, True at padding: after the real tokens, or before them (left)."""
    positions, real = np.arange(length), np.array(real_lengths)[:, None]
    return positions < length - real if left else positions >= real


def _causal(length):
    return np.triu(np.ones((length, length), dtype=bool), 1)


# -- 1. agreement with torch ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["transformer_post_relu", "transformer_pre_gelu",
                                  "transformer_left_padded", "transformer_every_mask",
                                  "seq2seq", "seq2seq_scaled_pre_ln"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_parameter_names_are_torch_state_dict_keys():
    case = Case.load(fixtures_dir() / "transformer_every_mask_float64.npz")
    module = interop.torch_equivalent("transformer", case.meta["config"])
    assert list(module.state_dict()) == list(case.section("param"))
    names = list(Transformer(**{**SMALL, "num_encoder_layers": 1, "num_decoder_layers": 1})
                 .state_dict())
    assert names[:6] == ["encoder.layers.0.self_attn.in_proj_weight",
                         "encoder.layers.0.self_attn.in_proj_bias",
                         "encoder.layers.0.self_attn.out_proj.weight",
                         "encoder.layers.0.self_attn.out_proj.bias",
                         "encoder.layers.0.linear1.weight", "encoder.layers.0.linear1.bias"]
    assert names[12:16] == ["encoder.norm.weight", "encoder.norm.bias",
                            "decoder.layers.0.self_attn.in_proj_weight",
                            "decoder.layers.0.self_attn.in_proj_bias"]
    assert "decoder.layers.0.multihead_attn.out_proj.bias" in names
    assert names[-4:] == ["decoder.layers.0.norm3.weight", "decoder.layers.0.norm3.bias",
                          "decoder.norm.weight", "decoder.norm.bias"]


# -- 2. finite differences ------------------------------------------------------------------------
# ReLU has a kink at 0; with drawn weights and inputs a pre-activation lands within the step
# (1e-6) of it with probability ~1e-6 per element, so the drawn cases stay away from it.
LAYER_OPTIONS = dict(norm_first=st.booleans(), activation=st.sampled_from(["relu", "gelu"]),
                     bias=st.booleans(), seed=st.integers(0, 2**16))


@given(batch=st.integers(1, 2), length=st.integers(1, 4), causal=st.booleans(),
       **LAYER_OPTIONS)
def test_encoder_layer_full_gradient_check(batch, length, causal, norm_first, activation, bias,
                                           seed):
    layer = _spread(TransformerEncoderLayer(4, 2, 6, 0.0, activation, norm_first=norm_first,
                                            bias=bias, rng=seed), seed)
    padding = np.zeros((batch, length), dtype=bool)
    padding[-1, length - 1] = length > 1
    report = gradcheck_module(layer, _x(seed, batch, length, 4), seed=seed, forward_kwargs={
        "src_key_padding_mask": padding, "is_causal": causal})
    assert report.passed, str(report)


@given(batch=st.integers(1, 2), targets=st.integers(1, 3), sources=st.integers(1, 5),
       **LAYER_OPTIONS)
def test_decoder_layer_full_gradient_check_source_and_target_of_different_lengths(
        batch, targets, sources, norm_first, activation, bias, seed):
    layer = _spread(TransformerDecoderLayer(4, 2, 6, 0.0, activation, norm_first=norm_first,
                                            bias=bias, rng=seed), seed)
    memory_padding = np.zeros((batch, sources), dtype=bool)
    memory_padding[-1, sources - 1] = sources > 1
    report = gradcheck_module(
        layer, _x(seed, batch, targets, 4), _x(seed + 1, batch, sources, 4), seed=seed,
        forward_kwargs={"tgt_mask": _causal(targets), "memory_key_padding_mask": memory_padding,
                        "memory_mask": _x(seed + 2, targets, sources)})
    assert report.passed and {"input0", "input1"} <= {r.name for r in report.rows}, str(report)


@pytest.mark.parametrize("norm_first", [False, True])
def test_whole_transformer_fast_gradient_check(norm_first):
    model = _spread(Transformer(**SMALL, norm_first=norm_first, activation="gelu", rng=1), 2)
    report = gradcheck_module(model, _x(3, 2, 5, 8), _x(4, 2, 3, 8), fast=True, directions=5,
                              forward_kwargs={"tgt_is_causal": True,
                                              "src_key_padding_mask": _padding([5, 3], 5),
                                              "memory_key_padding_mask": _padding([5, 3], 5)})
    assert report.passed, str(report)


def test_seq2seq_loss_full_gradient_check_on_digit_reversal():
    config = Seq2SeqConfig(d_model=4, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=6, scale_embeddings=True)
    model = _spread(Seq2Seq(config, rng=5), 6)
    batch = reverse_digits(2, np.random.default_rng(7), max_length=3)
    report = gradcheck_module(Seq2SeqLoss(model), batch.source, batch.decoder_input,
                              batch.target, batch.source_padding_mask,
                              batch.target_padding_mask)
    assert report.passed, str(report)


def test_dropout_masks_are_reused_by_backward():
    layer = _spread(TransformerEncoderLayer(4, 2, 6, dropout=0.3, rng=8), 9)

    def forward(src):       # a fresh Generator each call: the same masks every time
        return layer.forward(src, rng=np.random.default_rng(10))

    report = gradcheck(forward, layer.backward, {"src": _x(11, 2, 3, 4)})
    assert report.passed, str(report)
    with pytest.raises(TypeError, match="needs rng=numpy.random.Generator"):
        layer.forward(_x(11, 2, 3, 4))
    dropped, _ = forward(_x(11, 2, 3, 4))
    evaluated, _ = layer.eval().forward(_x(11, 2, 3, 4))
    reference = TransformerEncoderLayer(4, 2, 6, dropout=0.0)
    reference.load_state_dict(layer.state_dict())
    expected, _ = reference.forward(_x(11, 2, 3, 4))
    np.testing.assert_array_equal(evaluated, expected)
    assert not np.allclose(dropped, expected)


# -- 3. masks, fully masked rows, the causal flag ---------------------------------------------------
def test_left_padded_target_rows_get_a_zero_attention_output_as_nn_transformer():
    model = _spread(Transformer(**SMALL, rng=12), 13)
    tgt_padding = _padding([4, 2], 4, left=True)                  # row 1: [pad, pad, a, b]
    out, cache = model.forward(_x(14, 2, 5, 8), _x(15, 2, 4, 8), tgt_mask=_causal(4),
                               tgt_key_padding_mask=tgt_padding)
    for layer, layer_cache in zip(model.decoder.layers, cache.decoder.layers):
        attention = layer_cache.self_attn
        np.testing.assert_array_equal(attention.attention.probs[1, :, :2], 0.0)
        assert attention.attention.probs[1, :, 2:].sum(axis=-1) == pytest.approx(1.0)
    first = model.decoder.layers[0]                     # Post-LN: u = LN1(x + out_proj.bias)
    x = _x(15, 2, 4, 8)
    expected, _ = first.norm1.forward(x[1, :2] + first.self_attn.out_proj.bias.data)
    a, _ = first.self_attn.forward(x, x, x, tgt_padding, _causal(4), False, None)
    u, _ = first.norm1.forward(x + a)                   # dropout1 is off (SMALL's dropout 0)
    np.testing.assert_allclose(u[1, :2], expected, rtol=1e-14, atol=1e-15)
    dsrc, dtgt = model.backward(random_like(np.random.default_rng(16), out), cache)
    assert np.isfinite(dsrc).all() and np.isfinite(dtgt).all() and dtgt[1, :2].any()


def test_causal_flag_alone_equals_the_causal_mask_and_masks_block():
    model = _spread(Transformer(**SMALL, rng=17), 18)
    src, tgt = _x(19, 2, 5, 8), _x(20, 2, 4, 8)
    with_mask, _ = model.forward(src, tgt, tgt_mask=_causal(4))
    with_flag, _ = model.forward(src, tgt, tgt_is_causal=True)
    float_mask = np.where(_causal(4), -np.inf, 0.0)
    with_float, _ = model.forward(src, tgt, tgt_mask=float_mask, tgt_is_causal=True)
    np.testing.assert_array_equal(with_mask, with_flag)
    np.testing.assert_array_equal(with_mask, with_float)
    changed = tgt.copy()
    changed[:, 2:] += 1.0                                       # a later target changes nothing
    later, _ = model.forward(src, changed, tgt_is_causal=True)
    np.testing.assert_array_equal(later[:, :2], with_flag[:, :2])
    padded_src = src.copy()
    padded_src[1, 3:] = 100.0                                   # padded source changes nothing
    padding = _padding([5, 3], 5)
    a, _ = model.forward(src, tgt, src_key_padding_mask=padding, memory_key_padding_mask=padding)
    b, _ = model.forward(padded_src, tgt, src_key_padding_mask=padding,
                         memory_key_padding_mask=padding)
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


# -- 4. cached decoding ---------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_step_by_step_cached_decoding_equals_the_full_forward(norm_first):
    model = _spread(Transformer(**SMALL, norm_first=norm_first, rng=21), 22)
    memory, _ = model.encoder.forward(_x(23, 2, 5, 8))
    tgt = _x(24, 2, 6, 8)
    memory_padding = _padding([5, 2], 5)
    full, _ = model.decoder.forward(tgt, memory, tgt_is_causal=True,
                                    memory_key_padding_mask=memory_padding)
    out, cache = model.decoder.forward(tgt[:, :2], memory, tgt_is_causal=True,
                                       memory_key_padding_mask=memory_padding)
    steps, past, static = [out], cache.present, cache.cross_kv
    for t in range(2, 6):
        out, cache = model.decoder.forward(tgt[:, t:t + 1], None, tgt_is_causal=True,
                                           memory_key_padding_mask=memory_padding,
                                           past_kv=past, static_kv=static)
        steps.append(out)
        past = cache.present
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)
    assert past[0][0].shape == (2, 2, 6, 4) and len(past) == 2
    dtgt, dmemory = model.decoder.backward(_x(25, 2, 1, 8), cache)
    assert dtgt.shape == (2, 1, 8) and dmemory is None


def test_seq2seq_decode_with_caches_equals_forward():
    model = _spread(Seq2Seq(Seq2SeqConfig(d_model=8, nhead=2, scale_embeddings=True), rng=26), 27)
    batch = reverse_digits(2, np.random.default_rng(28), max_length=4)
    logits, _ = model.forward(batch.source, batch.decoder_input, batch.source_padding_mask)
    memory, _ = model.encode(batch.source, batch.source_padding_mask)
    steps, past, static = [], None, None
    for t in range(batch.decoder_input.shape[1]):
        step, cache = model.decode(batch.decoder_input[:, t:t + 1],
                                   memory if static is None else None,
                                   batch.source_padding_mask, past_kv=past, static_kv=static)
        steps.append(step)
        past, static = cache.present, cache.cross_kv
    np.testing.assert_allclose(np.concatenate(steps, axis=1), logits, rtol=1e-12, atol=1e-12)


# -- 5. the contract ------------------------------------------------------------------------------
def test_contract():
    src, tgt = _x(29, 2, 5, 8), _x(30, 2, 3, 8)
    padding = _padding([5, 4], 5)
    check_contract(lambda dtype: Transformer(**SMALL, dtype=dtype), (src, tgt),
                   tgt_is_causal=True, src_key_padding_mask=padding,
                   memory_key_padding_mask=padding)
    check_contract(lambda dtype: TransformerEncoderLayer(8, 2, 16, 0.0, norm_first=True,
                                                         dtype=dtype), (src,))
    check_contract(lambda dtype: TransformerDecoderLayer(8, 2, 16, 0.0, "gelu", dtype=dtype),
                   (tgt, src), tgt_is_causal=True)
    batch = reverse_digits(2, np.random.default_rng(31), max_length=3)
    check_contract(lambda dtype: Seq2Seq(Seq2SeqConfig(d_model=8, nhead=2), dtype=dtype),
                   (batch.source, batch.decoder_input, batch.source_padding_mask,
                    batch.target_padding_mask))


def test_stacks_are_reusable_with_or_without_a_final_norm():
    layer = TransformerEncoderLayer(8, 2, 16, 0.0)
    encoder = TransformerEncoder(layer, 3)
    assert list(encoder.state_dict())[0] == "layers.0.self_attn.in_proj_weight"
    assert not any(name.startswith("norm") for name in encoder.state_dict())
    assert encoder.layers[0] is not layer and encoder.layers[0].linear1 is not \
        encoder.layers[1].linear1
    decoder = TransformerDecoder(TransformerDecoderLayer(8, 2, 16, 0.0), 1)
    out, cache = decoder.forward(_x(32, 1, 2, 8), _x(33, 1, 3, 8))
    assert out.shape == (1, 2, 8) and cache.norm is None


# -- 6. bad input ---------------------------------------------------------------------------------
def test_bad_input():
    model = Transformer(**SMALL)
    src, tgt = _x(0, 2, 5, 8), _x(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"tgt must have last dimension 8 \(d_model\); got "
                                         r"shape \(2, 4, 6\)"):
        model.forward(src, _x(1, 2, 4, 6))
    with pytest.raises(ValueError, match="src and tgt must have the same batch size; got 2 and "
                                         "3"):
        model.forward(src, _x(1, 3, 4, 8))
    with pytest.raises(ValueError, match=r"tgt_mask must have shape \(T, T\) = \(4, 4\) or "
                                         r"\(B \* nhead, T, T\) = \(4, 4, 4\); got \(5, 5\)"):
        model.forward(src, tgt, tgt_mask=_causal(5))
    with pytest.raises(ValueError, match=r"memory_mask must have shape \(T, S\) = \(4, 5\)"):
        model.forward(src, tgt, memory_mask=np.zeros((5, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"src_key_padding_mask must have shape \(B, S\) = "
                                         r"\(2, 5\); got \(2, 4\)"):
        model.forward(src, tgt, src_key_padding_mask=np.zeros((2, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"memory_key_padding_mask must have shape \(B, S\) = "
                                         r"\(2, 5\)"):
        model.forward(src, tgt, memory_key_padding_mask=np.zeros((5, 2), dtype=bool))
    with pytest.raises(TypeError, match="src_mask must be bool .* or a float mask of the input "
                                        "dtype float64; got dtype int64"):
        model.forward(src, tgt, src_mask=np.zeros((5, 5), dtype=np.int64))
    with pytest.raises(TypeError, match="src has dtype float32 but the layer's parameters are "
                                        "float64"):
        model.forward(src.astype(np.float32), tgt)
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by nhead \(4\)"):
        Transformer(d_model=10, nhead=4)
    with pytest.raises(TypeError, match="batch_first must be True or False; got 0"):
        Transformer(**SMALL, batch_first=0)
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'gelu'"):
        TransformerEncoderLayer(8, 2, activation=np.tanh)
    with pytest.raises(ValueError, match="give either memory or static_kv"):
        model.decoder.layers[0].forward(tgt, src, static_kv=(src, src))


# -- 7. interop -----------------------------------------------------------------------------------
def _torch_case(name="transformer_every_mask_float64"):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param"), case


@pytest.mark.parametrize("name", ["transformer_every_mask_float64", "transformer_pre_gelu_float32",
                                  "mha_cross_float64"])
def test_from_torch_then_to_torch_is_bit_exact(name):
    kwargs, state, case = _torch_case(name)
    module = interop.from_torch(case.kind, kwargs, state, dtype=case.dtype)
    exported = interop.to_torch(module, case.kind, kwargs)
    assert list(exported) == list(state)
    for key in state:
        assert exported[key].dtype == state[key].dtype
        assert exported[key].tobytes() == state[key].tobytes(), key
    grads = interop.to_torch(module, case.kind, kwargs, grads=True)
    assert list(grads) == list(state) and not any(g.any() for g in grads.values())


def test_interop_names_every_problem():
    kwargs, state, _ = _torch_case()
    broken = dict(state)
    del broken["decoder.norm.weight"]
    broken["decoder.layers.5.norm1.bias"] = np.zeros(12)
    broken["encoder.layers.0.linear1.weight"] = np.zeros((12, 16))
    with pytest.raises(ValueError) as error:
        interop.from_torch("transformer", kwargs, broken)
    message = str(error.value)
    assert "missing keys: decoder.norm.weight" in message
    assert "unexpected keys: decoder.layers.5.norm1.bias" in message
    assert "encoder.layers.0.linear1.weight: expected shape (16, 12), got (12, 16)" in message
    module = interop.from_torch("transformer", kwargs, state)
    with pytest.raises(ValueError, match="the module does not match kwargs: d_model: module has "
                                         "12, kwargs say 8"):
        interop.to_torch(module, "transformer", dict(kwargs, d_model=8))
    with pytest.raises(TypeError, match="kind 'multihead_attention' needs a "
                                        "TorchMultiheadAttention; got Transformer"):
        interop.to_torch(module, "multihead_attention", {"embed_dim": 12, "num_heads": 3,
                                                         "batch_first": True})


@pytest.mark.parametrize("kind, kwargs, message", [
    ("transformer", {"batch_first": True, "activation": "tanh"},
     "activation must be the string 'relu' or 'gelu'"),
    ("transformer", {"batch_first": True, "device": "cpu"},
     "torch.nn.Transformer has no supported argument 'device'"),
    ("transformer", {"batch_first": True, "custom_encoder": "mine"},
     "custom_encoder='mine' is not implemented"),
    ("multihead_attention", {"embed_dim": 8, "num_heads": 2, "batch_first": True,
                             "add_bias_kv": True}, "add_bias_kv=True is not implemented"),
    ("multihead_attention", {"embed_dim": 8, "num_heads": 2, "batch_first": True,
                             "add_zero_attn": True}, "add_zero_attn=True is not implemented"),
    ("multihead_attention", {"embed_dim": 8, "num_heads": 2, "batch_first": True, "kdim": 4},
     "kdim=4 is not implemented"),
    ("multihead_attention", {"embed_dim": 8, "batch_first": True},
     "torch.nn.MultiheadAttention needs num_heads"),
    ("linear", {}, "kind must be one of 'transformer', 'multihead_attention'; got 'linear'"),
])
def test_unsupported_torch_options_are_refused(kind, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        interop.from_torch(kind, kwargs, {})


def test_batch_first_must_be_a_flag():
    with pytest.raises(TypeError, match="batch_first must be True or False; got 'yes'"):
        interop.from_torch("transformer", {"batch_first": "yes"}, {})


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_readme_example_with_a_live_torch_transformer():
    torch = pytest.importorskip("torch")
    kwargs = dict(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=1,
                  dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
    torch.manual_seed(0)
    reference = torch.nn.Transformer(**kwargs).double()
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    module = interop.from_torch("transformer", kwargs, state, dtype=np.float64)
    src, tgt = _x(34, 2, 6, 16), _x(35, 2, 3, 16)
    padding = _padding([6, 4], 6)
    out, cache = module.forward(src, tgt, tgt_mask=_causal(3), src_key_padding_mask=padding,
                                memory_key_padding_mask=padding)
    src_t, tgt_t = (torch.tensor(a, requires_grad=True) for a in (src, tgt))
    expected = reference(src_t, tgt_t, tgt_mask=torch.tensor(_causal(3)),
                         src_key_padding_mask=torch.tensor(padding),
                         memory_key_padding_mask=torch.tensor(padding))
    dout = _x(36, 2, 3, 16)
    expected.backward(torch.tensor(dout))
    dsrc, dtgt = module.backward(dout, cache)
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dsrc, src_t.grad.numpy(), rtol=1e-9, atol=1e-12)
    grads = interop.to_torch(module, "transformer", kwargs, grads=True)
    for key, parameter in reference.named_parameters():
        np.testing.assert_allclose(grads[key], parameter.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_seq2seq_loss_names_a_bad_target_before_the_model_runs():
    """It was cross-entropy's 'targets must have shape ...' (an argument the caller did not
    pass), after the whole forward."""
    objective = Seq2SeqLoss(Seq2Seq(Seq2SeqConfig(), rng=0))
    ids = np.ones((2, 4), dtype=np.int64)
    ran = []
    objective.model.forward = lambda *args, **kwargs: ran.append(1)
    with pytest.raises(ValueError, match=r"target must have the shape of decoder_input \(2, 4\) "
                                         r".*got \(2, 3\)"):
        objective.forward(ids, ids, np.ones((2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="target must be integers; got dtype float64"):
        objective.forward(ids, ids, np.ones((2, 4)))
    assert not ran
