"""GPT-NeoX / Pythia: agreement with HF GPTNeoXForCausalLM, partial rotary, the per-head fused
qkv, parallel and sequential residuals, gradients, tying, padding, the KV cache, the interop
with HF's names, the parameter count and the refusals."""
import numpy as np
import pytest
from contract import (assert_fixture_agrees, assert_hf_round_trip_is_bit_exact,
                      assert_right_padding_changes_nothing, assert_tied_gradient_is_the_sum,
                      check_contract, random_like)
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_tf import generate, gradcheck, gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.layers.multihead import MultiHeadAttention
from numpy_tf.layers.neox_attention import NeoXAttention
from numpy_tf.layers.rope import partial_rope_backward, partial_rope_forward, rope_forward
from numpy_tf.models.accounting import account, count_parameters, load_config
from numpy_tf.models.neox import GPTNeoX, NeoXConfig, NeoXLayer
from numpy_tf.models.objectives import NextTokenLoss

FIXTURES = ["neox_parallel", "neox_sequential", "neox_full_rotary_tied", "neox_no_bias_padded"]


def _config(**changes):
    """A small GPT-NeoX (heads of 8, a quarter rotated) with weights spread wide
    (initializer_range 0.3) so attention is far from uniform; theta 100 so that a few
    positions already rotate every pair noticeably."""
    base = dict(vocab_size=24, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=20, rotary_pct=0.25, rope_theta=100.0, initializer_range=0.3)
    return NeoXConfig(**{**base, **changes})


def _spread_norms(model, seed):
    """LayerNorm weights 1 + N(0, 0.2^2) and biases N(0, 0.2^2): no gradient hides behind a
    weight of exactly 1 or a bias of exactly 0."""
    rng = np.random.default_rng(seed)
    for name, parameter in model.named_parameters():
        if "norm" in name or name.endswith("bias"):
            parameter.data[...] = (name.endswith("weight") + 0.2
                                   * rng.standard_normal(parameter.shape))
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


@pytest.mark.parametrize("name", ["neox_attention", "neox_attention_quarter_nobias"])
def test_the_attention_layer_agrees_with_hugging_faces(name):
    """NeoXAttention against HF's GPTNeoXAttention alone (its rotary tables, a causal mask):
    output, input gradient, query_key_value and dense gradients; full finite differences on
    the float64 case."""
    assert_fixture_agrees(name)


def test_the_float64_fixtures_are_true_float64():
    """HF computes RoPE's tables and the eager softmax in float32 even in a float64 model;
    the float64 fixtures patch those (their meta says so), and numpy_tf agrees with them far
    below float32's 1e-7: logits, loss and every gradient within 1e-13 of their largest
    |value|."""
    for name in FIXTURES:
        case = Case.load(fixtures_dir() / f"{name}_float64.npz")
        assert "float32 islands patched to float64" in case.meta["conventions"]["float64"]
        model = interop.from_hf(case.meta["config"], case.section("param"))
        padding = case.arrays.get("input/key_padding_mask")
        loss, cache = NextTokenLoss(model).forward(case.arrays["input/ids"], padding)
        NextTokenLoss(model).backward(1.0, cache)
        expected = case.arrays["output/logits"]
        assert np.abs(cache.logits - expected).max() < 1e-13 * np.abs(expected).max()
        assert abs(float(loss) - float(case.arrays["loss"])) < 1e-13 * float(case.arrays["loss"])
        grads = interop.to_hf(model, case.meta["config"], grads=True)
        for key, want in case.section("grad").items():
            assert np.abs(grads[key] - want).max() <= 1e-13 * np.abs(want).max(), key


# -- partial rotary -------------------------------------------------------------------------------
def _x(seed, shape=(2, 3, 5, 8)):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("rotary_dim", [2, 4, 6, 8])
@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rope_rotates_the_first_features_and_passes_the_rest(rotary_dim, interleaved):
    x = _x(rotary_dim)
    positions = np.array([3, 0, 7, 1, 12])
    out, _ = partial_rope_forward(x, positions, rotary_dim, 50.0, interleaved)
    alone, _ = rope_forward(np.ascontiguousarray(x[..., :rotary_dim]), positions, 50.0,
                            interleaved)
    np.testing.assert_array_equal(out[..., :rotary_dim], alone)
    np.testing.assert_array_equal(out[..., rotary_dim:], x[..., rotary_dim:])
    if rotary_dim == 8:                         # the whole head: RoPE itself
        np.testing.assert_array_equal(out, rope_forward(x, positions, 50.0, interleaved)[0])


