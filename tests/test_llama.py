"""The Llama decoder: agreement with HF LlamaForCausalLM, gradients, grouped-query heads, tying,
padding, the KV cache, causality, the interop with HF's names, and the errors."""
import numpy as np
import pytest
from contract import (assert_fixture_agrees, assert_hf_round_trip_is_bit_exact,
                      assert_right_padding_changes_nothing, assert_tied_gradient_is_the_sum,
                      check_contract)
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.models.accounting import count_parameters
from numpy_tf.models.llama import Llama, LlamaConfig, LlamaDecoderLayer
from numpy_tf.models.objectives import NextTokenLoss

FIXTURES = ["llama_gqa", "llama_mqa_tied", "llama_mha_biases", "llama_gqa_tied_padded"]


def _config(**changes):
    """A small Llama with weights spread wide (initializer_range 0.3) so attention is far from
    uniform; theta 100 so that a few positions already rotate every pair noticeably."""
    base = dict(vocab_size=24, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0,
                initializer_range=0.3)
    return LlamaConfig(**{**base, **changes})


def _spread_norms(model, seed):
    """RMSNorm weights 1 + N(0, 0.2^2), so no gradient hides behind a weight of exactly 1."""
    rng = np.random.default_rng(seed)
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.data[...] = 1.0 + 0.2 * rng.standard_normal(parameter.shape)
    return model


def _ids(seed, batch, length, vocab=24):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length))


def _case(name):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param")


# -- agreement with Hugging Face ----------------------------------------------------------------
@pytest.mark.parametrize("name", FIXTURES)
def test_agrees_with_hugging_face(name):
    assert_fixture_agrees(name)


def test_the_float64_fixtures_are_true_float64():
    """HF computes RMSNorm, RoPE's tables and the eager softmax in float32 even in a float64
    model; the float64 fixtures patch those (their meta says so), and numpy_tf agrees with
    them far below float32's 1e-7."""
    for name in FIXTURES:
        case = Case.load(fixtures_dir() / f"{name}_float64.npz")
        assert "float32 islands patched to float64" in case.meta["conventions"]["float64"]
        model = interop.from_hf(case.meta["config"], case.section("param"))
        logits, _ = model.forward(case.arrays["input/ids"],
                                  case.arrays.get("input/key_padding_mask"))
        expected = case.arrays["output/logits"]
        assert np.abs(logits - expected).max() < 1e-13 * np.abs(expected).max()


