"""Fixtures for the Llama-shaped Hugging Face families numpy_tf reads as options of its Llama:
Qwen2ForCausalLM (q, k, v biases, o_proj without), Qwen3ForCausalLM (q_norm / k_norm per head
before RoPE, head_dim free of hidden / heads), Phi3ForCausalLM (fused qkv_proj and
gate_up_proj), LlamaForCausalLM with each scaled RoPE (rope_type linear, dynamic, llama3,
yarn) and Phi-3 with longrope, all built offline from small configs with random weights
(never downloaded). Each case holds the logits, the mean next-token cross-entropy and every parameter gradient of that loss.

float32 cases run HF's models exactly as they ship. float64 cases run under the same patches
as llama.py's (listed in each case's meta), applied to each family's own classes: its RMSNorm
(HF casts to float32), its rotary embedding (HF builds inv_freq and the angles in float32)
and the eager attention softmax (HF takes it in float32). For a scaled RoPE the patched
rotary embedding rebuilds inv_freq in float64 with HF's formulas (`scaled_inv_freq`, below;
yarn's ramp too, which HF builds in float32 even then), and for dynamic from this call's
largest position (HF's value for a freshly built model, which every case is). build() checks
that the patches change no bit of HF's float32 logits, and that scaled_inv_freq rounded to
float32 is HF's own float32 inv_freq (to 2 ulps).

The dynamic, yarn and long longrope cases run 11 tokens past a max_position_embeddings
(dynamic) or original_max_position_embeddings (yarn, longrope) of 8, so the scaling acts;
the short longrope case runs 7, within it (the short factors).
"""
from __future__ import annotations

import math

import torch

from common import DTYPES, generator
from gpt import hf_config_dict, hf_lm_loss, lm_case, spread_weights
from llama import _check_patch_is_exact_in_float32, float64_faithful

FILE = "qwen.py"

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64 in the family's own classes: <Family>RMSNorm.forward "
    "(HF casts to float32), <Family>RotaryEmbedding.forward (HF builds inv_freq and the angles "
    "in float32; a scaled RoPE's inv_freq is rebuilt in float64 with HF's formulas, dynamic's "
    "from the call's largest position + 1, yarn's ramp in float64 too) and the eager attention "
    "softmax (HF uses dtype=float32) compute in the model's dtype; float32 cases run HF "
    "unpatched (the patch is bit-identical there, checked when generating)")

SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=16, bos_token_id=1,
             eos_token_id=2, attn_implementation="eager")

