"""Sliding-window attention and Mistral (a Llama with LlamaConfig(sliding_window=W)): the mask's
meaning, finite differences, the kernel backward, KV-cache decoding past the window, agreement
with HF MistralForCausalLM (full forward, padding, HF's own cached decoding), the interop, the
preset's count and the refusals."""
from dataclasses import replace

import numpy as np
import pytest
from contract import (assert_cached_decoding_equals_the_full_forward, assert_fixture_agrees,
                      assert_hf_round_trip_is_bit_exact)
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_tf import gradcheck, gradcheck_module, interop, reference_path
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.kernels.attention import attention_backward_into
from numpy_tf.layers.attention import (attention_backward, attention_forward,
                                       sliding_window_mask)
from numpy_tf.layers.multihead import MultiHeadAttention
from numpy_tf.models.llama import Llama, LlamaConfig
from numpy_tf.models.objectives import NextTokenLoss
from numpy_tf.models.registry import PRESETS

FIXTURES = ["mistral_window", "mistral_window_tied_padded", "mistral_decoding"]


def _qkv(seed, batch=2, heads=4, groups=2, tq=6, tk=6, width=3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in
                 ((batch, heads, tq, width), (batch, groups, tk, width),
                  (batch, groups, tk, width)))


# -- the mask's meaning -------------------------------------------------------------------------
@given(tq=st.integers(1, 7), past=st.integers(0, 6), window=st.integers(1, 9))
@settings(max_examples=60, deadline=None)
def test_a_query_sees_the_window_most_recent_keys_its_own_included(tq, past, window):
    """Query i (absolute position i + P) sees key j iff 0 <= i + P - j < W: HF's
    `kv_idx > q_idx - sliding_window` with the causal mask, counted from the positions."""
    tk = past + tq
    blocked = sliding_window_mask(tq, tk, window, past)
    for i in range(tq):
        for j in range(tk):
            assert blocked[i, j] == (i + past - j >= window)
    q, k, v = _qkv(1, tq=tq, tk=tk)
    _, cache = attention_forward(q, k, v, is_causal=True, causal_offset=past, window=window)
    seen = cache.probs > 0
    for i in range(tq):
        expected = [0 <= i + past - j < window for j in range(tk)]
        assert (seen[:, :, i] == np.array(expected)).all()


def test_a_window_at_least_the_length_changes_nothing():
    q, k, v = _qkv(2)
    full, _ = attention_forward(q, k, v, is_causal=True)
    for window in (6, 7, 100):
        out, _ = attention_forward(q, k, v, is_causal=True, window=window)
        np.testing.assert_array_equal(out, full)
    narrow, _ = attention_forward(q, k, v, is_causal=True, window=5)
    assert not np.allclose(narrow, full)


def test_window_one_sees_only_its_own_key():
    q, k, v = _qkv(3, heads=2, groups=2)
    out, _ = attention_forward(q, k, v, is_causal=True, window=1)
    np.testing.assert_array_equal(out, v)


# -- gradients: finite differences and the kernel ----------------------------------------------
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("window", [1, 2, 4])
def test_finite_differences_with_a_window(groups, window):
    q, k, v = _qkv(10 + window, groups=groups)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, :1] = True
    report = gradcheck(lambda q, k, v: attention_forward(q, k, v, key_padding_mask=padding,
                                                         is_causal=True, window=window),
                       attention_backward, (q, k, v), seed=window)
    assert report.passed, str(report)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("groups", [1, 2])
def test_the_kernel_backward_equals_the_reference_with_a_window(dtype, groups):
    q, k, v = _qkv(20, groups=groups, tq=5, tk=8, dtype=dtype)
    out, cache = attention_forward(q, k, v, is_causal=True, causal_offset=3, window=3)
    dout = np.random.default_rng(21).standard_normal(out.shape).astype(dtype)
    reference = attention_backward(dout, cache)
    kernel = attention_backward_into(dout, *cache)
    for name, a, b in zip("qkv", kernel, reference):
        assert a.dtype == dtype
        ulps = 128 * np.finfo(dtype).eps * max(1.0, float(np.abs(b).max()))
        assert np.abs(a - b).max() <= ulps, name
    np.testing.assert_array_equal(kernel[2], reference[2])     # dv: no row sum, bit for bit


def test_multihead_attention_runs_the_window_on_both_paths():
    layer = MultiHeadAttention(16, 4, 2, rope=True, sliding_window=2, rng=3)
    x = np.random.default_rng(4).standard_normal((2, 5, 16))
    dout = np.random.default_rng(5).standard_normal((2, 5, 16))
    results = []
    for reference in (False, True):
        layer.zero_grad()
        if reference:
            with reference_path():
                out, cache = layer.forward(x, is_causal=True)
                dx = layer.backward(dout, cache)
        else:
            out, cache = layer.forward(x, is_causal=True)
            dx = layer.backward(dout, cache)
        results.append((out, dx, layer.grad_dict()))
        assert np.count_nonzero(cache.attention.probs[0, 0]) == 2 * 5 - 1
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-12, atol=1e-13)
    report = gradcheck_module(layer, x, seed=6, forward_kwargs={"is_causal": True})
    assert report.passed, str(report)


