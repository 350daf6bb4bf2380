"""The Llama-shaped families read as options of numpy_tf's Llama: Qwen2 (q, k, v biases without
an o_proj bias), Qwen3 (q_norm / k_norm per head before RoPE, its own head_dim), Phi-3 (fused
qkv_proj and gate_up_proj in the interop layout), and scaled RoPE (linear, dynamic, llama3,
yarn): agreement with HF, finite differences of the new pieces, the bit-exact round trips,
the gradients in HF's layout, and the refusals."""
import math
from dataclasses import replace

import numpy as np
import pytest
from contract import assert_fixture_agrees, assert_hf_round_trip_is_bit_exact

from numpy_tf import gradcheck, gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.layers.multihead import MultiHeadAttention
from numpy_tf.layers.rope import rope_backward, rope_forward, rope_tables
from numpy_tf.layers.rope_scaling import RopeScaling, scaled_inverse_frequencies
from numpy_tf.models.llama import Llama, LlamaConfig
from numpy_tf.models.objectives import NextTokenLoss

FIXTURES = ["qwen2_gqa", "qwen2_mha_tied_padded", "qwen3_gqa_head_dim",
            "qwen3_bias_tied_padded", "phi3_mha", "phi3_gqa_padded", "llama_rope_linear",
            "llama_rope_dynamic", "llama_rope_llama3", "llama_rope_yarn",
            "llama_rope_yarn_mscale", "phi3_longrope_long", "phi3_longrope_short"]

SCALINGS = [
    RopeScaling("linear", 2.5),
    RopeScaling("dynamic", 3.0, 4),
    RopeScaling("llama3", 8.0, 64, low_freq_factor=1.0, high_freq_factor=4.0),
    RopeScaling("yarn", 4.0, 8, beta_fast=4.0, beta_slow=0.5, truncate=False),
    RopeScaling("yarn", 4.0, 8, mscale=2.0, mscale_all_dim=1.0),
    RopeScaling("longrope", 4.0, 8, short_factor=[1.0, 1.1, 1.3, 1.7],
                long_factor=[1.0, 2.0, 3.5, 5.0]),
]


def _case(name):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param"), case


# -- agreement with Hugging Face ----------------------------------------------------------------
@pytest.mark.parametrize("name", FIXTURES)
def test_agrees_with_hugging_face(name):
    """Logits, loss and every parameter gradient in HF's layout (Phi-3's fused gradients
    joined), float64 (1e-9) and float32; the float64 case also by finite differences."""
    assert_fixture_agrees(name)


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_load_then_export_is_bit_exact(name, dtype):
    config, state, _ = _case(f"{name}_{dtype}")
    assert_hf_round_trip_is_bit_exact(config, state, dtype)


def test_each_family_reads_into_its_options():
    qwen2 = interop.config_from_hf(_case("qwen2_gqa_float64")[0])
    assert (qwen2.attention_bias, qwen2.output_bias, qwen2.qk_norm) == (True, False, False)
    qwen3 = interop.config_from_hf(_case("qwen3_gqa_head_dim_float64")[0])
    assert qwen3.qk_norm and qwen3.head_width == 6 and qwen3.hidden_size == 16
    phi3 = interop.config_from_hf(_case("phi3_gqa_padded_float64")[0])
    assert not (phi3.attention_bias or phi3.qk_norm) and phi3.kv_heads == 2
    llama3 = interop.config_from_hf(_case("llama_rope_llama3_float64")[0])
    assert llama3.rope_scaling == RopeScaling("llama3", 8.0, 64, low_freq_factor=1.0,
                                              high_freq_factor=4.0)
    dynamic = interop.config_from_hf(_case("llama_rope_dynamic_float64")[0])
    assert dynamic.rope_scaling.original_max_position_embeddings == 8   # HF's max positions


@pytest.mark.parametrize("preset", ["qwen2-tiny", "qwen3-tiny", "phi3-tiny", "llama-3.2-1b",
                                    "qwen2.5-0.5b", "qwen3-0.6b", "phi-3-mini-4k"])
