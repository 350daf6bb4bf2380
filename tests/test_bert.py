"""The encoder-only model (BERT): agreement with HF BertForMaskedLM and with a torch mirror,
gradients, permutation equivariance without positions, padding, tying, the interop with HF's
names (query/key/value joined into in_proj_weight), the masking routine, and the errors."""
import numpy as np
import pytest
from contract import (assert_fixture_agrees, assert_hf_round_trip_is_bit_exact,
                      assert_tied_gradient_is_the_sum, check_contract)
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.models.accounting import account, count_parameters
from numpy_tf.models.bert import Bert, BertConfig
from numpy_tf.models.objectives import MaskedLMLoss
from numpy_tf.text.datasets import mask_tokens
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint

HF_FIXTURES = ["bert_tied", "bert_untied", "bert_tied_padded"]
MIRROR_FIXTURES = ["bert_mirror_post_ln", "bert_mirror_pre_ln"]
VOCAB = 24


def _config(**changes):
    base = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=20, max_position_embeddings=10, type_vocab_size=2)
    return BertConfig(**{**base, **changes})


def _spread(model, seed):
    """Every parameter redrawn, N(0, 0.3^2), norm weights 1 + N(0, 0.2^2): no default of ones
    and zeros hides a mistake, and attention is far from uniform."""
    rng = np.random.default_rng(seed)
    for name, parameter in model.named_parameters():
        noise = rng.standard_normal(parameter.shape)
        is_norm_weight = "norm" in name and name.endswith("weight")
        parameter.data[...] = 1.0 + 0.2 * noise if is_norm_weight else 0.3 * noise
    return model


def _model(seed=0, **changes):
    return _spread(Bert(_config(**changes), rng=seed), seed)


def _ids(seed, batch, length, vocab=VOCAB):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length))


def _labels(seed, ids, padding=None):
    """The ids at about half the (real) positions, -100 elsewhere; position 0 always asked."""
    chosen = np.random.default_rng(seed).random(ids.shape) < 0.5
    chosen[:, 0] = True
    if padding is not None:
        chosen &= ~padding
    return np.where(chosen, ids, -100)


def _case(name):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param")


# -- agreement with torch and Hugging Face -------------------------------------------------------
@pytest.mark.parametrize("name", HF_FIXTURES + MIRROR_FIXTURES)
def test_agrees_with_torch_and_hugging_face(name):
    assert_fixture_agrees(name)


def test_hugging_face_bert_is_float64_throughout():
    """Unlike Llama, HF BERT keeps no float32 islands in a float64 model (nn.LayerNorm, exact
    GELU, the eager softmax in the scores' dtype): unpatched, it agrees with numpy_tf to
    rounding, far below float32's 1e-7, in the logits and in every gradient."""
    for name in HF_FIXTURES:
        case = Case.load(fixtures_dir() / f"{name}_float64.npz")
        assert "float64" not in case.meta["conventions"]
        model = interop.from_hf(case.meta["config"], case.section("param"))
        args = (case.arrays["input/ids"], case.arrays["input/labels"])
        kwargs = {"key_padding_mask": case.arrays.get("input/key_padding_mask"),
                  "token_type_ids": case.arrays["input/token_type_ids"]}
        loss, cache = MaskedLMLoss(model).forward(*args, **kwargs)
        MaskedLMLoss(model).backward(1.0, cache)
        expected = case.arrays["output/logits"]
        assert np.abs(cache.logits - expected).max() < 1e-13 * np.abs(expected).max()
        grads = interop.to_hf(model, case.meta["config"], grads=True)
        scale = max(np.abs(g).max() for g in case.section("grad").values())
        for key, reference in case.section("grad").items():
            assert np.abs(grads[key] - reference).max() < 1e-13 * scale, key


# -- gradients ------------------------------------------------------------------------------------
@given(norm_first=st.booleans(), tied=st.booleans(), activation=st.sampled_from(["gelu", "relu"]),
       padded=st.booleans(), segments=st.booleans(), positions=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fast_gradient_check_over_every_parameter(norm_first, tied, activation, padded,
                                                  segments, positions, seed):
    model = _model(seed, norm_first=norm_first, tie_word_embeddings=tied, hidden_act=activation,
                   type_vocab_size=2 if segments else 0, position_embeddings=positions)
    ids = _ids(seed, 2, 6)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 4:] = padded
    kwargs = {"key_padding_mask": padding}
    if segments:
        kwargs["token_type_ids"] = (np.arange(6) >= 3).astype(np.int64)[None].repeat(2, 0)
    report = gradcheck_module(MaskedLMLoss(model), ids, _labels(seed, ids, padding), fast=True,
                              seed=seed, forward_kwargs=kwargs)
    assert report.passed, str(report)