# name, seed, model_type, config changes, right padding, length
CASES = [
    ("qwen2_gqa", 110, "qwen2", {"num_key_value_heads": 2}, False, 9),
    ("qwen2_mha_tied_padded", 111, "qwen2", {"num_key_value_heads": 4, "pad_token_id": 0,
                                             "tie_word_embeddings": True,
                                             "rope_parameters": {"rope_type": "default",
                                                                 "rope_theta": 500.0}}, True, 9),
    ("qwen3_gqa_head_dim", 112, "qwen3", {"num_key_value_heads": 2, "head_dim": 6}, False, 9),
    ("qwen3_bias_tied_padded", 113, "qwen3", {"num_key_value_heads": 1, "head_dim": 8,
                                              "attention_bias": True, "pad_token_id": 0,
                                              "tie_word_embeddings": True,
                                              "rms_norm_eps": 1e-5}, True, 9),
    ("phi3_mha", 114, "phi3", {"num_key_value_heads": 4, "pad_token_id": 0}, False, 9),
    ("phi3_gqa_padded", 115, "phi3", {"num_key_value_heads": 2, "pad_token_id": 0}, True, 9),
    ("phi3_longrope_long", 121, "phi3", {"num_key_value_heads": 2, "num_attention_heads": 2,
                                         "pad_token_id": 0, "max_position_embeddings": 32,
                                         "original_max_position_embeddings": 8,
                                         "rope_scaling": {"type": "longrope",
                                                          "short_factor": [1.0, 1.1, 1.3, 1.7],
                                                          "long_factor": [1.0, 2.0, 3.5, 5.0]}},
     True, 11),
    ("phi3_longrope_short", 122, "phi3", {"num_key_value_heads": 1, "num_attention_heads": 2,
                                          "pad_token_id": 0, "max_position_embeddings": 32,
                                          "original_max_position_embeddings": 8,
                                          "rope_scaling": {"type": "longrope",
                                                           "short_factor": [1.0, 1.1, 1.3, 1.7],
                                                           "long_factor": [1.0, 2.0, 3.5, 5.0],
                                                           "attention_factor": 1.25}},
     False, 7),
    ("llama_rope_linear", 116, "llama", {"num_key_value_heads": 2, "rope_parameters": {
        "rope_type": "linear", "factor": 2.5, "rope_theta": 10000.0}}, False, 9),
    ("llama_rope_dynamic", 117, "llama", {"num_key_value_heads": 2, "num_attention_heads": 2,
                                          "head_dim": 8, "max_position_embeddings": 8,
                                          "rope_parameters": {"rope_type": "dynamic",
                                                              "factor": 3.0,
                                                              "rope_theta": 10000.0}},
     False, 11),
    ("llama_rope_llama3", 118, "llama", {"num_key_value_heads": 1, "num_attention_heads": 2,
                                         "head_dim": 8, "max_position_embeddings": 256,
                                         "rope_parameters": {
                                             "rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64,
                                             "rope_theta": 10000.0}}, False, 9),
    ("llama_rope_yarn", 119, "llama", {"num_key_value_heads": 2, "num_attention_heads": 2,
                                       "head_dim": 8, "max_position_embeddings": 32,
                                       "rope_parameters": {
                                           "rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 8,
                                           "beta_fast": 4.0, "beta_slow": 0.5,
                                           "truncate": False, "rope_theta": 100.0}}, False, 11),
    ("llama_rope_yarn_mscale", 120, "llama", {"num_key_value_heads": 2, "num_attention_heads": 2,
                                              "pad_token_id": 0,
                                              "head_dim": 8, "max_position_embeddings": 32,
                                              "rope_parameters": {
                                                  "rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 8,
                                                  "mscale": 2.0, "mscale_all_dim": 1.0,
                                                  "rope_theta": 10000.0}}, True, 11),
]

FAMILIES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen2", "Qwen2"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3", "Qwen3"),
            "phi3": ("Phi3Config", "Phi3ForCausalLM", "phi3", "Phi3"),
            "llama": ("LlamaConfig", "LlamaForCausalLM", "llama", "Llama")}