def test_a_preset_is_read_back_from_its_hf_config(preset):
    """The registry's hf_config writes the family's config.json (rope_parameters included),
    and from_hf's reader gives the same LlamaConfig back."""
    from numpy_tf.models import registry

    found = registry.PRESETS[preset]
    hf_config = registry.FAMILIES[found.family].hf_config(found.config)
    assert hf_config["model_type"] == found.family
    assert interop.config_from_hf(hf_config) == replace(found.config,
                                                        head_dim=found.config.head_width)


def test_phi3_fused_weights_are_split_and_joined_by_rows():
    """qkv_proj = [q_proj; k_proj; v_proj] (H d, G d, G d rows), gate_up_proj = [gate; up]."""
    config, state, _ = _case("phi3_gqa_padded_float64")
    model = interop.from_hf(config, state)
    qkv = state["model.layers.1.self_attn.qkv_proj.weight"]
    attention = model.layers[1].self_attn
    assert qkv.shape == (4 * 4 + 2 * 4 + 2 * 4, 16)       # H d + G d + G d rows, d = 4
    np.testing.assert_array_equal(attention.q_proj.weight.data, qkv[:16])
    np.testing.assert_array_equal(attention.k_proj.weight.data, qkv[16:24])
    np.testing.assert_array_equal(attention.v_proj.weight.data, qkv[24:])
    gate_up = state["model.layers.0.mlp.gate_up_proj.weight"]
    mlp = model.layers[0].mlp
    np.testing.assert_array_equal(mlp.gate_proj.weight.data, gate_up[:24])
    np.testing.assert_array_equal(mlp.up_proj.weight.data, gate_up[24:])
    # the joined gradient is the parts' gradients, in the same rows
    ids = np.random.default_rng(0).integers(0, 32, (2, 5))
    objective = NextTokenLoss(model)
    _, cache = objective.forward(ids)
    objective.backward(1.0, cache)
    grads = interop.to_hf(model, config, grads=True)
    np.testing.assert_array_equal(grads["model.layers.1.self_attn.qkv_proj.weight"][16:24],
                                  attention.k_proj.weight.grad)
    np.testing.assert_array_equal(grads["model.layers.0.mlp.gate_up_proj.weight"][24:],
                                  mlp.up_proj.weight.grad)


# -- the new layer pieces, by finite differences ------------------------------------------------
@pytest.mark.parametrize("kv_heads, head_dim", [(2, 6), (1, 8)])
def test_attention_with_head_norms_and_output_without_bias(kv_heads, head_dim):
    """q_norm / k_norm before RoPE (Qwen3) and q/k/v biases without an o_proj bias (Qwen2):
    every input and parameter gradient by central differences, random dout."""
    rng = np.random.default_rng(kv_heads)
    layer = MultiHeadAttention(8, 4, kv_heads, head_dim, bias=True, rope=True, rope_base=50.0,
                               output_bias=False, head_norm_eps=1e-5, rng=rng)
    for norm in (layer.q_norm, layer.k_norm):
        norm.weight.data[...] = 1.0 + 0.3 * rng.standard_normal(head_dim)
    for linear in (layer.q_proj, layer.k_proj, layer.v_proj):
        linear.bias.data[...] = 0.3 * rng.standard_normal(linear.bias.shape)
    assert layer.o_proj.bias is None
    assert [name for name, _ in layer.named_parameters()][-2:] == ["q_norm.weight",
                                                                   "k_norm.weight"]
    x = rng.standard_normal((2, 4, 8))
    report = gradcheck_module(layer, x, forward_kwargs={"is_causal": True}, seed=3)
    assert report.passed, str(report)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.rope_type)
@pytest.mark.parametrize("positions", [np.arange(9), np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8],
                                                               [3, 4, 5, 6, 7, 8, 9, 10, 11]])],
                         ids=["shared", "per-sequence"])
