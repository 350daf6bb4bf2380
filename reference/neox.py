"""Fixtures for GPT-NeoX / Pythia: Hugging Face GPTNeoXForCausalLM built offline from small
GPTNeoXConfigs with random weights (never downloaded): parallel and sequential residuals, a
quarter, a half and all of each head rotated (rotary_pct 0.25, 0.5, 1.0), with and without
attention biases, tied and untied heads, and right padding. Each case holds the logits, the
mean next-token cross-entropy and every parameter gradient of that loss (the head under
transformers 5's name, lm_head.weight; query_key_value in NeoX's per-head layout, as HF
holds it).

float32 cases run HF's model exactly as it ships. In a float64 model HF still computes two
things in float32: the rotary embedding builds inv_freq and the angles in float32 (and casts
cos and sin to the model's dtype afterwards), and eager attention takes its softmax in
float32. LayerNorm, the exact GELU and the Linears compute in float64. The float64 cases are
run under `float64_faithful()`, which replaces those two computations by the same operations
in the working dtype (recorded in each case's meta); build() checks that on the float32 model
they change no bit of the logits.

Weights are spread as in gpt.py (N(0, 0.3^2), LayerNorm weights 1 + N(0, 0.2^2)) so attention
is far from uniform.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from common import DTYPES, generator, meta, normal, randomize, run_module_case, save_case
from gpt import hf_config_dict, hf_lm_loss, lm_case, spread_weights

FILE = "neox.py"

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64: GPTNeoXRotaryEmbedding.forward (HF builds "
    "inv_freq and the angles in float32) and the eager attention softmax (HF uses "
    "dtype=float32) compute in the model's dtype; float32 cases run HF unpatched (the patch is "
    "bit-identical there, checked when generating)")

# name, seed, GPTNeoXConfig changes, right padding
CASES = [
    ("neox_parallel", 100, {"rotary_pct": 0.25}, False),
    ("neox_sequential", 101, {"use_parallel_residual": False, "rotary_pct": 0.5,
                              "rotary_emb_base": 100}, False),
    ("neox_full_rotary_tied", 102, {"rope_parameters": {
        "rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0},
        "tie_word_embeddings": True}, False),
    ("neox_no_bias_padded", 103, {"attention_bias": False, "num_attention_heads": 4,
                                  "rotary_pct": 0.5, "pad_token_id": 0}, True),
]
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=2, max_position_embeddings=16, bos_token_id=1,
             eos_token_id=2, attn_implementation="eager")


def _rotary_in_working_dtype(self, x, position_ids):
    """cos and sin of position * base^(-2i/R), concatenated twice, every step in x's dtype
    (R = 2 len(inv_freq), the rotated features of a head)."""
    rotary_dim = 2 * self.inv_freq.shape[0]
    base = self.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=x.dtype) / rotary_dim))
    angles = position_ids[..., None].to(x.dtype) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling


def _eager_attention_in_working_dtype(module, query, key, value, attention_mask, scaling,
                                      dropout=0.0, **kwargs):
    """HF's eager attention with the softmax taken in the query's dtype."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.dropout(F.softmax(scores, dim=-1), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def float64_faithful():
    """Swap in the two working-dtype computations for the duration of the block."""
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    saved = (neox.GPTNeoXRotaryEmbedding.forward, neox.eager_attention_forward)
    neox.GPTNeoXRotaryEmbedding.forward = _rotary_in_working_dtype
    neox.eager_attention_forward = _eager_attention_in_working_dtype
    try:
        yield
    finally:
        neox.GPTNeoXRotaryEmbedding.forward, neox.eager_attention_forward = saved


def _check_patch_is_exact_in_float32(model, ids, mask):
    """The replacements only remove casts: on a float32 model they change no bit."""
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with float64_faithful():
            patched = model(input_ids=ids, attention_mask=mask).logits
    if not torch.equal(plain, patched):
        raise AssertionError("float64_faithful() changed HF's float32 logits by "
                             f"{(plain - patched).abs().max().item():.3g}")


# the attention layer alone: name, seed, GPTNeoXConfig changes (hidden 16, heads of 8)
ATTENTION_CASES = [
    ("neox_attention", 110, {"rotary_pct": 0.5, "rotary_emb_base": 100}),
    ("neox_attention_quarter_nobias", 111, {"rotary_pct": 0.25, "attention_bias": False}),
]


def _attention_case(out_dir, name, seed, changes, dtype):
    """HF's GPTNeoXAttention with the rotary tables of GPTNeoXRotaryEmbedding and a causal
    mask, on x (2, 5, 16): its output, the input gradient and the gradients of
    query_key_value and dense (HF's names, which are numpy_tf's NeoXAttention's)."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import (GPTNeoXAttention,
                                                                 GPTNeoXRotaryEmbedding)

    hf_config = GPTNeoXConfig(**{**SMALL, **changes})
    g = generator(seed)
    module = randomize(GPTNeoXAttention(hf_config, layer_idx=0).to(DTYPES[dtype]), g, dtype,
                       std=0.5).eval()
    rotary = GPTNeoXRotaryEmbedding(hf_config)

    def call(attention, x):
        length = x.shape[1]
        cos_sin = rotary(x, torch.arange(length)[None])
        causal = torch.full((length, length), float("-inf"), dtype=x.dtype).triu(1)
        return attention(x, attention_mask=causal[None, None], position_embeddings=cos_sin)[0]

    inputs = {"x": normal(g, (2, 5, hf_config.hidden_size), dtype)}
    config = {"hidden_size": hf_config.hidden_size,
              "num_attention_heads": hf_config.num_attention_heads,
              "rotary_dim": int(hf_config.hidden_size // hf_config.num_attention_heads
                                * hf_config.rope_parameters["partial_rotary_factor"]),
              "rope_theta": hf_config.rope_parameters["rope_theta"],
              "attention_bias": hf_config.attention_bias}
    extra = {"conventions": {"float64": FLOAT64_CONVENTION}} if dtype == "float64" else {}
    with float64_faithful() if dtype == "float64" else contextlib.nullcontext():
        arrays = run_module_case(module, inputs, g, dtype, call=call)
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "neox_attention", seed, dtype, config, ["x"], **extra), arrays)


def build(out_dir):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    paths = []
    for dtype in DTYPES:
        for name, seed, changes in ATTENTION_CASES:
            paths.append(_attention_case(out_dir, name, seed, changes, dtype))
    for dtype in DTYPES:
        for name, seed, changes, padded in CASES:
            g = generator(seed)
            hf_config = GPTNeoXConfig(**{**SMALL, **changes})
            model = GPTNeoXForCausalLM(hf_config).to(DTYPES[dtype]).eval()
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
                                     "hf_gpt_neox", seed, dtype, hf_lm_loss, FILE))
            else:
                with float64_faithful():
                    paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                         "hf_gpt_neox", seed, dtype, hf_lm_loss, FILE,
                                         {"float64": FLOAT64_CONVENTION}))
    return paths
