"""Gemma and Gemma2: the new layers (Gemma's RMSNorm with 1 + w, GeGLU, soft-capping, soft-capped
attention scores) by finite differences and on both paths, the models against HF
GemmaForCausalLM / Gemma2ForCausalLM (float64 with HF's float32 islands patched, and float32),
HF's own cached decoding past the window, the interop, the presets' counts, the embedding scale's
rounding, and the refusals."""
import numpy as np
import pytest
from contract import (assert_cached_decoding_equals_the_full_forward, assert_fixture_agrees,
                      assert_hf_round_trip_is_bit_exact,
                      assert_right_padding_changes_nothing, assert_tied_gradient_is_the_sum,
                      check_contract)
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_tf import RMSNorm, SwiGLU, gradcheck, gradcheck_module, interop, reference_path
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.kernels.attention import attention_backward_into
from numpy_tf.layers.attention import attention_backward, attention_forward
from numpy_tf.layers.mlp import swiglu_backward, swiglu_forward
from numpy_tf.layers.norm import rmsnorm_backward, rmsnorm_forward
from numpy_tf.layers.softcap import SoftCap, softcap_backward, softcap_forward
from numpy_tf.models.accounting import account, count_parameters, gemma_hf_config
from numpy_tf.models.gemma import Gemma, GemmaConfig, alternating_layer_types
from numpy_tf.models.objectives import NextTokenLoss
from numpy_tf.models.registry import PRESETS

FIXTURES = ["gemma_gqa_tied", "gemma_mha_biases_untied_padded", "gemma2_window_softcaps",
            "gemma2_nocaps_untied_padded", "gemma2_decoding"]


# -- soft-capping -------------------------------------------------------------------------------
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       cap=st.sampled_from([0.5, 3.0, 30.0]), scale=st.sampled_from([0.3, 5.0, 40.0]),
       seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_softcap_finite_differences(shape, cap, scale, seed):
    x = scale * np.random.default_rng(seed).standard_normal(shape)
    report = gradcheck(softcap_forward, softcap_backward, {"x": x, "cap": cap}, seed=seed + 1)
    assert report.passed, str(report)


def test_softcap_values_bounds_and_dtype():
    x = np.array([-1e4, -30.0, -1e-3, 0.0, 1e-3, 30.0, 1e4])
    y, _ = softcap_forward(x, 30.0)
    np.testing.assert_allclose(y, 30.0 * np.tanh(x / 30.0), rtol=0, atol=0)
    assert np.all(np.abs(y) <= 30.0) and y[3] == 0.0
    np.testing.assert_allclose(y[2], -1e-3, rtol=1e-9)         # near zero: the identity
    y32, cache = softcap_forward(x.astype(np.float32), 30.0)
    assert y32.dtype == np.float32
    assert softcap_backward(np.ones(7, np.float32), cache).dtype == np.float32


def test_softcap_contract():
    check_contract(lambda dtype: SoftCap(2.5, dtype=dtype),
                   (np.random.default_rng(1).standard_normal((2, 3, 4)) * 4,), seed=2)


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), float("nan"), True, "30"])
def test_bad_caps_are_refused(cap):
    with pytest.raises(ValueError, match="cap(ping)? must be a finite number > 0"):
        SoftCap(cap)
    with pytest.raises(ValueError, match="cap(ping)? must be a finite number > 0"):
        GemmaConfig(final_logit_softcapping=cap)
    with pytest.raises(ValueError, match="cap(ping)? must be a finite number > 0"):
        attention_forward(*_qkv(0), softcap=cap)


def _qkv(seed, groups=2, tq=5, tk=5, dtype=np.float64, scale=1.5):
    rng = np.random.default_rng(seed)
    return tuple((scale * rng.standard_normal(shape)).astype(dtype) for shape in
                 ((2, 4, tq, 3), (2, groups, tk, 3), (2, groups, tk, 3)))


@pytest.mark.parametrize("cap", [0.5, 2.0, 50.0])
@pytest.mark.parametrize("window", [None, 2])
def test_soft_capped_attention_finite_differences(cap, window):
    q, k, v = _qkv(int(cap * 10))
    report = gradcheck(lambda q, k, v: attention_forward(q, k, v, is_causal=True, scale=0.4,
                                                         window=window, softcap=cap),
                       attention_backward, (q, k, v), seed=3)
    assert report.passed, str(report)