@pytest.mark.parametrize("norm_first", [False, True])
def test_full_finite_differences_of_a_small_model(norm_first):
    """Every element of every parameter (the padding row of the word table skipped: it gets no
    gradient by definition) against central differences of the logits."""
    config = _config(vocab_size=7, hidden_size=4, num_attention_heads=2, intermediate_size=6,
                     num_hidden_layers=1, max_position_embeddings=4, norm_first=norm_first,
                     tie_word_embeddings=not norm_first, layer_norm_eps=1e-5)
    model = _spread(Bert(config, rng=1), 1)
    padding = np.array([[False, False, False], [False, False, True]])
    report = gradcheck_module(model, _ids(2, 2, 3, vocab=7), seed=3, forward_kwargs={
        "key_padding_mask": padding, "token_type_ids": np.array([[0, 1, 1], [0, 0, 1]])})
    assert report.passed, str(report)
    assert len(report.rows) == len(model.parameters())
    assert "(4 constant skipped)" in report.rows[0].name       # the pad_token_id row


def test_tied_gradient_is_the_sum_of_the_two_untied_uses():
    tied = _model(6, tie_word_embeddings=True)
    untied = Bert(_config(tie_word_embeddings=False), rng=6)
    untied.load_state_dict(dict(tied.state_dict()))       # the untied decoder starts equal
    assert_tied_gradient_is_the_sum(tied, untied, _ids(7, 2, 7),
                                    "embeddings.word_embeddings.weight", "mlm_head.decoder.weight")


# -- what the architecture promises ---------------------------------------------------------------
def test_without_positions_the_logits_permute_with_the_tokens():
    """Attention without positions treats its keys as a set: permuting the tokens (with their
    padding and segments) permutes the logits and changes nothing else."""
    ids = _ids(8, 2, 7)
    padding = np.zeros((2, 7), dtype=bool)
    padding[1, 5:] = True
    segments = _ids(9, 2, 7, vocab=2)
    order = np.random.default_rng(10).permutation(7)
    for positions, permutes in [(False, True), (True, False)]:
        model = _model(11, position_embeddings=positions)
        logits, _ = model.forward(ids, padding, segments)
        permuted, _ = model.forward(ids[:, order], padding[:, order], segments[:, order])
        assert np.allclose(permuted, logits[:, order], rtol=1e-12, atol=1e-12) == permutes
    zeroed = _model(11)
    zeroed.embeddings.position_embeddings.weight.data[...] = 0.0
    logits, _ = zeroed.forward(ids, padding, segments)
    permuted, _ = zeroed.forward(ids[:, order], padding[:, order], segments[:, order])
    np.testing.assert_allclose(permuted, logits[:, order], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_never_changes_the_real_tokens(norm_first):
    """Appending padded positions (any ids, masked as keys, -100 as labels) leaves the real
    positions' logits, the loss and every gradient unchanged."""
    model = _model(12, norm_first=norm_first)
    real, extra = _ids(13, 1, 5), _ids(14, 1, 3)
    padded = np.concatenate([real, extra], axis=1)
    mask = np.arange(8)[None] >= 5
    labels = _labels(15, real)
    padded_labels = np.concatenate([labels, np.full((1, 3), -100)], axis=1)
    segments = np.array([[0, 0, 1, 1, 1]])
    padded_segments = np.concatenate([segments, [[1, 0, 1]]], axis=1)
    results = []
    for ids, key_padding_mask, y, tt in [(real, None, labels, segments),
                                         (padded, mask, padded_labels, padded_segments)]:
        loss, cache = MaskedLMLoss(model).forward(ids, y, key_padding_mask=key_padding_mask,
                                                  token_type_ids=tt)
        model.zero_grad()
        MaskedLMLoss(model).backward(1.0, cache)
        results.append((loss, cache.logits[:, :5], {k: g.copy() for k, g in
                                                    model.grad_dict().items()}))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-13)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-12, atol=1e-13)
    for name, gradient in results[0][2].items():
        np.testing.assert_allclose(results[1][2][name], gradient, rtol=1e-11, atol=1e-13,
                                   err_msg=name)