# -- gradients ------------------------------------------------------------------------------------
@given(kv_heads=st.sampled_from([1, 2, 4]), tied=st.booleans(), bias=st.booleans(),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_fast_gradient_check_over_every_parameter(kv_heads, tied, bias, padded, seed):
    config = _config(num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                     attention_bias=bias, mlp_bias=bias)
    model = _spread_norms(Llama(config, rng=seed), seed)
    ids = _ids(seed, 2, 6)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 4:] = padded
    report = gradcheck_module(NextTokenLoss(model), ids, fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_full_finite_differences_of_one_block(kv_heads):
    config = _config(num_key_value_heads=kv_heads, head_dim=6, attention_bias=True,
                     mlp_bias=True, intermediate_size=7)
    block = _spread_norms(LlamaDecoderLayer(config, rng=kv_heads), kv_heads)
    for parameter in block.parameters():
        if parameter.data.ndim == 2:
            parameter.data *= 3.0                   # torch's init is small: sharpen attention
    x = np.random.default_rng(kv_heads).standard_normal((2, 4, 16))
    report = gradcheck_module(block, x, seed=kv_heads)
    assert report.passed, str(report)
    assert len(report.rows) == 1 + 4 * 2 + 3 * 2 + 2           # x, projections, biases, norms


# -- grouped-query heads -------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_heads_are_repeated_key_value_heads(kv_heads):
    """A model with G key/value heads equals the model with H of them in which KV head j is
    repeated for query heads j r .. j r + r - 1 (HF's repeat_kv); its k/v gradients are the
    sums over each group of the repeated heads' gradients."""
    heads, head_dim = 4, 4
    repeats = heads // kv_heads
    grouped = _spread_norms(Llama(_config(num_key_value_heads=kv_heads), rng=1), 2)
    full = Llama(_config(num_key_value_heads=heads), rng=1)
    state = dict(grouped.state_dict())
    for name, value in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            per_head = value.reshape(kv_heads, head_dim, -1)
            state[name] = np.repeat(per_head, repeats, axis=0).reshape(heads * head_dim, -1)
    full.load_state_dict(state)
    ids = _ids(3, 2, 7)
    results = []
    for model in (grouped, full):
        loss, cache = NextTokenLoss(model).forward(ids)
        model.zero_grad()
        NextTokenLoss(model).backward(1.0, cache)
        results.append((cache.logits, model.grad_dict()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-12, atol=1e-13)
    for name, gradient in results[0][1].items():
        expected = results[1][1][name]
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            expected = expected.reshape(kv_heads, repeats, head_dim, -1).sum(axis=1) \
                .reshape(gradient.shape)
        np.testing.assert_allclose(gradient, expected, rtol=1e-10, atol=1e-12, err_msg=name)


# -- tying ----------------------------------------------------------------------------------------
def test_tied_gradient_is_the_sum_of_the_two_untied_uses():
    tied = _spread_norms(Llama(_config(tie_word_embeddings=True), rng=6), 6)
    untied = Llama(_config(), rng=6)
    untied.load_state_dict(dict(tied.state_dict()))   # the untied head starts equal
    assert_tied_gradient_is_the_sum(tied, untied, _ids(7, 2, 7), "embed_tokens.weight",
                                    "lm_head.weight")
    assert count_parameters(untied) - count_parameters(tied) == 24 * 16


# -- padding, positions, the KV cache, causality --------------------------------------------------
def test_right_padding_changes_nothing_for_the_real_tokens():
    model = _spread_norms(Llama(_config(), rng=8), 8)
    assert_right_padding_changes_nothing(model, _ids(9, 1, 5), _ids(10, 1, 3))


def test_left_padding_with_explicit_positions():
    """HF's left padding: positions = cumsum(attention_mask) - 1, the real tokens from 0."""
    model = _spread_norms(Llama(_config(), rng=11), 11)
    real = _ids(12, 1, 5)
    padded = np.concatenate([_ids(13, 1, 3), real], axis=1)
    mask = np.array([[True] * 3 + [False] * 5])
    positions = np.maximum(np.cumsum(~mask, axis=1) - 1, 0)
    alone, _ = model.forward(real)
    shifted, _ = model.forward(padded, key_padding_mask=mask, positions=positions)
    np.testing.assert_allclose(shifted[:, 3:], alone, rtol=1e-12, atol=1e-13)


def test_rope_sees_only_relative_positions():
    """Shifting every position by the same amount rotates q and k alike: nothing changes."""
    model = _spread_norms(Llama(_config(), rng=14), 14)
    ids = _ids(15, 2, 6)
    at_zero, _ = model.forward(ids)
    at_forty, _ = model.forward(ids, positions=np.arange(40, 46))
    np.testing.assert_allclose(at_forty, at_zero, rtol=1e-11, atol=1e-12)
    reversed_positions, _ = model.forward(ids, positions=np.arange(6)[::-1].copy())
    assert not np.allclose(reversed_positions, at_zero)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_cached_decoding_step_by_step_equals_the_full_forward(kv_heads):
    model = _spread_norms(Llama(_config(num_key_value_heads=kv_heads), rng=16), 16)
    ids = _ids(17, 2, 7)
    full, _ = model.forward(ids)
    logits, cache = model.forward(ids[:, :3])                   # a prompt, then one at a time
    steps = [logits]
    for t in range(3, 7):
        logits, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)
    assert [k.shape for k, _ in cache.present] == [(2, kv_heads, 7, 4)] * 2


@given(length=st.integers(2, 6), data=st.data(), seed=st.integers(0, 2**16))
def test_causality_a_later_token_never_changes_an_earlier_logit(length, data, seed):
    model = Llama(_config(), rng=seed)
    ids = _ids(seed, 1, length)
    position = data.draw(st.integers(1, length - 1))
    changed = ids.copy()
    changed[0, position:] = (ids[0, position:] + 1) % 24
    a, _ = model.forward(ids)
    b, _ = model.forward(changed)
    np.testing.assert_array_equal(a[0, :position], b[0, :position])
    assert not np.array_equal(a[0, position], b[0, position])


def test_inputs_longer_than_max_position_embeddings_are_allowed():
    model = Llama(_config(max_position_embeddings=4), rng=18)
    logits, _ = model.forward(_ids(19, 1, 9))
    assert logits.shape == (1, 9, 24) and np.all(np.isfinite(logits))


# -- the config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True}, {"head_dim": 6},
                                     {"attention_bias": True, "mlp_bias": True},
                                     {"num_key_value_heads": 1, "num_hidden_layers": 3}])