def test_a_soft_cap_bends_the_scores_and_a_large_one_does_not():
    q, k, v = _qkv(4, scale=3.0)
    plain, plain_cache = attention_forward(q, k, v, is_causal=True)
    huge, _ = attention_forward(q, k, v, is_causal=True, softcap=1e6)
    np.testing.assert_allclose(huge, plain, rtol=1e-9, atol=1e-12)
    capped, cache = attention_forward(q, k, v, is_causal=True, softcap=1.0)
    assert not np.allclose(capped, plain)
    scores = np.log(np.where(cache.probs > 0, cache.probs, 1.0))   # log P = S - logsumexp
    spread = np.nanmax(np.where(cache.probs > 0, scores, np.nan), axis=-1) - \
        np.nanmin(np.where(cache.probs > 0, scores, np.nan), axis=-1)
    assert np.all(spread <= 2.0 + 1e-12)                            # |S| < 1 on every row


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_kernel_backward_equals_the_reference_with_a_soft_cap(dtype):
    q, k, v = _qkv(5, tq=4, tk=7, dtype=dtype)
    out, cache = attention_forward(q, k, v, is_causal=True, causal_offset=3, window=3,
                                   softcap=2.0)
    dout = np.random.default_rng(6).standard_normal(out.shape).astype(dtype)
    reference = attention_backward(dout, cache)
    kernel = attention_backward_into(dout, *cache)
    for a, b in zip(kernel, reference):
        assert a.dtype == dtype
        assert np.abs(a - b).max() <= 128 * np.finfo(dtype).eps * max(1.0, np.abs(b).max())


# -- Gemma's RMSNorm and GeGLU ------------------------------------------------------------------
@given(lead=st.lists(st.integers(1, 3), max_size=2), width=st.sampled_from([1, 3, 8]),
       seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_unit_offset_rmsnorm_finite_differences(lead, width, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((*lead, width)), "weight": rng.standard_normal(width),
              "eps": 1e-6, "unit_offset": True}
    report = gradcheck(rmsnorm_forward, rmsnorm_backward, inputs, seed=seed + 1)
    assert report.passed, str(report)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unit_offset_rmsnorm_is_one_plus_w_on_both_paths(dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 6)).astype(dtype)
    norm = RMSNorm(6, 1e-6, dtype=dtype, unit_offset=True)
    assert not norm.weight.data.any()                  # HF's GemmaRMSNorm starts at zeros
    norm.weight.data[...] = rng.standard_normal(6)
    plain, _ = rmsnorm_forward(x, (1.0 + norm.weight.data).astype(dtype), 1e-6)
    dout = rng.standard_normal(x.shape).astype(dtype)
    results = []
    for reference in (True, False):
        norm.zero_grad()
        if reference:
            with reference_path():
                out, cache = norm.forward(x)
        else:
            out, cache = norm.forward(x)
        dx = norm.backward(dout, cache)
        assert out.dtype == dx.dtype == norm.weight.grad.dtype == dtype
        results.append((out, dx, norm.weight.grad.copy()))
    ulps = 32 * np.finfo(dtype).eps
    for out, dx, dweight in results:
        np.testing.assert_allclose(out, plain, rtol=0, atol=ulps * np.abs(plain).max())
    for a, b in zip(results[0], results[1]):
        np.testing.assert_allclose(a, b, rtol=0, atol=ulps * max(1.0, np.abs(b).max()))
    check_contract(lambda dtype: RMSNorm(6, 1e-6, dtype=dtype, unit_offset=True),
                   (rng.standard_normal((2, 3, 6)),), seed=8)


@given(bias=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=10, deadline=None)
def test_geglu_finite_differences(bias, seed):
    rng = np.random.default_rng(seed)
    width, hidden = 4, 5
    inputs = {"x": 2.0 * rng.standard_normal((2, 3, width)),
              "gate_weight": rng.standard_normal((hidden, width)),
              "up_weight": rng.standard_normal((hidden, width)),
              "down_weight": rng.standard_normal((width, hidden)),
              "gate_bias": rng.standard_normal(hidden) if bias else None,
              "up_bias": rng.standard_normal(hidden) if bias else None,
              "down_bias": rng.standard_normal(width) if bias else None,
              "activation": "gelu_tanh"}
    report = gradcheck(swiglu_forward, swiglu_backward, inputs, seed=seed + 1)
    assert report.passed, str(report)