def test_every_position_sees_every_other():
    """No causal mask: changing the last token changes the first position's logits."""
    model = _model(16)
    ids = _ids(17, 1, 6)
    changed = ids.copy()
    changed[0, -1] = (ids[0, -1] + 1) % VOCAB
    a, _ = model.forward(ids)
    b, _ = model.forward(changed)
    assert not np.allclose(a[0, 0], b[0, 0])


def test_no_token_type_ids_means_segment_zero():
    model = _model(18)
    ids = _ids(19, 2, 5)
    np.testing.assert_array_equal(model.forward(ids)[0],
                                  model.forward(ids, token_type_ids=np.zeros_like(ids))[0])


def test_pre_ln_stack_ends_with_its_own_layernorm():
    assert Bert(_config(norm_first=True)).encoder.norm is not None
    assert Bert(_config(norm_first=False)).encoder.norm is None


def test_contract():
    padding = np.array([[False] * 5, [False] * 3 + [True] * 2])
    check_contract(lambda dtype: _model(20, tie_word_embeddings=True).astype(dtype),
                   (_ids(21, 2, 5),), key_padding_mask=padding,
                   token_type_ids=np.array([[0, 0, 1, 1, 1]] * 2))


def test_masked_lm_loss_is_the_mean_over_the_labels():
    model = _model(22)
    ids = _ids(23, 2, 6)
    labels = _labels(24, ids)
    loss, cache = MaskedLMLoss(model).forward(ids, labels)
    logits = cache.logits
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    chosen = labels != -100
    expected = -log_probs[chosen, labels[chosen]].mean()
    np.testing.assert_allclose(loss, expected, rtol=1e-13)


# -- the model's config, names, counts, checkpoints ------------------------------------------------
def test_names():
    names = list(Bert(_config(num_hidden_layers=1)).state_dict())
    assert names[:5] == ["embeddings.word_embeddings.weight",
                         "embeddings.position_embeddings.weight",
                         "embeddings.token_type_embeddings.weight", "embeddings.norm.weight",
                         "embeddings.norm.bias"]
    assert names[5:9] == ["encoder.layers.0.self_attn.in_proj_weight",
                          "encoder.layers.0.self_attn.in_proj_bias",
                          "encoder.layers.0.self_attn.out_proj.weight",
                          "encoder.layers.0.self_attn.out_proj.bias"]
    assert names[-6:] == ["mlm_head.dense.weight", "mlm_head.dense.bias", "mlm_head.norm.weight",
                          "mlm_head.norm.bias", "mlm_head.decoder.weight", "mlm_head.decoder.bias"]
    bare = list(Bert(_config(num_hidden_layers=1, type_vocab_size=0,
                             position_embeddings=False)).state_dict())
    assert bare[:3] == ["embeddings.word_embeddings.weight", "embeddings.norm.weight",
                        "embeddings.norm.bias"]


def test_initialisation_follows_hugging_face():
    model = Bert(_config(hidden_size=64, intermediate_size=128, initializer_range=0.02), rng=25)
    layers = model.encoder.layers
    for weight in (layers[0].self_attn.in_proj_weight.data, layers[1].linear1.weight.data):
        assert abs(weight.std() - 0.02) < 0.001 and abs(weight.mean()) < 0.001
    assert not np.array_equal(layers[0].linear1.weight.data, layers[1].linear1.weight.data)
    np.testing.assert_array_equal(layers[0].self_attn.in_proj_bias.data, 0.0)
    np.testing.assert_array_equal(model.mlm_head.norm.weight.data, 1.0)
    np.testing.assert_array_equal(model.embeddings.word_embeddings.weight.data[0], 0.0)


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_matches_the_hf_config_formula(tied):
    """accounting.account counts HF's BertForMaskedLM; an untied HF model also holds
    cls.predictions.bias, which its computation never reads and numpy_tf does not keep."""
    config, state = _case("bert_tied_float64" if tied else "bert_untied_float64")
    model = interop.from_hf(config, state)
    unused = 0 if tied else config["vocab_size"]
    assert account(config).total == count_parameters(model) + unused


