"""numpy_tf.interop's tables for Hugging Face GPT-NeoX / Pythia (GPTNeoXForCausalLM): its config
read into a NeoXConfig, and its names mapped onto numpy_tf's GPTNeoX.

numpy_tf's names are HF's without the `gpt_neox.` prefix, and nothing is transposed or
permuted: numpy_tf's query_key_value keeps NeoX's per-head layout (output rows grouped per head
as [q_h | k_h | v_h]), so its weight, bias and gradients are HF's arrays as they are. The head
is `lm_head.weight` in transformers 5 and `embed_out.weight` in every GPT-NeoX and Pythia
checkpoint (and transformers 4): either is read (both, when equal), and to_hf writes
transformers 5's state_dict, with lm_head.weight.

Config: transformers 5 keeps the rotary part and base in `rope_parameters`
({"rope_type": "default", "rope_theta": ..., "partial_rotary_factor": ...}); older configs say
`rotary_pct` and `rotary_emb_base` (HF's defaults: 0.25 and 10000). Scaled RoPE (any other
rope_type), an explicit head_dim other than hidden_size / num_attention_heads, and a
hidden_act numpy_tf lacks are refused by name. hidden_dropout is not carried over (numpy_tf's
model equals HF's in eval mode); attention_dropout is, as Llama's.
"""
from __future__ import annotations

from typing import Mapping

from ..models.neox import HIDDEN_ACTS, NeoXConfig
from .layout import Layout

_ROTARY_DEFAULTS = {"partial_rotary_factor": ("rotary_pct", 0.25),
                    "rope_theta": ("rotary_emb_base", 10000.0)}


def _rope(config: Mapping) -> tuple[float, float]:
    """(rotary_pct, rope_theta) from rope_parameters or the older top-level keys; any scaled
    RoPE is refused, and two places that disagree are an error."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for where, table in (("rope_parameters", parameters), ("rope_scaling", scaling)):
        rope_type = table.get("rope_type", table.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{where} has rope_type {rope_type!r}: scaled RoPE is not "
                             "implemented (numpy_tf's GPT-NeoX supports rope_type 'default' "
                             "only)")
    values = []
    for key, (old_key, default) in _ROTARY_DEFAULTS.items():
        value = parameters.get(key, config.get(old_key, config.get(key, default)))
        for other in (old_key, key):
            if config.get(other) is not None and config[other] != value:
                raise ValueError(f"{other} ({config[other]!r}) and rope_parameters' {key} "
                                 f"({value!r}) disagree")
        values.append(value)
    return values[0], float(values[1])


def neox_config(config: Mapping) -> NeoXConfig:
    """numpy_tf's NeoXConfig for a Hugging Face GPTNeoXConfig dict; refuses what we lack."""
    activation = config.get("hidden_act", "gelu")
    if activation not in HIDDEN_ACTS:
        raise ValueError(f"hidden_act {activation!r} is not implemented; numpy_tf's GPT-NeoX "
                         f"supports {', '.join(HIDDEN_ACTS)}")
    heads, width = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim")
    if head_dim is not None and (width % heads or head_dim != width // heads):
        raise ValueError(f"head_dim={head_dim!r} is not implemented: GPT-NeoX's heads are "
                         f"hidden_size / num_attention_heads = {width} / {heads} wide")
    rotary_pct, rope_theta = _rope(config)
    return NeoXConfig(
        vocab_size=config["vocab_size"], hidden_size=width,
        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
        intermediate_size=config["intermediate_size"], hidden_act=activation,
        rotary_pct=rotary_pct, rope_theta=rope_theta,
        layer_norm_eps=config.get("layer_norm_eps", 1e-5),
        use_parallel_residual=config.get("use_parallel_residual", True),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        attention_bias=config.get("attention_bias", True),
        attention_dropout=config.get("attention_dropout") or 0.0,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        initializer_range=config.get("initializer_range", 0.02))


def neox_layout(config: NeoXConfig) -> Layout:
    """One row per tensor, HF's name = `gpt_neox.` + numpy_tf's, in HF's state_dict order;
    the head is lm_head.weight, or embed_out.weight as checkpoints name it (written as
    lm_head.weight only)."""
    ours = ["embed_in.weight"]
    for i in range(config.num_hidden_layers):
        for module, bias in [("input_layernorm", True), ("post_attention_layernorm", True),
                             ("attention.query_key_value", config.attention_bias),
                             ("attention.dense", config.attention_bias),
                             ("mlp.dense_h_to_4h", True), ("mlp.dense_4h_to_h", True)]:
            ours += [f"layers.{i}.{module}.{p}" for p in ("weight", "bias")[:1 + bias]]
    ours += ["final_layer_norm.weight", "final_layer_norm.bias"]
    rows = [(name, f"gpt_neox.{name}", False) for name in ours]
    rows += [("embed_out.weight", "lm_head.weight", False),
             ("embed_out.weight", "embed_out.weight", False)]
    return Layout(rows, order=[their for _, their, _ in rows[:-1]])


def neox_ties(config: Mapping) -> list[tuple[str, str]]:
    return [("embed_out.weight", "embed_in.weight")] \
        if config.get("tie_word_embeddings", False) else []


def neox_buffer(key: str) -> bool:
    """What transformers 4 saved beside the weights: the causal-mask buffers and the rotary
    inv_freq."""
    return key.endswith((".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq"))