def test_partial_rope_uses_the_rotary_width_in_its_frequencies():
    """omega_i = base^(-2i/R): with R = 4 of 8 features, pair 1 (features 1 and 3) turns by
    p / sqrt(base), not by p / base^(1/4) as an 8-wide head's pair 1 would."""
    x = np.zeros((1, 1, 1, 8))
    x[..., 1] = 1.0
    out, _ = partial_rope_forward(x, np.array([2]), 4, 100.0)
    angle = 2 / 10.0
    np.testing.assert_allclose(out[0, 0, 0, [1, 3]], [np.cos(angle), np.sin(angle)],
                               rtol=1e-15)


@settings(max_examples=15, deadline=None)
@given(rotary_half=st.integers(1, 4), per_batch=st.booleans(), interleaved=st.booleans(),
       seed=st.integers(0, 2**16))
def test_partial_rope_gradient_by_finite_differences(rotary_half, per_batch, interleaved, seed):
    """Full central differences with a random upstream gradient (gradcheck draws it)."""
    positions = np.random.default_rng(seed + 1).integers(0, 20, (2, 4) if per_batch else (4,))
    inputs = {"x": _x(seed, (2, 2, 4, 8)), "positions": positions,
              "rotary_dim": 2 * rotary_half, "base": 30.0, "interleaved": interleaved}
    report = gradcheck(partial_rope_forward, partial_rope_backward, inputs, seed=seed)
    assert report.passed, str(report)
    assert [row.name for row in report.rows] == ["x"]


def test_partial_rope_keeps_float32_and_mutates_nothing():
    x = _x(3).astype(np.float32)
    saved = x.copy()
    out, cache = partial_rope_forward(x, np.arange(5), 4)
    dout = random_like(np.random.default_rng(0), out)
    dx = partial_rope_backward(dout, cache)
    assert out.dtype == dx.dtype == np.float32 and cache.rope.cos.dtype == np.float32
    np.testing.assert_array_equal(x, saved)
    np.testing.assert_array_equal(partial_rope_backward(dout, cache), dx)


@pytest.mark.parametrize("rotary_dim, message", [
    (3, "rotary_dim must be even .rotations act on pairs of features.; got 3"),
    (0, "rotary_dim must be a positive integer"),
    (10, r"rotary_dim \(10\) must be at most x's head_dim \(8\)")])
def test_partial_rope_bad_rotary_dim(rotary_dim, message):
    with pytest.raises(ValueError, match=message):
        partial_rope_forward(_x(0), np.arange(5), rotary_dim)


# -- the per-head fused qkv ------------------------------------------------------------------------
def test_query_key_value_is_grouped_per_head():
    """With every feature rotated, NeoXAttention is MultiHeadAttention (halves RoPE) whose
    q_proj, k_proj and v_proj are the per-head slices [q_h | k_h | v_h] of query_key_value,
    forward and backward; the fused gradient is their gradients put back per head."""
    width, heads, d = 12, 3, 4
    neox = NeoXAttention(width, heads, rotary_dim=d, rope_base=50.0, rng=1)
    for parameter in neox.parameters():
        parameter.data[...] = np.random.default_rng(2).standard_normal(parameter.shape)
    mha = MultiHeadAttention(width, heads, bias=True, rope=True, rope_base=50.0)
    per_head = neox.query_key_value.weight.data.reshape(heads, 3, d, width)
    bias = neox.query_key_value.bias.data.reshape(heads, 3, d)
    for index, projection in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
        projection.weight.data[...] = per_head[:, index].reshape(width, width)
        projection.bias.data[...] = bias[:, index].reshape(width)
    mha.o_proj.weight.data[...] = neox.dense.weight.data
    mha.o_proj.bias.data[...] = neox.dense.bias.data
    x = np.random.default_rng(3).standard_normal((2, 5, width))
    y, cache = neox.forward(x)
    expected, mha_cache = mha.forward(x, is_causal=True)
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-14)
    dy = random_like(np.random.default_rng(4), y)
    np.testing.assert_allclose(neox.backward(dy, cache), mha.backward(dy, mha_cache),
                               rtol=1e-12, atol=1e-13)
    joined = np.stack([p.weight.grad.reshape(heads, d, width)
                       for p in (mha.q_proj, mha.k_proj, mha.v_proj)], axis=1)
    np.testing.assert_allclose(neox.query_key_value.weight.grad,
                               joined.reshape(3 * width, width), rtol=1e-12, atol=1e-13)