def test_checkpoint_rebuilds_the_model(tmp_path):
    model = _model(26, norm_first=True, tie_word_embeddings=False, type_vocab_size=0)
    save_checkpoint(tmp_path / "bert.npz", model)
    loaded = load_checkpoint(tmp_path / "bert.npz").model
    assert isinstance(loaded, Bert) and loaded.config == model.config
    ids = _ids(27, 2, 4)
    np.testing.assert_array_equal(loaded.forward(ids)[0], model.forward(ids)[0])


# -- interop with Hugging Face's names ------------------------------------------------------------
@pytest.mark.parametrize("name", ["bert_tied_float64", "bert_untied_float32",
                                  "bert_tied_padded_float32", "bert_untied_float64"])
def test_load_then_export_is_bit_exact(name):
    assert_hf_round_trip_is_bit_exact(*_case(name), name.split("_")[-1])


def test_query_key_value_join_into_in_proj_weight():
    config, state = _case("bert_untied_float64")
    model = interop.from_hf(config, state)
    prefix = "bert.encoder.layer.1.attention.self."
    np.testing.assert_array_equal(
        model.encoder.layers[1].self_attn.in_proj_weight.data,
        np.concatenate([state[f"{prefix}{part}.weight"] for part in ("query", "key", "value")]))


def test_tied_names_may_be_left_out_but_not_contradicted():
    config, state = _case("bert_tied_float64")
    lean = {k: v for k, v in state.items()
            if k not in ("cls.predictions.decoder.weight", "cls.predictions.bias")}
    model = interop.from_hf(config, lean)
    assert model.mlm_head.decoder.weight is model.embeddings.word_embeddings.weight
    exported = interop.to_hf(model, config)
    for key in ("cls.predictions.decoder.weight", "cls.predictions.bias"):
        np.testing.assert_array_equal(exported[key], state[key])
    without_decoder_bias = {k: v for k, v in state.items() if k != "cls.predictions.decoder.bias"}
    interop.from_hf(config, without_decoder_bias)
    with pytest.raises(ValueError, match="cls.predictions.bias must equal "
                                         "cls.predictions.decoder.bias"):
        interop.from_hf(config, dict(state, **{"cls.predictions.bias":
                                               state["cls.predictions.bias"] + 1.0}))
    with pytest.raises(ValueError, match="cls.predictions.decoder.weight must equal "
                                         "bert.embeddings.word_embeddings.weight"):
        interop.from_hf(config, dict(state, **{"cls.predictions.decoder.weight":
                                               state["cls.predictions.decoder.weight"] + 1.0}))
    neither = {k: v for k, v in state.items()
               if k not in ("cls.predictions.decoder.bias", "cls.predictions.bias")}
    with pytest.raises(ValueError, match="missing keys: cls.predictions.decoder.bias"):
        interop.from_hf(config, neither)


def test_untied_unused_bias_must_be_zero():
    """transformers 5's untied BertForMaskedLM computes with cls.predictions.decoder.bias;
    cls.predictions.bias is never read. numpy_tf keeps no copy: it may be left out, must be
    zero when given, and is exported as zeros (so the round trip is still exact)."""
    config, state = _case("bert_untied_float64")
    np.testing.assert_array_equal(state["cls.predictions.bias"], 0.0)
    model = interop.from_hf(config, {k: v for k, v in state.items()
                                     if k != "cls.predictions.bias"})
    np.testing.assert_array_equal(interop.to_hf(model, config)["cls.predictions.bias"], 0.0)
    with pytest.raises(ValueError, match="cls.predictions.bias takes no part in the "
                                         "computation.*must be zero; got max .value. 0.5"):
        interop.from_hf(config, dict(state, **{"cls.predictions.bias":
                                               np.full(config["vocab_size"], 0.5)}))