def test_scaled_rope_backward_by_finite_differences(scaling, positions):
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 8))
    report = gradcheck(lambda x: rope_forward(x, positions, 100.0, False, scaling),
                       rope_backward, {"x": x}, seed=2)
    assert report.passed, str(report)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.rope_type)
def test_scaled_tables_keep_float32(scaling):
    cos, sin = rope_tables(np.arange(12), 8, 100.0, np.float32, scaling)
    assert cos.dtype == sin.dtype == np.float32
    out, cache = rope_forward(np.ones((1, 1, 12, 8), np.float32), np.arange(12), 100.0,
                              False, scaling)
    assert out.dtype == np.float32 and rope_backward(out, cache).dtype == np.float32


def test_scaled_frequencies_worked_values():
    """Each rule's closed form at D = 8, base 10000 (omega = 1, 0.1, 0.01, 0.001)."""
    plain, _ = scaled_inverse_frequencies(8, 10000.0, None, np.float64)
    np.testing.assert_allclose(plain, [1, 0.1, 0.01, 0.001], rtol=1e-15)
    linear, factor = scaled_inverse_frequencies(8, 10000.0, SCALINGS[0], np.float64)
    np.testing.assert_allclose(linear, plain / 2.5, rtol=1e-15)
    assert factor == 1.0
    # dynamic: unscaled up to M = 4 positions, then base (3 L / 4 - 2)^(8/6)
    same, _ = scaled_inverse_frequencies(8, 10000.0, SCALINGS[1], np.float64, length=4)
    np.testing.assert_array_equal(same, plain)
    grown, _ = scaled_inverse_frequencies(8, 10000.0, SCALINGS[1], np.float64, length=12)
    np.testing.assert_allclose(grown, (10000.0 * 7.0 ** (8 / 6)) ** -(np.arange(4) / 4),
                               rtol=1e-14)
    # llama3, old context 64: wavelengths 6.3 (kept, < 16), 62.8 (between 16 and 64:
    # smoothed), 628 and 6283 (> 64: divided by 8)
    llama3, _ = scaled_inverse_frequencies(8, 10000.0, SCALINGS[2], np.float64)
    s = (64 / (2 * math.pi / 0.1) - 1) / 3
    np.testing.assert_allclose(llama3, [1, (1 - s) * 0.1 / 8 + s * 0.1, 0.01 / 8, 0.001 / 8],
                               rtol=1e-14)
    # yarn's default attention factor 0.1 ln(4) + 1; with mscale 2 over mscale_all_dim 1
    _, factor = scaled_inverse_frequencies(8, 100.0, SCALINGS[3], np.float64)
    assert factor == pytest.approx(0.1 * math.log(4) + 1, rel=1e-15)
    _, factor = scaled_inverse_frequencies(8, 100.0, SCALINGS[4], np.float64)
    assert factor == pytest.approx((0.2 * math.log(4) + 1) / (0.1 * math.log(4) + 1),
                                   rel=1e-15)
    # longrope: 1 / (f_i base^(2i/D)), the short f within M = 8 positions, the long beyond;
    # attention factor sqrt(1 + ln 4 / ln 8)
    short, factor = scaled_inverse_frequencies(8, 10000.0, SCALINGS[5], np.float64, length=8)
    np.testing.assert_allclose(short, plain / [1.0, 1.1, 1.3, 1.7], rtol=1e-15)
    assert factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(8)), rel=1e-15)
    long, _ = scaled_inverse_frequencies(8, 10000.0, SCALINGS[5], np.float64, length=9)
    np.testing.assert_allclose(long, plain / [1.0, 2.0, 3.5, 5.0], rtol=1e-15)