# -- KV-cache decoding past the window ----------------------------------------------------------
def _mistral(window, seed, **changes):
    base = dict(vocab_size=24, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0,
                initializer_range=0.3, sliding_window=window)
    return Llama(LlamaConfig(**{**base, **changes}), rng=seed)


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_cached_decoding_past_the_window_equals_the_full_forward(window):
    model = _mistral(window, 30)
    ids = np.random.default_rng(31).integers(0, 24, (2, 9))
    assert_cached_decoding_equals_the_full_forward(model, ids, 2)
    full, _ = model.forward(ids)
    without_window, _ = _mistral(None, 30).forward(ids)
    assert not np.allclose(full[:, window:], without_window[:, window:])


def test_a_token_beyond_the_window_changes_nothing_after_one_layer():
    """With one layer, the logits at position t depend only on ids t - W + 1 .. t."""
    model = _mistral(3, 32, num_hidden_layers=1)
    ids = np.random.default_rng(33).integers(0, 24, (1, 8))
    changed = ids.copy()
    changed[0, 1] = (ids[0, 1] + 5) % 24
    a, _ = model.forward(ids)
    b, _ = model.forward(changed)
    np.testing.assert_array_equal(a[0, 4:], b[0, 4:])          # 4 - 1 >= W: out of reach
    assert not np.allclose(a[0, 1:4], b[0, 1:4])


@given(seed=st.integers(0, 2**16), window=st.integers(1, 5), tied=st.booleans())
@settings(max_examples=8, deadline=None)
def test_fast_gradient_check_of_mistral(seed, window, tied):
    model = _mistral(window, seed, tie_word_embeddings=tied)
    ids = np.random.default_rng(seed).integers(0, 24, (2, 7))
    padding = np.zeros((2, 7), dtype=bool)
    padding[1, 5:] = True
    report = gradcheck_module(NextTokenLoss(model), ids, fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


# -- Hugging Face ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FIXTURES)
def test_agrees_with_hugging_face(name):
    """The full forward (with right padding), the loss and every gradient in HF's layout; and
    numpy_tf's cached decoding equals HF's own cached decoding (DynamicCache, sliding
    layers), step by step past the window."""
    assert_fixture_agrees(name)


def test_hf_cached_decoding_equals_our_full_forward():
    """HF's cached decoding (kept in the fixture) equals numpy_tf's whole-sequence forward too:
    both sides' decoding equals recomputation."""
    for dtype, bound in (("float64", 1e-12), ("float32", 1e-5)):
        case = Case.load(fixtures_dir() / f"mistral_decoding_{dtype}.npz")
        model = interop.from_hf(case.meta["config"], case.section("param"), case.dtype)
        assert model.config.sliding_window == 3
        full, _ = model.forward(case.arrays["input/ids"])
        expected = case.arrays["output/logits"]
        assert np.abs(full - expected).max() <= bound * np.abs(expected).max()


@pytest.mark.parametrize("name", ["mistral_window", "mistral_window_tied_padded"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_load_then_export_is_bit_exact(name, dtype):
    case = Case.load(fixtures_dir() / f"{name}_{dtype}.npz")
    assert_hf_round_trip_is_bit_exact(case.meta["config"], case.section("param"), dtype)


def test_the_window_is_what_makes_the_fixture_agree():
    """Read as a Llama (no window), the Mistral case's logits are far off: the fixture tests
    the window."""
    case = Case.load(fixtures_dir() / "mistral_window_float64.npz")
    config = dict(case.meta["config"], model_type="llama", sliding_window=None)
    logits, _ = interop.from_hf(config, case.section("param")).forward(case.arrays["input/ids"])
    assert np.abs(logits - case.arrays["output/logits"]).max() > 1e-3


# -- presets and refusals -------------------------------------------------------------------------
def test_mistral_7b_preset_is_counted_exactly():
    """7,241,732,096: MistralForCausalLM(MistralConfig(...)) on the meta device, summed."""
    preset = PRESETS["mistral-7b-v0.1"]
    assert preset.config.num_parameters() == 7_241_732_096
    from numpy_tf.models.accounting import llama_hf_config
    hf = llama_hf_config(preset.config)
    assert hf["model_type"] == "mistral" and hf["sliding_window"] == 4096
    assert interop.config_from_hf(hf) == replace(preset.config, head_dim=128)


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "4"])
def test_bad_windows_are_refused(window):
    with pytest.raises(ValueError, match="sliding_window must be None or a positive int"):
        LlamaConfig(sliding_window=window)
    with pytest.raises(ValueError, match="sliding_window must be None or a positive int"):
        MultiHeadAttention(8, 2, sliding_window=window)
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match="window must be None or a positive int"):
        attention_forward(q, k, v, is_causal=True, window=window)


def test_hf_configs_with_a_window_are_refused_unless_mistral():
    case = Case.load(fixtures_dir() / "mistral_window_float64.npz")
    config, state = case.meta["config"], case.section("param")
    with pytest.raises(ValueError, match="sliding_window=3 is not implemented"):
        interop.from_hf(dict(config, model_type="llama"), state)
    with pytest.raises(ValueError, match="sliding_window must be None or a positive int"):
        interop.from_hf(dict(config, sliding_window=0), state)
    model = interop.from_hf(dict(config, sliding_window=None), state)
    assert model.config.sliding_window is None