def test_older_buffers_are_ignored_and_shapes_checked():
    config, state = _case("bert_tied_float64")
    old = dict(state, **{"bert.embeddings.position_ids": np.arange(12)[None]})
    interop.from_hf(config, old)
    bad = dict(state, **{"bert.encoder.layer.0.attention.self.key.weight": np.zeros((16, 8))})
    with pytest.raises(ValueError, match=r"bert.encoder.layer.0.attention.self.key.weight: "
                                         r"expected shape \(16, 16\), got \(16, 8\)"):
        interop.from_hf(config, bad)
    with pytest.raises(ValueError, match="missing keys: bert.encoder.layer.1.attention.self."
                                         "value.bias"):
        interop.from_hf(config, {k: v for k, v in state.items()
                                 if k != "bert.encoder.layer.1.attention.self.value.bias"})


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not implemented"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not implemented"),
    ({"position_embedding_type": "relative_key"},
     "position_embedding_type 'relative_key' is not implemented"),
    ({"is_decoder": True}, "is_decoder=True is not implemented"),
    ({"add_cross_attention": True}, "add_cross_attention=True is not implemented"),
    ({"architectures": ["BertModel"]}, r"architectures \['BertModel'\] is not supported"),
    ({"num_attention_heads": 3}, r"hidden_size \(16\) must be divisible by num_attention_heads"),
])
def test_unsupported_configs_are_refused(changes, message):
    config, state = _case("bert_tied_float64")
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(config, **changes), state)


@pytest.mark.torch
@pytest.mark.parametrize("tied", [True, False])
def test_live_hugging_face_model_with_padding(tied):
    """The README's example: a BertForMaskedLM made here, float64, right padding; the logits
    and every gradient of HF's own `labels=` loss within 1e-12."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=24, num_hidden_layers=2,
                                     num_attention_heads=6, intermediate_size=40,
                                     max_position_embeddings=16, tie_word_embeddings=tied,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(config).double().eval()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = interop.from_hf(config.to_dict(), state)
    attention_mask = np.array([[1] * 7, [1] * 5 + [0] * 2])
    ids, labels = mask_tokens(_ids(28, 2, 7, vocab=40), np.random.default_rng(0), mask_id=3,
                              vocab_size=40, special_ids=(0, 1, 2),
                              padding_mask=attention_mask == 0, probability=0.5)
    out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask),
             labels=torch.tensor(labels))
    out.loss.backward()
    loss, cache = MaskedLMLoss(model).forward(ids, labels, key_padding_mask=attention_mask == 0)
    MaskedLMLoss(model).backward(1.0, cache)
    np.testing.assert_allclose(cache.logits, out.logits.detach().numpy(), rtol=1e-12,
                               atol=1e-13)
    np.testing.assert_allclose(loss, out.loss.item(), rtol=1e-12)
    grads = interop.to_hf(model, config.to_dict(), grads=True)
    for name, parameter in hf.named_parameters(remove_duplicate=False):
        expected = np.zeros(parameter.shape) if parameter.grad is None else parameter.grad.numpy()
        np.testing.assert_allclose(grads[name], expected, rtol=1e-10, atol=1e-13, err_msg=name)


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    model = Bert(_config(max_position_embeddings=6))
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 4] = VOCAB
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 24\); got 24 at "
                                         r"position \(1, 4\)"):
        model.forward(ids)
    ids = np.zeros((2, 5), dtype=np.int64)
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        model.forward(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"ids must have 2 dimensions \(B, T\)"):
        model.forward(np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="ids has T=7 positions, more than "
                                         "max_position_embeddings = 6"):
        model.forward(np.zeros((1, 7), dtype=np.int64))
    Bert(_config(max_position_embeddings=6, position_embeddings=False)).forward(
        np.zeros((1, 7), dtype=np.int64))                          # no table, no limit
    segments = np.zeros((2, 5), dtype=np.int64)
    segments[0, 3] = 2
    with pytest.raises(ValueError, match=r"token_type_ids must be integers in \[0, 2\); got 2 "
                                         r"at position \(0, 3\)"):
        model.forward(ids, token_type_ids=segments)
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of ids \(2, 5\); "
                                         r"got \(2, 4\)"):
        model.forward(ids, token_type_ids=np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=r"token_type_ids were given but the model has no "
                                         r"segment table \(type_vocab_size=0\)"):
        Bert(_config(type_vocab_size=0)).forward(ids, token_type_ids=np.zeros_like(ids))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, T\) = "
                                         r"\(2, 5\); got \(5, 2\)"):
        model.forward(ids, key_padding_mask=np.zeros((5, 2), dtype=bool))
    with pytest.raises(TypeError, match=r"key_padding_mask must be bool \(True = padding\)"):
        model.forward(ids, key_padding_mask=np.ones((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"labels must have the shape of inputs \(2, 5\)"):
        MaskedLMLoss(model).forward(ids, np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="hidden_act must be one of 'relu', 'gelu'"):
        _config(hidden_act="gelu_tanh")
    with pytest.raises(ValueError, match=r"hidden_size \(18\) must be divisible by "
                                         r"num_attention_heads \(4\)"):
        _config(hidden_size=18)
    with pytest.raises(ValueError, match="pad_token_id must be None or in"):
        _config(pad_token_id=VOCAB)
    with pytest.raises(TypeError, match="config must be a BertConfig"):
        Bert({"vocab_size": VOCAB})


# -- the masking routine ---------------------------------------------------------------------------
MASK, SPECIAL, V = 3, (0, 1, 2, 3), 1000


def _corpus(seed=29, batch=64, length=128):
    """Token ids with a special token opening each row and right padding (id 0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, V, (batch, length))
    ids[:, 0] = 1
    padding = np.arange(length)[None] >= rng.integers(length // 2, length + 1, (batch, 1))
    ids[padding] = 0
    return ids, padding


def test_mask_tokens_statistics():
    """About 15 % of the real tokens are chosen (a Bernoulli draw each: the count is
    Binomial(n, 0.15), so allow 5 standard deviations); of those 80 % read MASK, 10 % a random
    token, 10 % stay (a random draw equal to MASK or the original counts there: 1/V each)."""
    ids, padding = _corpus()
    inputs, labels = mask_tokens(ids, np.random.default_rng(0), MASK, V, special_ids=SPECIAL[:2],
                                 padding_mask=padding)
    chosen = labels != -100
    eligible = ~padding & (ids != 1)
    assert not chosen[~eligible].any()                           # never padding or specials
    n = int(eligible.sum())
    assert abs(chosen.sum() - 0.15 * n) < 5 * np.sqrt(n * 0.15 * 0.85)
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])
    k = int(chosen.sum())
    masked = (inputs[chosen] == MASK).sum()
    kept = (inputs[chosen] == ids[chosen]).sum()
    for count, p in [(masked, 0.8 + 0.1 / V), (kept, 0.1 + 0.1 / V),
                     (k - masked - kept, 0.1 - 0.2 / V)]:
        assert abs(count - p * k) < 5 * np.sqrt(k * p * (1 - p)), (count, p, k)
    assert inputs.dtype == labels.dtype == np.int64 and inputs.shape == ids.shape


