"""Fixtures for Gemma and Gemma2: Hugging Face GemmaForCausalLM and Gemma2ForCausalLM built
offline from small configs with random weights (never downloaded). hidden_size 24, so the
embedding scale sqrt(24) is not a round number in either dtype. Gemma: grouped-query heads
with the tied head; full multi-head with attention biases, an untied head and right padding.
Gemma2: three layers with HF's default layer_types (sliding window of 3 on layers 0 and 2),
query_pre_attn_scalar 8, attention and final soft caps small enough (5 and 3) that tanh bends
the scores and logits; no soft caps, a window of 4 on layer 1 only and right padding; and cached
decoding past the window (kind kv_decoding, as in mistral.py).

float32 cases run HF's model exactly as it ships. In a float64 model HF still computes in
float32: Gemma(2)RMSNorm.forward casts x and the weight to float32, the rotary embedding builds
inv_freq and the angles in float32, eager attention takes its softmax in float32, and the
embedding scale is the float32 value of sqrt(hidden_size) (a buffer made in float32 by
torch.tensor(hidden_size ** 0.5), then cast by .to(float64)). The float64 cases patch all four
(the first three bit-identical on float32, checked when generating; the scale set to the float64
value of sqrt(hidden_size), what a model built directly in float64 holds).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, float_case, normal
from llama import _rotary_in_working_dtype
from mistral import hf_cases, replaced

FILE = "gemma.py"

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64: {prefix}RMSNorm.forward (HF casts x and the "
    "weight to float32), {prefix}RotaryEmbedding.forward (HF builds inv_freq and the angles in "
    "float32) and the eager attention softmax (HF uses dtype=float32) compute in the model's "
    "dtype, and the embedding's embed_scale buffer holds the float64 sqrt(hidden_size) (HF's "
    "buffer is made in float32, so .to(float64) keeps float32's rounding); float32 cases run "
    "HF unpatched (the first three patches are bit-identical there, checked when generating)")

SMALL = dict(vocab_size=32, hidden_size=24, intermediate_size=28, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=16, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, attn_implementation="eager")
SMALL2 = dict(SMALL, num_hidden_layers=3)

# name, seed, config changes, right padding
GEMMA_CASES = [
    ("gemma_gqa_tied", 140, {"num_key_value_heads": 2, "head_dim": 6}, False),
    ("gemma_mha_biases_untied_padded", 145, {"num_key_value_heads": 4, "head_dim": 8,
                                             "attention_bias": True,
                                             "tie_word_embeddings": False,
                                             "rms_norm_eps": 1e-5}, True),
]
GEMMA2_CASES = [
    ("gemma2_window_softcaps", 150, {"num_key_value_heads": 2, "head_dim": 6,
                                     "sliding_window": 3, "query_pre_attn_scalar": 8,
                                     "attn_logit_softcapping": 5.0,
                                     "final_logit_softcapping": 3.0}, False),
    ("gemma2_nocaps_untied_padded", 155, {
        "num_key_value_heads": 1, "head_dim": 8, "sliding_window": 4,
        "query_pre_attn_scalar": 12, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "tie_word_embeddings": False,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"]}, True),
]
GEMMA2_DECODING = [
    ("gemma2_decoding", 152, {"num_key_value_heads": 2, "head_dim": 6, "sliding_window": 3,
                              "query_pre_attn_scalar": 8, "attn_logit_softcapping": 5.0,
                              "final_logit_softcapping": 3.0}),
]


def _rms_norm_in_working_dtype(self, x):
    """x / sqrt(mean(x^2) + eps) * (1 + w), HF's operations without the casts."""
    output = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return output * (1.0 + self.weight)


def _eager_attention_in_working_dtype(module, query, key, value, attention_mask, dropout=0.0,
                                      scaling=None, softcap=None, **kwargs):
    """HF's Gemma / Gemma2 eager attention (soft cap: divide, tanh, multiply) with the softmax
    taken in the query's dtype."""
    from transformers.models.gemma.modeling_gemma import repeat_kv

    if scaling is None:
        scaling = module.head_dim ** -0.5
    keys = repeat_kv(key, module.num_key_value_groups)
    values = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.dropout(F.softmax(scores, dim=-1), p=dropout, training=module.training)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


