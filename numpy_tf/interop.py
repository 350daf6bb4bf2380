"""Exact converters between numpy_tf models and other projects' layouts.

    model = interop.from_hf(config, state_dict, dtype=np.float64)
        config: a Hugging Face config as a dict (config.to_dict()); state_dict: {HF key: numpy
        array} in HF layout (GPT-2's Conv1D weights are (in, out))
    params = interop.to_hf(model, config)              # the loaded state_dict, bit for bit
    grads = interop.to_hf(model, config, grads=True)   # {HF key: gradient in HF layout}

Each layout is a table of (numpy_tf name, other name, transposed?) rows; loading checks every
key, shape and config option first and names each problem. Options we do not implement are
refused, never guessed.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import numpy as np

from .core import Module, float_dtype
from .gpt import GPT, GPTConfig

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                     "gelu": "gelu", "relu": "relu"}


class Layout:
    """Rows (numpy_tf name, their name, transposed?) of one family's weights."""

    def __init__(self, rows: list[tuple[str, str, bool]]):
        self.rows = rows

    def to_ours(self, state: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                dtype: np.dtype, optional: set[str], ignored: Callable[[str], bool]
                ) -> dict[str, np.ndarray]:
        """Their state_dict as numpy_tf's, after checking every key and shape."""
        theirs = {their for _, their, _ in self.rows}
        missing = [their for _, their, _ in self.rows if their not in state
                   and their not in optional]
        unexpected = [key for key in state if key not in theirs and not ignored(key)]
        mismatched, converted = [], {}
        for ours, their, transpose in self.rows:
            if their not in state:
                continue
            value = state[their]
            if not isinstance(value, np.ndarray):
                mismatched.append(f"{their}: expected a numpy array, got {type(value).__name__}")
                continue
            value = value.T if transpose else value
            if value.shape != expected[ours].shape:
                want = expected[ours].shape[::-1] if transpose else expected[ours].shape
                mismatched.append(f"{their}: expected shape {want}, got {state[their].shape}")
                continue
            converted[ours] = np.ascontiguousarray(value, dtype=dtype)
        problems = []
        if missing:
            problems.append("missing keys: " + ", ".join(missing))
        if unexpected:
            hint = " (these look like numpy_tf's own names: load them with " \
                   "model.load_state_dict)" if any(k in expected for k in unexpected) else ""
            problems.append("unexpected keys: " + ", ".join(unexpected) + hint)
        if mismatched:
            problems.append("mismatched: " + "; ".join(mismatched))
        if problems:
            raise ValueError("the state_dict does not fit this config: " + " | ".join(problems))
        return converted

    def to_theirs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for ours, their, transpose in self.rows:
            value = arrays[ours]
            out[their] = np.ascontiguousarray(value.T) if transpose else value
        return out


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
def _model_type(config: Mapping) -> str:
    if not isinstance(config, Mapping):
        raise TypeError("config must be a dict (a Hugging Face config's to_dict()); got "
                        f"{type(config).__name__}")
    model_type = config.get("model_type")
    if model_type not in _HF:
        raise ValueError(f"model_type {model_type!r} is not supported; numpy_tf reads "
                         f"{', '.join(sorted(_HF))}")
    return model_type


def from_hf(config: Mapping, state_dict: Mapping[str, np.ndarray], dtype=np.float64) -> Module:
    """A numpy_tf model equal to the Hugging Face model of `config` with these weights."""
    family = _HF[_model_type(config)]
    dtype = float_dtype(dtype)
    model = family.build(config, dtype)
    layout = family.layout(config)
    ties = family.ties(config)
    their_name = {ours: their for ours, their, _ in layout.rows}
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
    family = _HF[_model_type(config)]
    arrays = model.grad_dict() if grads else model.state_dict()
    return family.layout(config).to_theirs(arrays)


class _Family(NamedTuple):
    build: Callable[[Mapping, np.dtype], Module]
    layout: Callable[[Mapping], Layout]
    ties: Callable[[Mapping], list[tuple[str, str]]]     # (alias, source) numpy_tf names
    ignored: Callable[[str], bool]                       # keys that are buffers, not weights


_HF = {
    "gpt2": _Family(
        build=lambda config, dtype: GPT(gpt2_config(config), dtype=dtype),
        layout=lambda config: gpt2_layout(config["n_layer"]),
        ties=lambda config: [("output.weight", "tokens.weight")]
        if config.get("tie_word_embeddings", True) else [],
        ignored=_gpt2_buffer),
}