def test_mask_tokens_is_reproducible_by_seed():
    ids, padding = _corpus(30, 8, 32)
    first = mask_tokens(ids, np.random.default_rng(5), MASK, V, padding_mask=padding)
    again = mask_tokens(ids, np.random.default_rng(5), MASK, V, padding_mask=padding)
    other = mask_tokens(ids, np.random.default_rng(6), MASK, V, padding_mask=padding)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[1], other[1])


def test_mask_tokens_everything_and_ignore_index():
    """probability 1 chooses every real token; the label elsewhere is the given ignore_index."""
    ids, padding = _corpus(31, 4, 16)
    inputs, labels = mask_tokens(ids, np.random.default_rng(7), MASK, V, special_ids=[1],
                                 padding_mask=padding, probability=1.0, ignore_index=-1)
    np.testing.assert_array_equal(labels == -1, padding | (ids == 1))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"ids": np.array([[1, 1000]])}, ValueError, r"ids must be integers in \[0, 1000\)"),
    ({"ids": np.zeros((1, 2))}, TypeError, "ids must be integers"),
    ({"rng": 0}, TypeError, "rng must be a numpy.random.Generator"),
    ({"mask_id": 1000}, ValueError, r"mask_id must be a token id in \[0, 1000\); got 1000"),
    ({"special_ids": [1, 1001]}, ValueError, r"special_ids must be integers in \[0, 1000\)"),
    ({"padding_mask": np.zeros((1, 3), dtype=bool)}, ValueError,
     r"padding_mask must have the shape of ids \(1, 2\); got \(1, 3\)"),
    ({"padding_mask": np.zeros((1, 2))}, TypeError, "padding_mask must be a bool numpy array"),
    ({"probability": 0.0}, ValueError, r"probability must be a number in \(0, 1\]"),
    ({"probability": 1.5}, ValueError, r"probability must be a number in \(0, 1\]"),
])
def test_mask_tokens_bad_input(kwargs, error, message):
    arguments = {"ids": np.array([[5, 6]]), "rng": np.random.default_rng(0), "mask_id": MASK,
                 "vocab_size": V, **kwargs}
    with pytest.raises(error, match=message):
        mask_tokens(**arguments)
