"""numpy_tf.interop's tables for Hugging Face Mixtral (MixtralForCausalLM): its config read into
a MixtralConfig, and its two weight layouts.

numpy_tf's names are transformers 5's without the `model.` prefix (lm_head has none), nothing
transposed, one tensor for one tensor:

    model.layers.i.mlp.gate.weight            (E, C)       the router
    model.layers.i.mlp.experts.gate_up_proj   (E, 2F, C)   [W_gate[e]; W_up[e]] per expert
    model.layers.i.mlp.experts.down_proj      (E, C, F)    W_down[e]

The checkpoints on the hub (and transformers before version 5) keep each expert's three
Linears apart, under block_sparse_moe:

    model.layers.i.block_sparse_moe.gate.weight          (E, C)   the router
    model.layers.i.block_sparse_moe.experts.e.w1.weight  (F, C)   W_gate[e]
    model.layers.i.block_sparse_moe.experts.e.w3.weight  (F, C)   W_up[e]
    model.layers.i.block_sparse_moe.experts.e.w2.weight  (C, F)   W_down[e]

so gate_up_proj[e] = concatenate(w1, w3) along the rows and down_proj[e] = w2 (transformers 5
joins them so when it loads a hub checkpoint). from_hf reads either layout (detected by the
block_sparse_moe keys); to_hf writes transformers 5's, and `hub_layout(to_hf(model, config))`
turns its output (weights or gradients) into the hub's names.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..models.mixtral import MixtralConfig
from .layout import Layout

HUB_PART = ".block_sparse_moe."


def _rope_theta(config: Mapping) -> float:
    """rope_theta from transformers 5's `rope_parameters` or an older config's `rope_theta`
    (Mixtral's default 1e6); a scaled RoPE is refused."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for where, table in (("rope_parameters", parameters), ("rope_scaling", scaling)):
        rope_type = table.get("rope_type", table.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{where} has rope_type {rope_type!r}: scaled RoPE is not "
                             "implemented for Mixtral (rope_type 'default' only)")
    theta = parameters.get("rope_theta", config.get("rope_theta", 1e6))
    if config.get("rope_theta") is not None and config["rope_theta"] != theta:
        raise ValueError(f"rope_theta ({config['rope_theta']!r}) and rope_parameters' "
                         f"rope_theta ({theta!r}) disagree")
    return theta


def mixtral_config(config: Mapping) -> MixtralConfig:
    """numpy_tf's MixtralConfig for a Hugging Face MixtralConfig dict; refuses, by name, what
    numpy_tf lacks: a scaled RoPE, an activation other than silu, router jitter noise. A
    sliding_window is Mistral's window (LlamaConfig's), in the forward and in cached decoding."""
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']!r} is not implemented (numpy_tf's "
                         "Mixtral experts are SwiGLU: hidden_act 'silu')")
    if config.get("router_jitter_noise") or 0.0:
        raise ValueError(f"router_jitter_noise={config['router_jitter_noise']!r} is not "
                         "implemented: HF multiplies the router's input by uniform noise in "
                         "training mode, numpy_tf's Mixtral never does (HF in eval mode ignores "
                         "it: set it to 0.0 to read the weights)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"{key}={config[key]!r} is not implemented (Mixtral has no biases)")
    heads = config["num_attention_heads"]
    return MixtralConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        num_local_experts=config.get("num_local_experts", 8),
        num_experts_per_tok=config.get("num_experts_per_tok", 2),
        router_aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
        output_router_logits=bool(config.get("output_router_logits", False)),
        rms_norm_eps=config.get("rms_norm_eps", 1e-5), rope_theta=_rope_theta(config),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        max_position_embeddings=config.get("max_position_embeddings", 4096 * 32),
        attention_dropout=config.get("attention_dropout") or 0.0,
        sliding_window=config.get("sliding_window"), pad_token_id=config.get("pad_token_id"),
        initializer_range=config.get("initializer_range", 0.02))