def test_parameter_count_from_the_shapes(changes):
    config = _config(**changes)
    assert config.num_parameters() == count_parameters(Llama(config))


def test_presets_are_counted_without_allocating():
    smol = LlamaConfig.smollm2_135m()
    assert (smol.num_hidden_layers, smol.hidden_size, smol.num_attention_heads,
            smol.kv_heads, smol.head_width, smol.intermediate_size, smol.vocab_size) == \
        (30, 576, 9, 3, 64, 1536, 49152)
    assert smol.tie_word_embeddings and smol.rope_theta == 1e5 and smol.rms_norm_eps == 1e-5
    assert smol.num_parameters() == 134_515_008
    assert LlamaConfig.llama2_7b().num_parameters() == 6_738_415_616
    assert LlamaConfig.smollm2_135m(num_hidden_layers=1).num_hidden_layers == 1


def test_initialisation_follows_hugging_face():
    model = Llama(_config(initializer_range=0.02, hidden_size=64, intermediate_size=128,
                          pad_token_id=3), rng=20)
    weight = model.layers[0].mlp.gate_proj.weight.data
    assert abs(weight.std() - 0.02) < 0.001 and abs(weight.mean()) < 0.001
    np.testing.assert_array_equal(model.norm.weight.data, 1.0)
    np.testing.assert_array_equal(model.embed_tokens.weight.data[3], 0.0)


def test_names_are_hugging_face_names_without_the_model_prefix():
    names = list(Llama(_config(num_hidden_layers=1)).state_dict())
    assert names == ["embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                     "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
                     "layers.0.self_attn.o_proj.weight", "layers.0.mlp.gate_proj.weight",
                     "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                     "layers.0.input_layernorm.weight",
                     "layers.0.post_attention_layernorm.weight", "norm.weight",
                     "lm_head.weight"]


def test_contract():
    check_contract(lambda dtype: Llama(_config(tie_word_embeddings=True), dtype=dtype),
                   (_ids(21, 2, 5),))


# -- interop with Hugging Face's names -----------------------------------------------------------
@pytest.mark.parametrize("name", ["llama_gqa_float64", "llama_mqa_tied_float32",
                                  "llama_mha_biases_float64"])
def test_load_then_export_is_bit_exact(name):
    assert_hf_round_trip_is_bit_exact(*_case(name), name.split("_")[-1])


def test_tied_head_may_be_left_out_but_not_contradicted():
    config, state = _case("llama_mqa_tied_float64")
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    model = interop.from_hf(config, without_head)
    assert model.lm_head.weight is model.embed_tokens.weight
    exported = interop.to_hf(model, config)
    np.testing.assert_array_equal(exported["lm_head.weight"], state["lm_head.weight"])
    contradicting = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1.0})
    with pytest.raises(ValueError, match="lm_head.weight must equal model.embed_tokens.weight"):
        interop.from_hf(config, contradicting)
    untied_config, untied_state = _case("llama_gqa_float64")
    with pytest.raises(ValueError, match="missing keys: lm_head.weight"):
        interop.from_hf(untied_config, {k: v for k, v in untied_state.items()
                                        if k != "lm_head.weight"})