def test_geglu_gates_with_the_tanh_gelu():
    from numpy_tf.layers.activations import gelu_forward

    layer = SwiGLU(4, 6, activation="gelu_tanh", rng=9)
    x = np.random.default_rng(10).standard_normal((3, 4))
    gate = x @ layer.gate_proj.weight.data.T
    expected = (gelu_forward(gate, "tanh")[0] * (x @ layer.up_proj.weight.data.T)) \
        @ layer.down_proj.weight.data.T
    np.testing.assert_allclose(layer.forward(x)[0], expected, rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="activation must be one of 'silu', 'gelu_tanh'"):
        SwiGLU(4, 6, activation="gelu")


# -- the models ---------------------------------------------------------------------------------
def _spread(model, seed):
    rng = np.random.default_rng(seed)
    for parameter in model.parameters():
        parameter.data[...] = 0.3 * rng.standard_normal(parameter.shape)
    return model


def _gemma2(**changes):
    base = dict(vocab_size=24, hidden_size=16, intermediate_size=14, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0,
                model_type="gemma2", query_pre_attn_scalar=5, attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0, sliding_window=2,
                layer_types=alternating_layer_types(3))
    return GemmaConfig(**{**base, **changes})


@given(gemma2=st.booleans(), tied=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 2**16))
@settings(max_examples=10, deadline=None)
def test_fast_gradient_check_of_every_parameter(gemma2, tied, bias, seed):
    config = _gemma2(tie_word_embeddings=tied, attention_bias=bias)
    if not gemma2:
        config = GemmaConfig(vocab_size=24, hidden_size=16, num_attention_heads=4,
                             tie_word_embeddings=tied, attention_bias=bias)
    model = _spread(Gemma(config, rng=seed), seed)
    ids = np.random.default_rng(seed).integers(0, 24, (2, 6))
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 5:] = True
    report = gradcheck_module(NextTokenLoss(model), ids, fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


@pytest.mark.parametrize("name", ["softcap", "gemma_rmsnorm", "geglu"])
def test_the_new_layers_agree_with_torch_and_hugging_face(name):
    """c tanh(x / c) in torch; HF's GemmaRMSNorm and GemmaMLP themselves (every gradient)."""
    assert_fixture_agrees(name)


@pytest.mark.parametrize("name", FIXTURES)
def test_agrees_with_hugging_face(name):
    """Logits, loss and every gradient in HF's layout, float64 (islands patched) and
    float32; the decoding case: numpy_tf's cached decoding equals HF's (DynamicCache with
    sliding layers), past the window."""
    assert_fixture_agrees(name)


@pytest.mark.parametrize("name", FIXTURES[:4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_load_then_export_is_bit_exact(name, dtype):
    case = Case.load(fixtures_dir() / f"{name}_{dtype}.npz")
    assert_hf_round_trip_is_bit_exact(case.meta["config"], case.section("param"), dtype)


def test_the_fixtures_test_what_they_should():
    """Gemma2's case has sliding, full and sliding layers with both caps; its logits move far
    without the caps or without the window; its float64 scale is float64's sqrt(24)."""
    case = Case.load(fixtures_dir() / "gemma2_window_softcaps_float64.npz")
    config, state, ids = case.meta["config"], case.section("param"), case.arrays["input/ids"]
    model = interop.from_hf(config, state)
    assert [model.config.layer_window(i) for i in range(3)] == [3, None, 3]
    expected = case.arrays["output/logits"]
    assert np.abs(expected).max() < 3.0                      # the final cap is 3
    for changes in ({"final_logit_softcapping": None}, {"attn_logit_softcapping": None},
                    {"layer_types": ["full_attention"] * 3}, {"query_pre_attn_scalar": 6}):
        logits, _ = interop.from_hf(dict(config, **changes), state).forward(ids)
        assert np.abs(logits - expected).max() > 1e-4, changes
    assert model.normalizer == np.float64(24 ** 0.5)
    rounded = Gemma(model.config, dtype=np.float32).normalizer
    assert rounded.dtype == np.float32 and float(rounded) != 24 ** 0.5


def test_the_float32_embedding_scale_is_hugging_faces():
    """HF multiplies by torch.tensor(hidden_size ** 0.5) in float32: the float32 rounding of
    sqrt(24), which the float32 fixtures hold through every logit."""
    case = Case.load(fixtures_dir() / "gemma_gqa_tied_float32.npz")
    model = interop.from_hf(case.meta["config"], case.section("param"), np.float32)
    assert model.normalizer == np.float32(24 ** 0.5)


def test_hf_cached_decoding_equals_our_full_forward():
    for dtype, bound in (("float64", 1e-12), ("float32", 1e-5)):
        case = Case.load(fixtures_dir() / f"gemma2_decoding_{dtype}.npz")
        model = interop.from_hf(case.meta["config"], case.section("param"), case.dtype)
        full, _ = model.forward(case.arrays["input/ids"])
        expected = case.arrays["output/logits"]
        assert np.abs(full - expected).max() <= bound * np.abs(expected).max()


def test_full_finite_differences_of_one_gemma2_block():
    from numpy_tf.models.gemma import Gemma2DecoderLayer

    block = _spread(Gemma2DecoderLayer(_gemma2(attention_bias=True, intermediate_size=5),
                                       0, rng=16), 16)
    x = np.random.default_rng(17).standard_normal((2, 4, 16))
    report = gradcheck_module(block, x, seed=18)
    assert report.passed, str(report)
    assert len(report.rows) == 1 + 4 * 2 + 3 + 4              # x, projections, MLP, norms


@pytest.mark.parametrize("window", [1, 2, 4])
def test_cached_decoding_past_the_window_equals_the_full_forward(window):
    model = _spread(Gemma(_gemma2(sliding_window=window), rng=11), 11)
    ids = np.random.default_rng(12).integers(0, 24, (2, 8))
    assert_cached_decoding_equals_the_full_forward(model, ids, 2)


def test_tied_gradient_is_the_sum_and_padding_changes_nothing():
    tied = _spread(Gemma(_gemma2(), rng=13), 13)
    untied = Gemma(_gemma2(tie_word_embeddings=False), rng=13)
    untied.load_state_dict({**tied.state_dict(),
                            "lm_head.weight": tied.state_dict()["embed_tokens.weight"].copy()})
    ids = np.random.default_rng(14).integers(0, 24, (2, 6))
    assert_tied_gradient_is_the_sum(tied, untied, ids, "embed_tokens.weight", "lm_head.weight")
    real = np.random.default_rng(15).integers(1, 24, (1, 5))
    assert_right_padding_changes_nothing(tied, real, np.zeros((1, 1), dtype=np.int64))


def test_presets_are_counted_exactly():
    """Gemma-2B 2,506,172,416 and Gemma-2-2B 2,614,341,888: HF's models built on the meta device
    from the same shapes, summed."""
    assert PRESETS["gemma-2b"].config.num_parameters() == 2_506_172_416
    assert PRESETS["gemma-2-2b"].config.num_parameters() == 2_614_341_888
    assert account("gemma-2b").total == 2_506_172_416
    assert account("gemma-2-2b").total == 2_614_341_888
    small = _gemma2()
    assert count_parameters(Gemma(small)) == small.num_parameters()
    assert interop.config_from_hf(gemma_hf_config(small)) == \
        GemmaConfig(**{**small.to_dict(), "head_dim": 4})


@pytest.mark.parametrize("changes, message", [
    ({"sliding_window": 0}, "sliding_window must be None or a positive int"),
    ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be a finite number > 0"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a finite number > 0"),
    ({"layer_types": ["full_attention"]}, "layer_types must name one type per layer"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "layer_types' entries must be one of"),
    ({"sliding_window": None}, "layer_types has sliding_attention layers but sliding_window"),
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not implemented"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "rope_type 'linear'"),
    ({"head_dim": 5}, "head_dim must be even"),
])
def test_unsupported_or_bad_configs_are_refused(changes, message):
    case = Case.load(fixtures_dir() / "gemma2_window_softcaps_float64.npz")
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(case.meta["config"], **changes), case.section("param"))


def test_gemma_refuses_gemma2_options():
    case = Case.load(fixtures_dir() / "gemma_gqa_tied_float64.npz")
    with pytest.raises(ValueError, match="sliding_window=4 is not a Gemma option"):
        interop.from_hf(dict(case.meta["config"], sliding_window=4), case.section("param"))
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not implemented"):
        interop.from_hf(dict(case.meta["config"], hidden_act="gelu"), case.section("param"))