# -- gradients ------------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(parallel=st.booleans(), rotary_pct=st.sampled_from([0.25, 0.5, 1.0]),
       tied=st.booleans(), bias=st.booleans(), padded=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fast_gradient_check_over_every_parameter(parallel, rotary_pct, tied, bias, padded,
                                                  seed):
    config = _config(use_parallel_residual=parallel, rotary_pct=rotary_pct,
                     tie_word_embeddings=tied, attention_bias=bias)
    model = _spread_norms(GPTNeoX(config, rng=seed), seed)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 4:] = padded
    report = gradcheck_module(NextTokenLoss(model), _ids(seed, 2, 6), fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


@pytest.mark.parametrize("parallel", [True, False])
def test_full_finite_differences_of_one_layer(parallel):
    config = _config(use_parallel_residual=parallel, hidden_size=8, intermediate_size=6,
                     rotary_pct=0.5)
    layer = _spread_norms(NeoXLayer(config, rng=5), 5)
    x = np.random.default_rng(6).standard_normal((2, 4, 8))
    report = gradcheck_module(layer, x, seed=7)
    assert report.passed, str(report)
    assert len(report.rows) == 1 + 2 * 2 + 2 * 2 + 2 * 2     # x, norms, attention, mlp


def test_parallel_and_sequential_residuals_differ_as_written():
    """Parallel: y = x + attention(ln1(x)) + mlp(ln2(x)); sequential feeds ln2 with u = x +
    attention(ln1(x)). Checked against the layer's own sublayers, composed by hand."""
    x = np.random.default_rng(8).standard_normal((2, 5, 16))
    outputs = {}
    for parallel in (True, False):
        layer = _spread_norms(NeoXLayer(_config(use_parallel_residual=parallel), rng=9), 10)
        a = layer.attention.forward(layer.input_layernorm.forward(x)[0])[0]
        mlp_input = x if parallel else x + a
        f = layer.mlp.forward(layer.post_attention_layernorm.forward(mlp_input)[0])[0]
        outputs[parallel] = layer.forward(x)[0]
        np.testing.assert_allclose(outputs[parallel], x + a + f, rtol=1e-13, atol=1e-13)
    assert not np.allclose(outputs[True], outputs[False])


# -- tying, padding, the KV cache, causality ------------------------------------------------------
def test_tied_gradient_is_the_sum_of_the_two_untied_uses():
    tied = _spread_norms(GPTNeoX(_config(tie_word_embeddings=True), rng=11), 11)
    untied = GPTNeoX(_config(), rng=11)
    untied.load_state_dict(dict(tied.state_dict()))
    assert_tied_gradient_is_the_sum(tied, untied, _ids(12, 2, 7), "embed_in.weight",
                                    "embed_out.weight")
    assert count_parameters(untied) - count_parameters(tied) == 24 * 16


@pytest.mark.parametrize("parallel", [True, False])
def test_right_padding_changes_nothing_for_the_real_tokens(parallel):
    model = _spread_norms(GPTNeoX(_config(use_parallel_residual=parallel), rng=13), 13)
    assert_right_padding_changes_nothing(model, _ids(14, 1, 5), _ids(15, 1, 3))


def test_left_padding_with_explicit_positions():
    model = _spread_norms(GPTNeoX(_config(), rng=16), 16)
    real = _ids(17, 1, 5)
    padded = np.concatenate([_ids(18, 1, 3), real], axis=1)
    mask = np.array([[True] * 3 + [False] * 5])
    positions = np.maximum(np.cumsum(~mask, axis=1) - 1, 0)
    alone, _ = model.forward(real)
    shifted, _ = model.forward(padded, key_padding_mask=mask, positions=positions)
    np.testing.assert_allclose(shifted[:, 3:], alone, rtol=1e-12, atol=1e-13)


def test_rope_sees_only_relative_positions_and_does_rotate():
    model = _spread_norms(GPTNeoX(_config(), rng=19), 19)
    ids = _ids(20, 2, 6)
    at_zero, _ = model.forward(ids)
    at_forty, _ = model.forward(ids, positions=np.arange(40, 46))
    np.testing.assert_allclose(at_forty, at_zero, rtol=1e-11, atol=1e-12)
    reversed_positions, _ = model.forward(ids, positions=np.arange(6)[::-1].copy())
    assert not np.allclose(reversed_positions, at_zero)


@pytest.mark.parametrize("changes", [{}, {"use_parallel_residual": False, "rotary_pct": 1.0},
                                     {"num_attention_heads": 4, "rotary_pct": 0.5,
                                      "attention_bias": False}])
def test_cached_decoding_step_by_step_equals_the_full_forward(changes):
    model = _spread_norms(GPTNeoX(_config(**changes), rng=21), 21)
    ids = _ids(22, 2, 7)
    full, _ = model.forward(ids)
    logits, cache = model.forward(ids[:, :3])                   # a prompt, then one at a time
    steps = [logits]
    for t in range(3, 7):
        logits, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)
    heads = model.config.num_attention_heads
    assert [k.shape for k, _ in cache.present] == [(2, heads, 7, 16 // heads)] * 2


def test_generate_with_the_cache_equals_generate_without():
    model = _spread_norms(GPTNeoX(_config(), rng=23), 23)
    prompt = _ids(24, 2, 3)
    cached = generate(model, prompt, 5, rng=np.random.default_rng(0), use_cache=True)
    recomputed = generate(model, prompt, 5, rng=np.random.default_rng(0), use_cache=False)
    np.testing.assert_array_equal(cached, recomputed)
    assert cached.shape == (2, 8)


@settings(max_examples=10, deadline=None)
@given(length=st.integers(2, 6), data=st.data(), seed=st.integers(0, 2**16))
def test_causality_a_later_token_never_changes_an_earlier_logit(length, data, seed):
    model = GPTNeoX(_config(), rng=seed)
    ids = _ids(seed, 1, length)
    position = data.draw(st.integers(1, length - 1))
    changed = ids.copy()
    changed[0, position:] = (ids[0, position:] + 1) % 24
    a, _ = model.forward(ids)
    b, _ = model.forward(changed)
    np.testing.assert_array_equal(a[0, :position], b[0, :position])
    assert not np.array_equal(a[0, position], b[0, position])


# -- the config, the count, the names ------------------------------------------------------------
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True},
                                     {"attention_bias": False, "num_hidden_layers": 3}])