def _faithful(module_path: str, prefix: str):
    def faithful():
        import importlib

        module = importlib.import_module(module_path)
        return replaced(module, {
            f"{prefix}RMSNorm.forward": _rms_norm_in_working_dtype,
            f"{prefix}RotaryEmbedding.forward": _rotary_in_working_dtype,
            "eager_attention_forward": _eager_attention_in_working_dtype})
    faithful.__name__ = f"{prefix.lower()}_float64_faithful"
    return faithful


def _exact_embed_scale(model, dtype: str) -> None:
    """In float64, the embedding scale sqrt(hidden_size) in float64 (HF's buffer was made in
    float32); float32 keeps HF's own."""
    if dtype == "float64":
        with torch.no_grad():
            model.model.embed_tokens.embed_scale.fill_(model.config.hidden_size ** 0.5)


class SoftCap(nn.Module):
    """Gemma2's final_logit_softcapping as HF writes it: divide, tanh, multiply."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = cap

    def forward(self, x):
        return torch.tanh(x / self.cap) * self.cap


def layer_cases(out_dir):
    """The new layers on their own: HF's GemmaRMSNorm (its float32 cast patched away in
    float64), HF's GemmaMLP (GeGLU, gelu_pytorch_tanh) and the soft cap, with values large
    enough that tanh saturates."""
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm

    paths = []
    for dtype in DTYPES:
        def x(shape, std=1.0):
            return lambda g: normal(g, shape, dtype, std)

        norm = GemmaRMSNorm(8, eps=1e-6)
        if dtype == "float64":
            norm.forward = _rms_norm_in_working_dtype.__get__(norm)
        paths.append(float_case(out_dir, FILE, "gemma_rmsnorm", "gemma_rmsnorm", 160, dtype,
                                norm, {"normalized_shape": 8, "eps": 1e-6},
                                {"x": x((2, 3, 8), 2.0)},
                                conventions={"rmsnorm": "(1 + w) x / sqrt(mean(x^2) + eps)"}))
        mlp = GemmaMLP(GemmaConfig(hidden_size=6, intermediate_size=10,
                                   hidden_act="gelu_pytorch_tanh"))
        paths.append(float_case(out_dir, FILE, "geglu", "geglu", 161, dtype, mlp,
                                {"hidden_size": 6, "intermediate_size": 10},
                                {"x": x((2, 3, 6), 1.5)},
                                conventions={"mlp": "down(gelu_tanh(gate(x)) * up(x))"}))
        paths.append(float_case(out_dir, FILE, "softcap", "softcap", 162, dtype, SoftCap(3.0),
                                {"cap": 3.0}, {"x": x((2, 5, 7), 6.0)},
                                conventions={"softcap": "cap * tanh(x / cap)"}))
    return paths


def build(out_dir):
    from transformers import (Gemma2Config, Gemma2ForCausalLM, GemmaConfig,
                              GemmaForCausalLM)

    gemma = hf_cases(out_dir, GemmaConfig, GemmaForCausalLM, SMALL, GEMMA_CASES, [],
                     "hf_gemma", _faithful("transformers.models.gemma.modeling_gemma", "Gemma"),
                     FLOAT64_CONVENTION.format(prefix="Gemma"), FILE, _exact_embed_scale)
    gemma2 = hf_cases(out_dir, Gemma2Config, Gemma2ForCausalLM, SMALL2, GEMMA2_CASES,
                      GEMMA2_DECODING, "hf_gemma2",
                      _faithful("transformers.models.gemma2.modeling_gemma2", "Gemma2"),
                      FLOAT64_CONVENTION.format(prefix="Gemma2"), FILE, _exact_embed_scale)
    return layer_cases(out_dir) + gemma + gemma2