def scaled_inv_freq(config, head_dim: int, dtype, length: int) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention factor) of config.rope_parameters, every step in `dtype`, with the
    formulas of transformers' modeling_rope_utils (default, linear, dynamic, llama3, yarn)."""
    parameters = config.rope_parameters
    kind, base = parameters["rope_type"], parameters["rope_theta"]
    exponents = torch.arange(0, head_dim, 2, dtype=dtype) / head_dim
    inv_freq = 1.0 / (base ** exponents)
    if kind == "default":
        return inv_freq, 1.0
    factor = parameters.get("factor")
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "dynamic":
        context = config.max_position_embeddings
        if length > context:
            base = base * ((factor * length / context) - (factor - 1)) ** \
                (head_dim / (head_dim - 2))
        return 1.0 / (base ** exponents), 1.0
    context = parameters["original_max_position_embeddings"]
    if kind == "llama3":
        low, high = parameters["low_freq_factor"], parameters["high_freq_factor"]
        wavelength = 2 * math.pi / inv_freq
        stretched = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * stretched / factor + smooth * stretched
        medium = ~(wavelength < context / high) * ~(wavelength > context / low)
        return torch.where(medium, smoothed, stretched), 1.0
    if kind == "longrope":
        original = getattr(config, "original_max_position_embeddings", None) or context
        if factor is None:
            factor = config.max_position_embeddings / original
        attention = parameters.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else \
                math.sqrt(1 + math.log(factor) / math.log(original))
        factors = parameters["long_factor"] if length > original else parameters["short_factor"]
        return 1.0 / (torch.tensor(factors, dtype=dtype) * base ** exponents), attention
    if kind == "yarn":
        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = parameters.get("attention_factor")
        if attention is None:
            m, m_all = parameters.get("mscale"), parameters.get("mscale_all_dim")
            attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all \
                else mscale(factor)
        beta_fast = parameters.get("beta_fast") or 32
        beta_slow = parameters.get("beta_slow") or 1

        def dimension(rotations):
            return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = dimension(beta_fast), dimension(beta_slow)
        if parameters.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        powers = base ** exponents
        ramp = torch.clamp((torch.arange(head_dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        keep = 1 - ramp
        return (1.0 / (factor * powers)) * (1 - keep) + (1.0 / powers) * keep, attention
    raise ValueError(f"rope_type {kind!r} has no float64 formula here")


def _scaled_rotary(self, x, position_ids):
    """cos and sin of position * inv_freq, concatenated twice, times the attention factor: in
    float64 from scaled_inv_freq, in float32 HF's own inv_freq and factor (after HF's dynamic
    update, which wraps this function as it wraps HF's forward)."""
    if x.dtype == torch.float64:
        inv_freq, factor = scaled_inv_freq(self.config, 2 * self.inv_freq.shape[0], x.dtype,
                                           int(position_ids.max()) + 1)
    else:
        inv_freq, factor = self.inv_freq.float(), self.attention_scaling
    angles = position_ids[..., None].to(inv_freq.dtype) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)


def _faithful(model_type):
    import importlib

    from transformers.modeling_rope_utils import dynamic_rope_update

    _, _, module, prefix = FAMILIES[model_type]
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return lambda: float64_faithful(modeling, prefix, dynamic_rope_update(_scaled_rotary))


def _check_inv_freq(model, config):
    """scaled_inv_freq in float64, rounded to float32, is HF's float32 inv_freq (2 ulps)."""
    rotary = model.model.rotary_emb
    head_dim = 2 * rotary.inv_freq.shape[0]
    ours, factor = scaled_inv_freq(config, head_dim, torch.float64, 1)
    theirs = rotary.inv_freq.double()
    if config.rope_parameters["rope_type"] == "dynamic":
        return
    if not torch.allclose(ours, theirs, rtol=2.5e-7, atol=0) or factor != \
            rotary.attention_scaling:
        raise AssertionError(f"scaled_inv_freq {ours} ({factor}) is not HF's {theirs} "
                             f"({rotary.attention_scaling})")


def build(out_dir):
    import transformers

    paths = []
    for dtype in DTYPES:
        for name, seed, model_type, changes, padded, length in CASES:
            config_class, model_class, _, _ = FAMILIES[model_type]
            g = generator(seed)
            hf_config = getattr(transformers, config_class)(**{**SMALL, **changes})
            model = getattr(transformers, model_class)(hf_config).to(DTYPES[dtype]).eval()
            spread_weights(model, g, dtype)
            ids = torch.randint(0, hf_config.vocab_size, (2, length), generator=g)
            mask = None
            if padded:
                mask = torch.ones(2, length, dtype=torch.long)
                mask[1, length - 3:] = 0
                ids[1, length - 3:] = hf_config.pad_token_id
            path = out_dir / f"{name}_{dtype}.npz"
            faithful = _faithful(model_type)
            kind = f"hf_{model_type}"
            if dtype == "float32":
                _check_inv_freq(model, hf_config)
                _check_patch_is_exact_in_float32(model, ids, mask, faithful)
                paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config), kind,
                                     seed, dtype, hf_lm_loss, FILE))
            else:
                with faithful():
                    paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                         kind, seed, dtype, hf_lm_loss, FILE,
                                         {"float64": FLOAT64_CONVENTION}))
    return paths