def test_parameter_count_from_the_shapes(changes):
    config = _config(**changes)
    assert config.num_parameters() == count_parameters(GPTNeoX(config)) \
        == account(config).total


def test_pythia_160m_is_counted_without_allocating():
    config = NeoXConfig.pythia_160m()
    assert (config.head_width, config.rotary_dim) == (64, 16)
    assert config.num_parameters() == account("pythia-160m").total == 162_322_944
    rows = {row.name: row.total for row in account("pythia-160m").rows}
    assert rows["lm_head"] == rows["gpt_neox.embed_in"] == 50304 * 768
    assert NeoXConfig.gpt_neox_20b().num_parameters() == account("gpt-neox-20b").total \
        == 20_554_567_680


def test_initialisation_follows_hugging_face():
    model = GPTNeoX(_config(initializer_range=0.02, hidden_size=64, intermediate_size=128),
                    rng=25)
    weight = model.layers[0].mlp.dense_h_to_4h.weight.data
    assert abs(weight.std() - 0.02) < 0.001 and abs(weight.mean()) < 0.001
    np.testing.assert_array_equal(model.layers[0].attention.query_key_value.bias.data, 0.0)
    np.testing.assert_array_equal(model.final_layer_norm.weight.data, 1.0)


def test_names_are_hugging_face_names_without_the_gpt_neox_prefix():
    names = list(GPTNeoX(_config(num_hidden_layers=1)).state_dict())
    layer = [f"layers.0.{module}.{p}" for module in (
        "input_layernorm", "post_attention_layernorm", "attention.query_key_value",
        "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h") for p in ("weight", "bias")]
    assert names == ["embed_in.weight", *layer, "final_layer_norm.weight",
                     "final_layer_norm.bias", "embed_out.weight"]