def test_yarn_multiplies_both_tables_by_its_attention_factor():
    scaling = SCALINGS[4]
    plain = RopeScaling("linear", 1.0)      # omega unscaled, factor 1
    cos, sin = rope_tables(np.arange(6), 8, 100.0, np.float64, scaling)
    omega, factor = scaled_inverse_frequencies(8, 100.0, scaling, np.float64)
    np.testing.assert_allclose(cos, factor * np.cos(np.arange(6)[:, None] * omega), rtol=1e-15)
    np.testing.assert_allclose(sin, factor * np.sin(np.arange(6)[:, None] * omega), rtol=1e-15)
    cos1, _ = rope_tables(np.arange(6), 8, 100.0, np.float64, plain)
    np.testing.assert_allclose(cos1, rope_tables(np.arange(6), 8, 100.0)[0], rtol=1e-15)


def test_dynamic_rope_follows_the_length_of_the_call():
    """Within M positions the model is plain RoPE's; beyond, the frequencies of the call's
    largest position: a longer input changes the logits of its first tokens (as HF's)."""
    config = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                         num_attention_heads=2, initializer_range=0.3, rope_theta=100.0,
                         max_position_embeddings=6, rope_scaling=RopeScaling("dynamic", 2.0, 6))
    model = Llama(config, rng=1)
    plain = Llama(LlamaConfig(**{**config.to_dict(), "rope_scaling": None}), rng=1)
    ids = np.random.default_rng(2).integers(0, 20, (1, 9))
    np.testing.assert_array_equal(model.forward(ids[:, :6])[0], plain.forward(ids[:, :6])[0])
    long, _ = model.forward(ids)
    assert not np.allclose(long[:, :6], plain.forward(ids)[0][:, :6])
    # KV-cache decoding up to M equals the full forward
    _, cache = model.forward(ids[:, :4])
    step, _ = model.forward(ids[:, 4:6], past_kv=cache.present)
    np.testing.assert_allclose(step, model.forward(ids[:, :6])[0][:, 4:], rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("changes", [{"qk_norm": True, "head_dim": 6},
                                     {"attention_bias": True, "attention_output_bias": False},
                                     *({"rope_scaling": s, "head_dim": 8} for s in SCALINGS
                                       if s.rope_type != "dynamic")],
                         ids=["qk_norm", "qkv_bias", "linear", "llama3", "yarn", "yarn_mscale",
                              "longrope"])
def test_cached_decoding_step_by_step_equals_the_full_forward(changes):
    """The KV cache holds keys after k_norm and the (scaled) rotation: decoding one token at a
    time gives the full forward's logits."""
    config = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rope_theta=100.0,
                         initializer_range=0.3, **changes)
    model = Llama(config, rng=7)
    ids = np.random.default_rng(8).integers(0, 20, (2, 7))
    full, _ = model.forward(ids)
    _, cache = model.forward(ids[:, :3])
    for t in range(3, 7):
        step, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        np.testing.assert_allclose(step[:, 0], full[:, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("preset", ["qwen2-tiny", "qwen3-tiny", "phi3-tiny"])
def test_tiny_presets_by_finite_differences(preset):
    from numpy_tf.models import registry

    model = Llama(registry.PRESETS[preset].config, rng=4)
    ids = np.random.default_rng(5).integers(0, 32, (2, 6))
    report = gradcheck_module(NextTokenLoss(model), ids, fast=True, seed=6)
    assert report.passed, str(report)


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, changes, message", [
    ("qwen2_gqa_float64", {"use_sliding_window": True, "sliding_window": 4, "layer_types": None,
                           "max_window_layers": 1},
     r"layer_types \['sliding_attention'\] are not implemented .*use_sliding_window=True with "
     "max_window_layers=1"),
    ("qwen3_gqa_head_dim_float64", {"layer_types": ["full_attention", "sliding_attention"]},
     r"layer_types \['sliding_attention'\] are not implemented"),
    ("phi3_mha_float64", {"sliding_window": 2047},
     "sliding_window=2047 is not implemented for phi3"),
    ("phi3_mha_float64", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}},
     "rope_type 'proportional' is not implemented"),
    ("phi3_longrope_long_float64", {"rope_scaling": {"type": "longrope",
                                                     "short_factor": [1.0, 1.1],
                                                     "long_factor": [1.0, 2.0]}},
     r"short_factor and long_factor must hold head_dim / 2 = 4 factors .*; got 2"),
    ("phi3_longrope_long_float64", {"rope_scaling": {"type": "longrope",
                                                     "short_factor": [1.0, 1.1, 1.3, 1.7]}},
     "rope_type 'longrope' needs long_factor"),
    ("phi3_mha_float64", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5 is not implemented"),
    ("qwen2_gqa_float64", {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
     "per-layer-type RoPE is not implemented"),
    ("qwen2_gqa_float64", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
    ("qwen3_gqa_head_dim_float64", {"head_dim": 5}, "head_dim must be even"),
    ("llama_rope_linear_float64", {"rope_parameters": {"rope_type": "linear",
                                                       "rope_theta": 1e4}},
     "rope_type 'linear' needs a factor"),
    ("llama_rope_llama3_float64", {"rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
        "original_max_position_embeddings": 64, "rope_theta": 1e4}},
     r"high_freq_factor \(1.0\) must be greater than low_freq_factor \(4.0\)"),
    ("llama_rope_yarn_float64", {"rope_parameters": {"rope_type": "yarn", "factor": -2.0,
                                                     "rope_theta": 1e4}},
     r"factor must be a finite number > 0; got -2.0"),
])
def test_unsupported_configs_are_refused(name, changes, message):
    config, state, _ = _case(name)
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(config, **changes), state)