class MixtralLayout(Layout):
    """transformers 5's names, one for one; to_ours also takes the hub's per-expert layout."""

    def __init__(self, config: MixtralConfig):
        ours = ["embed_tokens.weight"]
        for i in range(config.num_hidden_layers):
            ours += [f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"]
            ours += [f"layers.{i}.mlp.gate.weight", f"layers.{i}.mlp.experts.gate_up_proj",
                     f"layers.{i}.mlp.experts.down_proj", f"layers.{i}.input_layernorm.weight",
                     f"layers.{i}.post_attention_layernorm.weight"]
        ours += ["norm.weight", "lm_head.weight"]
        super().__init__([(name, name if name == "lm_head.weight" else f"model.{name}", False)
                          for name in ours])
        self.config = config

    def to_ours(self, state, expected, dtype, optional, ignored):
        if any(HUB_PART in key for key in state):
            state = from_hub_layout(state, self.config)
        return super().to_ours(state, expected, dtype, optional, ignored)


def from_hub_layout(state: Mapping[str, np.ndarray], config: MixtralConfig) -> dict:
    """A hub checkpoint's state_dict (block_sparse_moe, experts.e.w1 / w2 / w3) under
    transformers 5's names; every other key passes through. A missing expert tensor, a shape
    that does not fit, an expert beyond num_local_experts or a layer given in both layouts is
    an error naming the keys."""
    experts, hidden, width = (config.num_local_experts, config.intermediate_size,
                              config.hidden_size)
    out = {key: value for key, value in state.items() if HUB_PART not in key}
    used, missing, mismatched, doubled = set(), [], [], []
    want = {"w1": (hidden, width), "w3": (hidden, width), "w2": (width, hidden)}
    for i in range(config.num_hidden_layers):
        hub, ours = f"model.layers.{i}{HUB_PART}", f"model.layers.{i}.mlp."
        keys = {"gate": f"{hub}gate.weight"}
        keys.update({(part, e): f"{hub}experts.{e}.{part}.weight"
                     for e in range(experts) for part in ("w1", "w3", "w2")})
        present = [key for key in keys.values() if key in state]
        if not present:
            continue                    # this layer is in transformers 5's names, or missing
        used.update(present)
        missing += [key for key in keys.values() if key not in state]
        for (part, _), key in ((k, v) for k, v in keys.items() if k != "gate"):
            if key in state and np.shape(state[key]) != want[part]:
                mismatched.append(f"{key}: expected shape {want[part]}, got "
                                  f"{np.shape(state[key])}")
        doubled += [name for name in (f"{ours}gate.weight", f"{ours}experts.gate_up_proj",
                                      f"{ours}experts.down_proj") if name in state]
        if any(key not in state for key in keys.values()) or mismatched:
            continue
        out[f"{ours}gate.weight"] = state[keys["gate"]]
        out[f"{ours}experts.gate_up_proj"] = np.stack([
            np.concatenate([state[keys["w1", e]], state[keys["w3", e]]], axis=0)
            for e in range(experts)])                                       # (E, 2F, C)
        out[f"{ours}experts.down_proj"] = np.stack([state[keys["w2", e]]
                                                    for e in range(experts)])  # (E, C, F)
    unexpected = [key for key in state if HUB_PART in key and key not in used]
    problems = []
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected) + f" (the config has "
                        f"{config.num_hidden_layers} layers of {experts} experts)")
    if mismatched:
        problems.append("mismatched: " + "; ".join(mismatched))
    if doubled:
        problems.append("given in both layouts (block_sparse_moe and mlp): " + ", ".join(doubled))
    if problems:
        raise ValueError("the state_dict does not fit this config: " + " | ".join(problems))
    return out


def hub_layout(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers 5's Mixtral names (to_hf's output, weights or gradients) -> the hub's
    per-expert names: mlp.gate -> block_sparse_moe.gate, gate_up_proj[e] split into w1 (its
    first F rows) and w3, down_proj[e] -> w2. Every other key passes through, in order."""
    out = {}
    for key, value in state.items():
        head, _, tail = key.partition(".mlp.")
        if not tail:
            out[key] = value
        elif tail == "gate.weight":
            out[f"{head}{HUB_PART}gate.weight"] = value
        elif tail == "experts.gate_up_proj":
            hidden = value.shape[1] // 2
            for e, joined in enumerate(value):
                out[f"{head}{HUB_PART}experts.{e}.w1.weight"] = joined[:hidden]
                out[f"{head}{HUB_PART}experts.{e}.w3.weight"] = joined[hidden:]
        elif tail == "experts.down_proj":
            for e, down in enumerate(value):
                out[f"{head}{HUB_PART}experts.{e}.w2.weight"] = down
        else:
            raise ValueError(f"{key} is not a Mixtral weight of transformers 5's layout")
    return out


def mixtral_layout(config: Mapping) -> MixtralLayout:
    return MixtralLayout(mixtral_config(config))


def mixtral_buffer(key: str) -> bool:
    """The rotary inv_freq buffers older transformers versions saved in the state_dict."""
    return key.endswith(".rotary_emb.inv_freq")