def test_contract():
    check_contract(lambda dtype: GPTNeoX(_config(tie_word_embeddings=True), dtype=dtype),
                   (_ids(26, 2, 5),))


@pytest.mark.parametrize("changes, message", [
    ({"rotary_pct": 0.375}, r"rotary_pct 0.375 of the head width 8 gives rotary_dim "
                            r"int\(8 \* 0.375\) = 3: RoPE needs a positive even number"),
    ({"rotary_pct": 0.1}, r"gives rotary_dim int\(8 \* 0.1\) = 0"),
    ({"rotary_pct": 0.0}, r"rotary_pct must be a number in \(0, 1\]"),
    ({"rotary_pct": 1.5}, r"rotary_pct must be a number in \(0, 1\]"),
    ({"num_attention_heads": 3}, r"hidden_size \(16\) must be divisible by num_attention_heads \(3\)"),
    ({"hidden_act": "swish"}, "hidden_act must be one of"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
])
def test_bad_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _config(**changes)


def test_bad_input():
    model = GPTNeoX(_config())
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 4] = 24
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 24\); got 24 at "
                                         r"position \(1, 4\)"):
        model.forward(ids)
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(3,\) or "
                                         r"\(B, T\) = \(1, 3\) to match ids; got \(4,\)"):
        model.forward(np.zeros((1, 3), dtype=np.int64), positions=np.arange(4))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, P \+ T\) = "
                                         r"\(1, 3\) .*; got \(3, 1\)"):
        model.forward(np.zeros((1, 3), dtype=np.int64),
                      key_padding_mask=np.zeros((3, 1), dtype=bool))
    _, cache = model.forward(np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"past_kv must hold one \(k, v\) per layer \(2\), each "
                                         r"of shape \(B, H, P, d\) = \(1, 2, 3, 8\)"):
        model.forward(np.zeros((1, 1), dtype=np.int64), past_kv=cache.present[:1])
    with pytest.raises(ValueError, match=r"past_kv must hold one \(k, v\) per layer \(2\)"):
        model.forward(np.zeros((1, 1), dtype=np.int64), past_kv=[])
    with pytest.raises(ValueError, match=r"each of shape \(B, H, P, d\) = \(1, 2, 3, 8\)"):
        model.forward(np.zeros((1, 1), dtype=np.int64),
                      past_kv=[cache.present[0], (cache.present[1][0][:, :1],) * 2])
    with pytest.raises(ValueError, match=r"\(B, P \+ T\) = \(1, 4\) \(the cached and the new"):
        model.forward(np.zeros((1, 1), dtype=np.int64), past_kv=cache.present,
                      key_padding_mask=np.zeros((1, 1), dtype=bool))
    with pytest.raises(TypeError, match="config must be a NeoXConfig"):
        GPTNeoX({"vocab_size": 24})
    with pytest.raises(ValueError, match=r"rotary_dim \(10\) must be at most the head width"):
        NeoXAttention(16, 2, rotary_dim=10)


# -- interop with Hugging Face's names -----------------------------------------------------------
@pytest.mark.parametrize("name", ["neox_parallel_float64", "neox_full_rotary_tied_float32",
                                  "neox_no_bias_padded_float64"])
def test_load_then_export_is_bit_exact(name):
    assert_hf_round_trip_is_bit_exact(*_case(name), name.split("_")[-1])


