"""numpy_tf.interop's tables for Hugging Face Gemma and Gemma2 (GemmaForCausalLM,
Gemma2ForCausalLM): the config read into a GemmaConfig, refusing what numpy_tf lacks, and the
names, which are HF's without the `model.` prefix (lm_head has none; nothing is transposed):

    embed_tokens.weight, norm.weight, lm_head.weight (the embedding, unless untied)
    layers.i.self_attn.{q,k,v,o}_proj.weight (.bias with attention_bias)
    layers.i.mlp.{gate,up,down}_proj.weight
    layers.i.input_layernorm.weight, layers.i.post_attention_layernorm.weight
    Gemma2 also: layers.i.pre_feedforward_layernorm.weight, .post_feedforward_layernorm.weight

The embedding's scale (HF's non-persistent embed_scale buffer) is no weight: numpy_tf computes
sqrt(hidden_size) in the model's dtype.
"""
from __future__ import annotations

from typing import Mapping

from ..models.gemma import GemmaConfig, alternating_layer_types
from .hf_rope import read_rope
from .layout import Layout

TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")   # one formula, x (1 + tanh(u)) / 2


def _rope_theta(config: Mapping) -> float:
    """The RoPE base; a scaled RoPE is refused (Gemma's rotary tables are the default ones)."""
    theta, scaling = read_rope(config)
    if scaling is not None:
        raise ValueError(f"{config.get('model_type')} has rope_type {scaling.rope_type!r}: "
                         "scaled RoPE is not implemented (numpy_tf's Gemma uses rope_type "
                         "'default')")
    return theta


def gemma_config(config: Mapping) -> GemmaConfig:
    """numpy_tf's GemmaConfig for a Hugging Face GemmaConfig or Gemma2Config dict."""
    model_type = config.get("model_type")
    gemma2 = model_type == "gemma2"
    key = "hidden_activation" if gemma2 else "hidden_act"      # the key each HF MLP reads
    activation = config.get(key) or "gelu_pytorch_tanh"
    if activation not in TANH_GELU:
        raise ValueError(f"{key} {activation!r} is not implemented (numpy_tf's Gemma MLP is "
                         "GeGLU with the tanh GELU: gelu_pytorch_tanh)")
    if config.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True is not implemented (numpy_tf's "
                         "Gemma is a causal decoder)")
    if not gemma2:
        for key in ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping"):
            if config.get(key) is not None:
                raise ValueError(f"{key}={config[key]!r} is not a Gemma option: numpy_tf "
                                 "reads it for model_type 'gemma2'")
    heads = config["num_attention_heads"]
    layers = config["num_hidden_layers"]
    options = {}
    if gemma2:
        options = dict(
            query_pre_attn_scalar=config.get("query_pre_attn_scalar", 256),
            attn_logit_softcapping=config.get("attn_logit_softcapping"),
            final_logit_softcapping=config.get("final_logit_softcapping"),
            sliding_window=config.get("sliding_window"),
            layer_types=config.get("layer_types") or alternating_layer_types(layers))
    return GemmaConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(config),
        tie_word_embeddings=config.get("tie_word_embeddings", True),
        max_position_embeddings=config.get("max_position_embeddings", 8192),
        attention_bias=config.get("attention_bias", False),
        attention_dropout=config.get("attention_dropout") or 0.0,
        pad_token_id=config.get("pad_token_id"),
        initializer_range=config.get("initializer_range", 0.02),
        model_type="gemma2" if gemma2 else "gemma", **options)


def gemma_layout(config: GemmaConfig) -> Layout:
    """Rows in HF's state_dict order."""
    norms = ["input_layernorm", "post_attention_layernorm"]
    if config.model_type == "gemma2":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    ours = ["embed_tokens.weight"]
    for i in range(config.num_hidden_layers):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            ours += [f"layers.{i}.self_attn.{projection}.{p}"
                     for p in ("weight", "bias")[:1 + config.attention_bias]]
        ours += [f"layers.{i}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
        ours += [f"layers.{i}.{norm}.weight" for norm in norms]
    ours += ["norm.weight", "lm_head.weight"]
    return Layout([(name, name if name == "lm_head.weight" else f"model.{name}", False)
                   for name in ours])