def test_older_configs_and_buffers_are_read():
    """Before transformers 5: rope_theta at the top level, rope_scaling None, and (older
    still) the rotary inv_freq buffers in the state_dict."""
    config, state = _case("llama_mqa_tied_float64")
    old = {k: v for k, v in config.items() if k != "rope_parameters"}
    old.update(rope_theta=500.0, rope_scaling=None, head_dim=None)
    with_buffers = dict(state, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2)})
    with pytest.raises(ValueError, match=r"expected shape \(16, 16\), got \(24, 16\)"):
        interop.from_hf(old, with_buffers)          # head_dim None is hidden_size // heads
    old["head_dim"] = 6
    model = interop.from_hf(old, with_buffers)
    assert model.config.rope_theta == 500.0 and model.config.head_width == 6


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope_type 'llama3' needs low_freq_factor in rope_parameters"),
    ({"rope_scaling": {"type": "proportional", "factor": 2.0}},
     "rope_type 'proportional' is not implemented"),
    ({"rope_theta": 123.0}, r"rope_theta \(123.0\) and rope_parameters' rope_theta \(500.0\)"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
    ({"pretraining_tp": 2}, "pretraining_tp=2 is not implemented"),
    ({"sliding_window": 4096}, "sliding_window=4096 is not implemented"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads \(3\) must divide "
                                 r"num_attention_heads \(4\)"),
    ({"head_dim": 5}, "head_dim must be even .RoPE rotates pairs of features.; got 5"),
])
def test_unsupported_configs_are_refused(changes, message):
    config, state = _case("llama_mqa_tied_float64")
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(config, **changes), state)


def test_bad_input():
    model = Llama(_config())
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 4] = 24
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 24\); got 24 at "
                                         r"position \(1, 4\)"):
        model.forward(ids)
    with pytest.raises(ValueError, match=r"ids must have 2 dimensions \(B, T\)"):
        model.forward(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        model.forward(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(3,\) or "
                                         r"\(B, T\) = \(1, 3\) to match ids; got \(4,\)"):
        model.forward(np.zeros((1, 3), dtype=np.int64), positions=np.arange(4))
    with pytest.raises(ValueError, match="positions must be non-negative; got -1"):
        model.forward(np.zeros((1, 3), dtype=np.int64), positions=np.arange(-1, 2))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\) = "
                                         r"\(1, 3\) .*; got \(3, 1\)"):
        model.forward(np.zeros((1, 3), dtype=np.int64),
                      key_padding_mask=np.zeros((3, 1), dtype=bool))
    _, cache = model.forward(np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"past_kv must hold one \(k, v\) per layer \(2\); "
                                         "got 1"):
        model.forward(np.zeros((1, 1), dtype=np.int64), past_kv=cache.present[:1])
    with pytest.raises(ValueError, match=r"past_kv\[1\] must be \(k, v\), each of shape "
                                         r"\(B, G, P, d\) = \(1, 2, 3, 4\)"):
        model.forward(np.zeros((1, 1), dtype=np.int64),
                      past_kv=[cache.present[0], (cache.present[1][0][:, :1],) * 2])
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\) = "
                                         r"\(1, 4\) \(the cached and the new positions\)"):
        model.forward(np.zeros((1, 1), dtype=np.int64), past_kv=cache.present,
                      key_padding_mask=np.zeros((1, 1), dtype=bool))
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\) must divide "
                                         r"num_attention_heads \(4\)"):
        _config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="head_dim must be even"):
        _config(head_dim=5)
    with pytest.raises(ValueError, match=r"hidden_size \(18\) must be divisible by "
                                         r"num_attention_heads \(4\), or give head_dim"):
        _config(hidden_size=18)
    with pytest.raises(ValueError, match="pad_token_id must be None or in"):
        _config(pad_token_id=24)
    with pytest.raises(TypeError, match="config must be a LlamaConfig"):
        Llama({"vocab_size": 24})


@pytest.mark.torch
def test_readme_example_with_a_live_llama_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=24, intermediate_size=40,
                                      num_hidden_layers=2, num_attention_heads=6,
                                      num_key_value_heads=2, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()          # float32, as HF ships it
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = interop.from_hf(config.to_dict(), state, dtype=np.float32)
    ids = np.array([[1, 5, 7, 2, 9, 33]])
    logits, _ = model.forward(ids)
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