def test_the_head_is_read_under_either_name():
    """transformers 5 says lm_head.weight, every Pythia checkpoint embed_out.weight: either
    is read, both when equal; export writes lm_head.weight."""
    config, state = _case("neox_parallel_float64")
    head = state["lm_head.weight"]
    hub = {("embed_out.weight" if k == "lm_head.weight" else k): v for k, v in state.items()}
    model = interop.from_hf(config, hub)
    np.testing.assert_array_equal(model.embed_out.weight.data, head)
    exported = interop.to_hf(model, config)
    assert "embed_out.weight" not in exported and list(exported) == list(state)
    interop.from_hf(config, dict(state, **{"embed_out.weight": head}))
    with pytest.raises(ValueError, match="embed_out.weight must equal lm_head.weight"):
        interop.from_hf(config, dict(state, **{"embed_out.weight": head + 1.0}))
    with pytest.raises(ValueError, match="missing keys: lm_head.weight"):
        interop.from_hf(config, {k: v for k, v in state.items() if k != "lm_head.weight"})


def test_tied_head_may_be_left_out_but_not_contradicted():
    config, state = _case("neox_full_rotary_tied_float64")
    model = interop.from_hf(config, {k: v for k, v in state.items() if k != "lm_head.weight"})
    assert model.embed_out.weight is model.embed_in.weight
    contradicting = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1.0})
    with pytest.raises(ValueError, match="lm_head.weight must equal gpt_neox.embed_in.weight"):
        interop.from_hf(config, contradicting)


def test_gradients_in_hf_layout():
    config, state = _case("neox_parallel_float64")
    model = interop.from_hf(config, state)
    qkv = model.layers[1].attention.query_key_value.weight
    qkv.grad[:] = np.arange(qkv.data.size).reshape(qkv.data.shape)
    grads = interop.to_hf(model, config, grads=True)
    np.testing.assert_array_equal(
        grads["gpt_neox.layers.1.attention.query_key_value.weight"], qkv.grad)
    assert list(grads) == list(state)


def test_older_configs_and_buffers_are_read():
    """Before transformers 5: rotary_pct and rotary_emb_base at the top level, no
    rope_parameters, and the attention buffers and inv_freq in the state_dict."""
    config, state = _case("neox_sequential_float64")
    old = {k: v for k, v in config.items() if k != "rope_parameters"}
    old.update(rotary_pct=0.5, rotary_emb_base=100, rope_scaling=None)
    buffers = {"gpt_neox.layers.0.attention.bias": np.ones((1, 1, 4, 4)),
               "gpt_neox.layers.0.attention.masked_bias": np.array(-1e9),
               "gpt_neox.layers.0.attention.rotary_emb.inv_freq": np.ones(2)}
    model = interop.from_hf(old, dict(state, **buffers))
    c = model.config
    assert (c.rotary_pct, c.rope_theta, c.rotary_dim, c.use_parallel_residual) == \
        (0.5, 100.0, 4, False)
    defaults = {k: v for k, v in old.items() if k not in ("rotary_pct", "rotary_emb_base")}
    assert interop.config_from_hf(defaults).rotary_pct == 0.25        # HF's defaults
    assert interop.config_from_hf(defaults).rope_theta == 10000.0


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                          "partial_rotary_factor": 0.25}},
     "rope_parameters has rope_type 'linear': scaled RoPE is not implemented"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling has rope_type "
                                                           "'dynamic'"),
    ({"rotary_pct": 0.5}, r"rotary_pct \(0.5\) and rope_parameters' partial_rotary_factor "
                          r"\(0.25\) disagree"),
    ({"rotary_emb_base": 77}, r"rotary_emb_base \(77\) and rope_parameters' rope_theta"),
    ({"hidden_act": "gelu_fast"}, "hidden_act 'gelu_fast' is not implemented"),
    ({"head_dim": 4}, r"head_dim=4 is not implemented: GPT-NeoX's heads are hidden_size / "
                      r"num_attention_heads = 16 / 2 wide"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.375}}, r"gives rotary_dim int\(8 \* "
                                                            r"0.375\) = 3"),
    ({"num_attention_heads": 3}, r"hidden_size \(16\) must be divisible by "
                                 r"num_attention_heads \(3\)"),
])
def test_unsupported_configs_are_refused(changes, message):
    config, state = _case("neox_parallel_float64")
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(config, **changes), state)


