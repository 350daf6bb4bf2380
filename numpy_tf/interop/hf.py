"""Exact converters between numpy_tf models and Hugging Face checkpoints.

    model = interop.from_hf(config, state_dict, dtype=np.float64)
        config: a Hugging Face config as a dict (config.to_dict()) of model_type gpt2, llama,
        bert (BertForMaskedLM), gpt_neox, mistral, gemma, gemma2, mixtral, qwen2, qwen3 or
        phi3; state_dict: {HF key: numpy array} in HF layout (GPT-2's Conv1D weights are
        (in, out); BERT's query, key and value join into one in_proj_weight; Phi-3's qkv_proj
        and gate_up_proj are split)
    params = interop.to_hf(model, config)              # the loaded state_dict, bit for bit
    grads = interop.to_hf(model, config, grads=True)   # {HF key: gradient in HF layout}

Each layout is a table of (numpy_tf name, other name, transposed?) rows (interop/layout.py; the
BERT tables are in interop/hf_bert.py, the Llama-shaped families' (Llama, Mistral, Qwen2,
Qwen3, Phi-3) in interop/hf_llama.py, GPT-NeoX's in interop/hf_neox.py, Mixtral's in
interop/hf_mixtral.py, Gemma's in interop/hf_gemma.py); loading checks every key, shape and
config option first and names each problem. Options we do not implement are refused, never
guessed. HF_FAMILIES holds each family's config reader and layout under its
numpy_tf.models.registry name; the registry says which model_type values a family reads and
which class builds it.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import numpy as np

from ..core.module import Module, float_dtype
from ..models import registry
from ..models.gpt import GPTConfig
from .hf_bert import bert_buffer, bert_config, bert_layout
from .hf_neox import neox_buffer, neox_config, neox_layout, neox_ties
from .hf_mixtral import mixtral_buffer, mixtral_config, mixtral_layout
from .hf_gemma import gemma_config, gemma_layout
from .hf_llama import (llama_buffer, llama_config, llama_layout, phi3_config, qwen2_config,
                       qwen3_config)
from .layout import Layout

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                     "gelu": "gelu", "relu": "relu"}


# -- GPT-2 ------------------------------------------------------------------------------------
def gpt2_config(config: Mapping) -> GPTConfig:
    """numpy_tf's GPTConfig for a Hugging Face GPT2Config dict; refuses what we lack."""
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GPT2_ACTIVATIONS:
        raise ValueError(f"activation_function {activation!r} is not implemented; numpy_tf "
                         f"supports {', '.join(sorted(_GPT2_ACTIVATIONS))}")
    for key, supported in [("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx",
                                                          False), ("add_cross_attention", False)]:
        if config.get(key, supported) != supported:
            raise ValueError(f"{key}={config[key]!r} is not implemented (numpy_tf's GPT-2 "
                             f"needs {key}={supported!r})")
    width = config["n_embd"]
    return GPTConfig(vocab_size=config["vocab_size"], max_context=config["n_positions"],
                     width=width, heads=config["n_head"], layers=config["n_layer"],
                     hidden=config.get("n_inner") or 4 * width, attention_bias=True,
                     ffn_bias=True, activation=_GPT2_ACTIVATIONS[activation],
                     norm_eps=config.get("layer_norm_epsilon", 1e-5),
                     tied=config.get("tie_word_embeddings", True),
                     init_std=config.get("initializer_range", 0.02))


def gpt2_layout(layers: int) -> Layout:
    rows = [("tokens.weight", "transformer.wte.weight", False),
            ("positions.weight", "transformer.wpe.weight", False)]
    for i in range(layers):
        ours, hf = f"blocks.{i}.", f"transformer.h.{i}."
        for our_name, hf_name, transpose in [
                ("norm1.weight", "ln_1.weight", False), ("norm1.bias", "ln_1.bias", False),
                ("attention.qkv.weight", "attn.c_attn.weight", True),
                ("attention.qkv.bias", "attn.c_attn.bias", False),
                ("attention.output.weight", "attn.c_proj.weight", True),
                ("attention.output.bias", "attn.c_proj.bias", False),
                ("norm2.weight", "ln_2.weight", False), ("norm2.bias", "ln_2.bias", False),
                ("feedforward.0.weight", "mlp.c_fc.weight", True),
                ("feedforward.0.bias", "mlp.c_fc.bias", False),
                ("feedforward.2.weight", "mlp.c_proj.weight", True),
                ("feedforward.2.bias", "mlp.c_proj.bias", False)]:
            rows.append((ours + our_name, hf + hf_name, transpose))
    rows += [("final_norm.weight", "transformer.ln_f.weight", False),
             ("final_norm.bias", "transformer.ln_f.bias", False),
             ("output.weight", "lm_head.weight", False)]
    return Layout(rows)


def _gpt2_buffer(key: str) -> bool:
    """Causal-mask buffers older transformers versions kept in the state_dict."""
    return key.endswith(".attn.bias") or key.endswith(".attn.masked_bias")