def test_qwen_sliding_window_from_max_window_layers_on_is_read_as_hf_builds_it():
    """use_sliding_window=True slides only the layers from max_window_layers on: with none
    there, HF's model attends fully, and so does numpy_tf's."""
    config, state, _ = _case("qwen2_gqa_float64")
    full = interop.from_hf(config, state)
    windowed = dict(config, use_sliding_window=True, sliding_window=4, max_window_layers=2,
                    layer_types=None)
    model = interop.from_hf(windowed, state)
    ids = np.random.default_rng(3).integers(0, 32, (1, 9))
    np.testing.assert_array_equal(model.forward(ids)[0], full.forward(ids)[0])


def test_phi3_fused_shape_is_checked_by_name():
    config, state, _ = _case("phi3_gqa_padded_float64")
    state = dict(state)
    state["model.layers.0.self_attn.qkv_proj.weight"] = \
        state["model.layers.0.self_attn.qkv_proj.weight"][:-1]
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.qkv_proj.weight: expected "
                                         r"shape \(32, 16\) \(16 \+ 8 \+ 8 rows"):
        interop.from_hf(config, state)
    del state["model.layers.0.self_attn.qkv_proj.weight"]
    with pytest.raises(ValueError, match="missing keys: model.layers.0.self_attn.qkv_proj"):
        interop.from_hf(config, state)


def test_bad_scaling_options():
    with pytest.raises(ValueError, match="rope_type must be one of linear, dynamic, llama3, "
                                         "yarn, longrope"):
        RopeScaling("proportional", 2.0)
    with pytest.raises(ValueError, match="original_max_position_embeddings must be a positive"):
        RopeScaling("yarn", 2.0)
    with pytest.raises(ValueError, match="short_factor and long_factor must have the same "
                                         "length; got 2 and 1"):
        RopeScaling("longrope", 2.0, 8, short_factor=[1, 2], long_factor=[1])
    with pytest.raises(ValueError, match="long_factor must be a list of positive numbers"):
        RopeScaling("longrope", 2.0, 8, short_factor=[1, 2], long_factor=[1, -2])
    with pytest.raises(ValueError, match=r"rope_scaling's short_factor and long_factor must hold "
                                         r"head_dim / 2 = 2 factors .*; got 4"):
        LlamaConfig(rope_scaling=SCALINGS[5])
    with pytest.raises(ValueError, match="rope_scaling needs rope=True"):
        MultiHeadAttention(8, 2, rope_scaling=RopeScaling("linear", 2.0))
    with pytest.raises(TypeError, match="rope_scaling must be None, a RopeScaling"):
        LlamaConfig(rope_scaling="linear")
    config = LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert LlamaConfig(**config.to_dict()) == config
    with pytest.raises(ValueError, match="not in qwen2's layout"):
        from numpy_tf.models.accounting import qwen2_hf_config
        qwen2_hf_config(LlamaConfig())


