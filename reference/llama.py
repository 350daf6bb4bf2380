"""Fixtures for the Llama family: Hugging Face LlamaForCausalLM built offline from small
LlamaConfigs with random weights (never downloaded): grouped-query heads (2 key/value heads for
4 query heads), multi-query (1), full multi-head (4, with attention and MLP biases), tied and
untied heads, an explicit head_dim, right padding with a pad_token_id. Each case holds the
logits, the mean next-token cross-entropy and every parameter gradient of that loss.

float32 cases run HF's model exactly as it ships. In a float64 model HF still computes three
things in float32: LlamaRMSNorm casts its input to float32, the rotary embedding builds inv_freq
and the angles in float32, and eager attention takes its softmax in float32. Each of those
loses about 1e-7 relative, which would hide any float64 disagreement below that. The float64
cases are therefore run under `float64_faithful()`, which replaces those three computations by
the same operations in the working dtype (recorded in each case's meta). For float32 inputs the
replacements perform exactly HF's operations: build() checks that the float32 logits are
bit-identical with and without them.

Weights are spread as in gpt.py (N(0, 0.3^2), norm weights 1 + N(0, 0.2^2)) so attention is far
from uniform.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from common import DTYPES, generator
from gpt import hf_config_dict, hf_lm_loss, lm_case, spread_weights

FILE = "llama.py"

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64: LlamaRMSNorm.forward (HF casts to float32), "
    "LlamaRotaryEmbedding.forward (HF builds inv_freq and the angles in float32) and the eager "
    "attention softmax (HF uses dtype=float32) compute in the model's dtype; float32 cases run "
    "HF unpatched (the patch is bit-identical there, checked when generating)")

# name, seed, LlamaConfig changes, right padding
CASES = [
    ("llama_gqa", 90, {"num_key_value_heads": 2}, False),
    ("llama_mqa_tied", 91, {"num_key_value_heads": 1, "head_dim": 6, "rope_theta": 500.0,
                            "tie_word_embeddings": True}, False),
    ("llama_mha_biases", 92, {"num_key_value_heads": 4, "attention_bias": True,
                              "mlp_bias": True, "rms_norm_eps": 1e-5}, False),
    ("llama_gqa_tied_padded", 93, {"num_key_value_heads": 2, "tie_word_embeddings": True,
                                   "pad_token_id": 0}, True),
]
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=16, bos_token_id=1,
             eos_token_id=2, attn_implementation="eager")


def _rms_norm_in_working_dtype(self, hidden_states):
    """w * x / sqrt(mean(x^2) + eps), every step in x's dtype."""
    mean_square = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(mean_square + self.variance_epsilon))


def _rotary_in_working_dtype(self, x, position_ids):
    """cos and sin of position * base^(-2i/D), concatenated twice, every step in x's dtype."""
    head_dim = 2 * self.inv_freq.shape[0]
    base = self.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=x.dtype) / head_dim))
    angles = position_ids[..., None].to(x.dtype) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling


def _eager_attention_in_working_dtype(module, query, key, value, attention_mask, scaling,
                                      dropout=0.0, **kwargs):
    """HF's eager attention with the softmax taken in the query's dtype."""
    from transformers.models.llama.modeling_llama import repeat_kv

    keys = repeat_kv(key, module.num_key_value_groups)
    values = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.dropout(F.softmax(scores, dim=-1), p=dropout, training=module.training)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def float64_faithful(modeling=None, prefix: str = "Llama", rotary=_rotary_in_working_dtype):
    """Swap in the three working-dtype computations for the duration of the block, in
    `modeling` (default transformers' modeling_llama), whose classes are named `prefix`RMSNorm
    and `prefix`RotaryEmbedding; `rotary` replaces the rotary embedding's forward."""
    if modeling is None:
        from transformers.models.llama import modeling_llama as modeling

    norm, embedding = getattr(modeling, f"{prefix}RMSNorm"), \
        getattr(modeling, f"{prefix}RotaryEmbedding")
    saved = (norm.forward, embedding.forward, modeling.eager_attention_forward)
    norm.forward = _rms_norm_in_working_dtype
    embedding.forward = rotary
    modeling.eager_attention_forward = _eager_attention_in_working_dtype
    try:
        yield
    finally:
        norm.forward, embedding.forward, modeling.eager_attention_forward = saved


def _check_patch_is_exact_in_float32(model, ids, mask, faithful=float64_faithful):
    """The replacements only remove casts: on a float32 model they change no bit."""
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with faithful():
            patched = model(input_ids=ids, attention_mask=mask).logits
    if not torch.equal(plain, patched):
        raise AssertionError("float64_faithful() changed HF's float32 logits by "
                             f"{(plain - patched).abs().max().item():.3g}")


def build(out_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    paths = []
    for dtype in DTYPES:
        for name, seed, changes, padded in CASES:
            g = generator(seed)
            hf_config = LlamaConfig(**SMALL, **changes)
            model = LlamaForCausalLM(hf_config).to(DTYPES[dtype]).eval()
            spread_weights(model, g, dtype)
            ids = torch.randint(0, hf_config.vocab_size, (2, 9), generator=g)
            mask = None
            if padded:
                mask = torch.ones(2, 9, dtype=torch.long)
                mask[1, 6:] = 0
                ids[1, 6:] = hf_config.pad_token_id
            path = out_dir / f"{name}_{dtype}.npz"
            if dtype == "float32":
                _check_patch_is_exact_in_float32(model, ids, mask)
                paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                     "hf_llama", seed, dtype, hf_lm_loss, FILE))
            else:
                with float64_faithful():
                    paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                         "hf_llama", seed, dtype, hf_lm_loss, FILE,
                                         {"float64": FLOAT64_CONVENTION}))
    return paths