@pytest.mark.torch
def test_readme_example_with_a_live_pythia_shaped_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPTNeoXConfig(vocab_size=40, hidden_size=24, intermediate_size=40,
                                        num_hidden_layers=2, num_attention_heads=3,
                                        rotary_pct=0.25, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.GPTNeoXForCausalLM(config).eval()        # float32, as HF ships it
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = interop.from_hf(config.to_dict(), state, dtype=np.float32)
    ids = np.array([[1, 5, 7, 2, 9, 33]])
    logits, _ = model.forward(ids)
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.torch
@pytest.mark.parametrize("name, total", [("pythia-160m", 162_322_944),
                                         ("gpt-neox-20b", 20_554_567_680)])
def test_the_presets_totals_equal_hf_on_the_meta_device(name, total):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = {k: v for k, v in load_config(name).items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**hf_config))
    assert sum(p.numel() for p in model.parameters()) == total == account(name).total
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.25


@pytest.mark.torch
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True},
                                     {"attention_bias": False, "num_hidden_layers": 3}])
def test_formula_equals_hf_gpt_neox_row_by_row(changes, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_accounting import assert_rows_match

    config = transformers.GPTNeoXConfig(**{
        "vocab_size": 41, "hidden_size": 16, "intermediate_size": 28, "num_hidden_layers": 2,
        "num_attention_heads": 4, **changes})
    model = transformers.GPTNeoXForCausalLM(config)
    assert_rows_match(account(config.to_dict()),
                      [(n, p.numel()) for n, p in model.named_parameters()])
    config.to_json_file(tmp_path / "config.json")           # as saved: defaults left out
    assert account(str(tmp_path / "config.json")).total == model.num_parameters()


@pytest.mark.torch
@pytest.mark.parametrize("overrides, pad", [({}, 0), ({"use_parallel_residual": False,
                                                       "rotary_pct": 1.0}, 2)])
def test_an_exported_case_is_hugging_faces_numbers(overrides, pad):
    """`numpy-tf export --model neox` against HF's GPTNeoXForCausalLM loaded with the case's
    weights (float64, HF's float32 islands patched as the fixtures patch them): logits, loss
    and every gradient, in HF's names and layout."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reference"))
    from neox import float64_faithful
    from numpy_tf.checking.export import export_case
    from numpy_tf.models import registry

    case = export_case("neox", overrides=overrides, seed=4, pad=pad)
    config = NeoXConfig(**case.meta["config"])
    hf_config = registry.FAMILIES["neox"].hf_config(config)
    model = GPTNeoX(config)
    model.load_state_dict(case.section("param"))
    for name, parameter in model.named_parameters():
        parameter.grad[...] = case.arrays[f"grad/{name}"]
    hf = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**{
        k: v for k, v in hf_config.items() if k != "model_type"})).double().eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in
                        interop.to_hf(model, hf_config).items()})
    ids = torch.from_numpy(case.arrays["input/ids"])
    padding = case.arrays.get("input/key_padding_mask")
    mask = None if padding is None else torch.from_numpy((~padding).astype(np.int64))
    with float64_faithful():
        logits = hf(input_ids=ids, attention_mask=mask).logits
    labels = ids.clone()
    if mask is not None:
        labels[mask == 0] = -100
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1))
    loss.backward()
    expected = logits.detach().numpy()
    assert np.abs(case.arrays["output/logits"] - expected).max() < 1e-13 * np.abs(expected).max()
    assert abs(float(case.arrays["loss"]) - loss.item()) < 1e-13 * loss.item()
    grads = interop.to_hf(model, hf_config, grads=True)
    for name, parameter in hf.named_parameters():
        want = parameter.grad.numpy()
        assert np.abs(grads[name] - want).max() <= 1e-13 * np.abs(want).max(), name