# -- parameter counts: HF's models built from configs (nothing downloaded) ------------------------
@pytest.mark.torch
@pytest.mark.parametrize("model_type, changes", [
    ("qwen2", {"num_key_value_heads": 2}), ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    ("qwen3", {"num_key_value_heads": 2, "head_dim": 6}),
    ("qwen3", {"attention_bias": True, "num_key_value_heads": 4}),
    ("phi3", {"num_key_value_heads": 2, "pad_token_id": 0})])
def test_formula_equals_hf(model_type, changes):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from numpy_tf.models.accounting import account

    names = {"qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3"}[model_type]
    config = getattr(transformers, f"{names}Config")(
        vocab_size=41, hidden_size=16, intermediate_size=28, num_hidden_layers=2,
        num_attention_heads=4, **changes)
    model = getattr(transformers, f"{names}ForCausalLM")(config)
    assert account(config.to_dict()).total == model.num_parameters()
    ours = interop.config_from_hf(config.to_dict())
    assert ours.num_parameters() == model.num_parameters()


@pytest.mark.torch
@pytest.mark.parametrize("preset, total", [("qwen2.5-0.5b", 494_032_768),
                                           ("qwen3-0.6b", 596_049_920),
                                           ("phi-3-mini-4k", 3_821_079_552),
                                           ("llama-3.2-1b", 1_235_814_400)])
def test_preset_totals_equal_hf_models_on_the_meta_device(preset, total):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from numpy_tf.models import registry
    from numpy_tf.models.accounting import account

    found = registry.PRESETS[preset]
    owner = registry.FAMILIES[found.family]
    hf_config = owner.hf_config(found.config)
    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3", "llama": "Llama"}[found.family]
    config = getattr(transformers, f"{kind}Config")(**{
        k: v for k, v in hf_config.items() if k != "model_type"})
    with torch.device("meta"):
        model = getattr(transformers, f"{kind}ForCausalLM")(config)
    assert model.num_parameters() == total == account(preset).total == \
        found.config.num_parameters()
    read = interop.config_from_hf(config.to_dict())     # head_dim given explicitly
    assert read == replace(found.config, head_dim=found.config.head_width)


@pytest.mark.torch
def test_dynamic_rope_decoding_past_the_trained_length_equals_hf_cached_decoding():
    """Past max_position_embeddings, dynamic NTK recomputes the frequencies at each step while
    the cached keys keep their earlier rotation, in HF as in numpy_tf: step-by-step decoding
    with a KV cache equals HF's (float32, 1e-4), and differs from a full recomputation."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=4,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 100.0},
        attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.normal_(0, 0.5)
    ids = torch.randint(0, 32, (1, 9))
    model = interop.from_hf(config.to_dict(),
                            {k: v.numpy() for k, v in hf.state_dict().items()}, np.float32)
    with torch.no_grad():
        out = hf(input_ids=ids[:, :3], use_cache=True)
        theirs = [out.logits[:, -1].numpy()]
        for t in range(3, 9):
            out = hf(input_ids=ids[:, t:t + 1], cache=out.past_key_values, use_cache=True)
            theirs.append(out.logits[:, -1].numpy())
    logits, cache = model.forward(ids[:, :3].numpy())
    ours = [logits[:, -1]]
    for t in range(3, 9):
        logits, cache = model.forward(ids[:, t:t + 1].numpy(), past_kv=cache.present)
        ours.append(logits[:, -1])
    theirs, ours = np.stack(theirs), np.stack(ours)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
    full, _ = model.forward(ids.numpy())
    assert np.abs(full[:, -1] - ours[-1]).max() > 1e-2 * np.abs(ours[-1]).max()
