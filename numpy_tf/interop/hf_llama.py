"""numpy_tf.interop's tables for the Llama-shaped Hugging Face families: Llama, Mistral, Qwen2,
Qwen3 and Phi-3, each read into a LlamaConfig (numpy_tf.models.llama) and mapped onto its names.

    model_type  what it adds to Llama                      LlamaConfig
    llama       (attention_bias, mlp_bias, head_dim)        as HF's
    mistral     a sliding window                           sliding_window=W
    qwen2       biases on q_proj, k_proj, v_proj only      attention_bias=True,
                                                           attention_output_bias=False
    qwen3       q_norm, k_norm per head before RoPE;       qk_norm=True
                head_dim its own (128 by default)
    phi3        qkv_proj = [q_proj; k_proj; v_proj]         (the layout splits and joins them)
                gate_up_proj = [gate_proj; up_proj]

numpy_tf's names are HF's without the `model.` prefix (lm_head has none); nothing is
transposed. Phi-3's fused weights are split along their rows on load (qkv_proj: H d, G d and
G d rows; gate_up_proj: I and I, as HF's forward slices and chunks them) and joined on export,
gradients too. Every family's RoPE is read by interop/hf_rope.py (scaled RoPE included).

Refused by name: a hidden_act other than silu, pretraining_tp > 1, sliding-window attention
(a Qwen2 / Qwen3 layer of type "sliding_attention": use_sliding_window=True makes the layers
from max_window_layers on sliding; a Phi-3 or Llama sliding_window), partial rotary. Phi-3's longrope (128k context) is read as a scaled
RoPE. Dropout that acts only in training
(Phi-3's resid_pdrop, embd_pdrop) is not carried over: numpy_tf's model is HF's in eval mode;
attention_dropout is.
"""
from __future__ import annotations

from typing import Mapping

from ..models.llama import LlamaConfig
from .hf_rope import read_rope
from .layout import Layout


def _refuse_common(config: Mapping, model_type: str, window: bool = False) -> None:
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']!r} is not implemented (numpy_tf's "
                         "Llama MLP is SwiGLU: hidden_act 'silu')")
    if (config.get("pretraining_tp") or 1) != 1:
        raise ValueError(f"pretraining_tp={config['pretraining_tp']!r} is not implemented "
                         "(numpy_tf needs pretraining_tp=1: the exact, unsliced projections)")
    if not window and "use_sliding_window" not in config and config.get("sliding_window"):
        raise ValueError(f"sliding_window={config['sliding_window']!r} is not implemented for "
                         f"{model_type} (numpy_tf's Llama attends to every earlier position; "
                         "model_type 'mistral' reads a sliding_window)")
    layer_types = config.get("layer_types")
    if layer_types is None and config.get("use_sliding_window") and \
            config.get("sliding_window") is not None:     # HF's rule when it is left out
        first = config.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if i >= first else "full_attention"
                       for i in range(config["num_hidden_layers"])]
    other = sorted(set(layer_types or []) - {"full_attention"})
    if other:
        raise ValueError(f"layer_types {other} are not implemented (numpy_tf's Llama has "
                         "full_attention layers only: sliding-window attention, "
                         f"use_sliding_window={config.get('use_sliding_window')!r} with "
                         f"max_window_layers={config.get('max_window_layers')!r}, is not)")


def _llama_like(config: Mapping, model_type: str, **fields) -> LlamaConfig:
    _refuse_common(config, model_type, window="sliding_window" in fields)
    heads = config["num_attention_heads"]
    theta, scaling = read_rope(config)
    values = dict(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        attention_bias=config.get("attention_bias", False),
        mlp_bias=config.get("mlp_bias", False),
        attention_dropout=config.get("attention_dropout") or 0.0,
        pad_token_id=config.get("pad_token_id"),
        initializer_range=config.get("initializer_range", 0.02))
    values.update(fields)
    return LlamaConfig(**values)


def llama_config(config: Mapping) -> LlamaConfig:
    """numpy_tf's LlamaConfig for a Hugging Face LlamaConfig dict, or a MistralConfig dict
    (model_type "mistral": Llama with a sliding window, query i seeing keys j > i - W; None:
    every earlier key); refuses what we lack."""
    if config.get("model_type") == "mistral":
        return _llama_like(config, "mistral", sliding_window=config.get("sliding_window"))
    return _llama_like(config, "llama")


def qwen2_config(config: Mapping) -> LlamaConfig:
    """A Qwen2Config dict: q, k and v projections with biases, o_proj without, no MLP bias
    (HF's Qwen2 has no attention_bias option: the biases are always there)."""
    return _llama_like(config, "qwen2", attention_bias=True, attention_output_bias=False,
                       mlp_bias=False)


def qwen3_config(config: Mapping) -> LlamaConfig:
    """A Qwen3Config dict: q_norm and k_norm per head; attention_bias on all four
    projections when set; no MLP bias; head_dim as given (HF's default 128)."""
    return _llama_like(config, "qwen3", qk_norm=True, mlp_bias=False,
                       head_dim=config.get("head_dim") or 128)


def phi3_config(config: Mapping) -> LlamaConfig:
    """A Phi3Config dict: no biases; its fused projections are the layout's business."""
    return _llama_like(config, "phi3", attention_bias=False, mlp_bias=False)


def llama_layout(config: LlamaConfig, fused: bool = False) -> Layout:
    """numpy_tf's names are HF's without the `model.` prefix (lm_head has none); nothing is
    transposed. Rows in HF's state_dict order. fused: Phi-3's qkv_proj and gate_up_proj."""
    rows = [("embed_tokens.weight", "model.embed_tokens.weight", False)]
    for i in range(config.num_hidden_layers):
        layer = f"layers.{i}."
        names = []
        if fused:       # HF's Phi3Attention makes o_proj before qkv_proj
            rows.append((f"{layer}self_attn.o_proj.weight",
                         f"model.{layer}self_attn.o_proj.weight", False))
            rows.append((tuple(f"{layer}self_attn.{p}_proj.weight" for p in "qkv"),
                         f"model.{layer}self_attn.qkv_proj.weight", False))
        else:
            for projection, bias in [("q_proj", config.attention_bias),
                                     ("k_proj", config.attention_bias),
                                     ("v_proj", config.attention_bias),
                                     ("o_proj", config.output_bias)]:
                names += [f"self_attn.{projection}.{p}" for p in ("weight", "bias")[:1 + bias]]
            if config.qk_norm:
                names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        rows += [(layer + name, f"model.{layer}{name}", False) for name in names]
        if fused:
            rows.append(((f"{layer}mlp.gate_proj.weight", f"{layer}mlp.up_proj.weight"),
                         f"model.{layer}mlp.gate_up_proj.weight", False))
            names = ["mlp.down_proj.weight"]
        else:
            names = [f"mlp.{projection}.{p}" for projection in ("gate_proj", "up_proj",
                                                                "down_proj")
                     for p in ("weight", "bias")[:1 + config.mlp_bias]]
        names += ["input_layernorm.weight", "post_attention_layernorm.weight"]
        rows += [(layer + name, f"model.{layer}{name}", False) for name in names]
    rows += [("norm.weight", "model.norm.weight", False),
             ("lm_head.weight", "lm_head.weight", False)]
    return Layout(rows)


def llama_buffer(key: str) -> bool:
    """The rotary inv_freq buffers older transformers versions saved in the state_dict."""
    return key.endswith(".rotary_emb.inv_freq")