# -- the entry points ---------------------------------------------------------------------------
def _family(config: Mapping) -> "HFFamily":
    """The HF_FAMILIES entry of the registered family whose model_type the config names."""
    if not isinstance(config, Mapping):
        raise TypeError("config must be a dict (a Hugging Face config's to_dict()); got "
                        f"{type(config).__name__}")
    model_type = config.get("model_type")
    family = registry.family_of_model_type(model_type)
    if family is None or family.name not in HF_FAMILIES:
        readable = sorted(t for name in HF_FAMILIES
                          for t in registry.FAMILIES[name].hf_model_types)
        raise ValueError(f"model_type {model_type!r} is not supported; numpy_tf reads "
                         f"{', '.join(readable)}")
    return HF_FAMILIES[family.name]


def config_from_hf(config: Mapping):
    """numpy_tf's config (GPTConfig, LlamaConfig, BertConfig) equal to a Hugging Face config
    dict, refusing every option numpy_tf lacks."""
    return _family(config).config(config)


def from_hf(config: Mapping, state_dict: Mapping[str, np.ndarray], dtype=np.float64) -> Module:
    """A numpy_tf model equal to the Hugging Face model of `config` with these weights."""
    family = _family(config)
    dtype = float_dtype(dtype)
    model = family.build(config, dtype)
    layout = family.layout(config)
    ties = family.ties(config)
    their_name: dict = {}
    for ours, their, _ in layout.rows:                  # a name's first row names it
        their_name.setdefault(ours, their)
    converted = layout.to_ours(state_dict, model.state_dict(), dtype,
                               optional={their_name[alias] for alias, _ in ties},
                               ignored=family.ignored)
    for alias, source in ties:
        if alias in converted and not np.array_equal(converted[alias], converted[source]):
            raise ValueError(f"{their_name[alias]} must equal {their_name[source]}: the config "
                             "ties them (tie_word_embeddings) but the state_dict differs")
        converted[alias] = converted[source]
    model.load_state_dict(converted)
    return model


def to_hf(model: Module, config: Mapping, grads: bool = False) -> dict[str, np.ndarray]:
    """The model's parameters (or, with grads=True, their gradients) under Hugging Face names
    and layout. A tied weight appears under both of its names."""
    family = _family(config)
    arrays = model.grad_dict() if grads else model.state_dict()
    return family.layout(config).to_theirs(arrays)


def _llama_ties(config: Mapping) -> list[tuple[str, str]]:
    return [("lm_head.weight", "embed_tokens.weight")] \
        if config.get("tie_word_embeddings", False) else []


class HFFamily(NamedTuple):
    """What reading one family's Hugging Face checkpoints takes (its model class is the
    registry's)."""
    name: str                                            # the registry's family name
    config: Callable[[Mapping], object]                  # HF config dict -> numpy_tf config
    layout: Callable[[Mapping], Layout]
    ties: Callable[[Mapping], list[tuple[str, str]]]     # (alias, source) numpy_tf names
    ignored: Callable[[str], bool]                       # keys that are buffers, not weights

    def build(self, config: Mapping, dtype) -> Module:
        return registry.FAMILIES[self.name].model_class(self.config(config), dtype=dtype)


# registry family name -> its HF layout (the family's model_types are in the registry)
HF_FAMILIES = {family.name: family for family in [
    HFFamily(
        "gpt", config=gpt2_config, layout=lambda config: gpt2_layout(config["n_layer"]),
        ties=lambda config: [("output.weight", "tokens.weight")]
        if config.get("tie_word_embeddings", True) else [],
        ignored=_gpt2_buffer),
    HFFamily(
        "bert", config=bert_config, layout=lambda config: bert_layout(bert_config(config)),
        ties=lambda config: [("mlm_head.decoder.weight", "embeddings.word_embeddings.weight")]
        if bert_config(config).tie_word_embeddings else [],
        ignored=bert_buffer),
    HFFamily(
        "llama", config=llama_config, layout=lambda config: llama_layout(llama_config(config)),
        ties=lambda config: _llama_ties(config), ignored=llama_buffer),
    HFFamily(
        "qwen2", config=qwen2_config, layout=lambda config: llama_layout(qwen2_config(config)),
        ties=lambda config: _llama_ties(config), ignored=llama_buffer),
    HFFamily(
        "qwen3", config=qwen3_config, layout=lambda config: llama_layout(qwen3_config(config)),
        ties=lambda config: _llama_ties(config), ignored=llama_buffer),
    HFFamily(
        "phi3", config=phi3_config,
        layout=lambda config: llama_layout(phi3_config(config), fused=True),
        ties=lambda config: _llama_ties(config), ignored=llama_buffer),
    HFFamily("neox", config=neox_config, layout=lambda config: neox_layout(neox_config(config)),
             ties=neox_ties, ignored=neox_buffer),
    HFFamily(
        "mixtral", config=mixtral_config, layout=mixtral_layout,
        ties=lambda config: [("lm_head.weight", "embed_tokens.weight")]
        if config.get("tie_word_embeddings", False) else [],
        ignored=mixtral_buffer),
    HFFamily(
        "gemma", config=gemma_config, layout=lambda config: gemma_layout(gemma_config(config)),
        ties=lambda config: [("lm_head.weight", "embed_tokens.weight")]
        if config.get("tie_word_embeddings", True) else [],
        ignored=llama_buffer),
]}
