"""Case export: one .npz file holding everything needed to check an implementation of a whole
model against numpy_tf, number by number (SPEC §7).

    case = export_case("tiny-gpt", seed=0, dtype="float64")        # or "gpt2", config=...
    case.save("case.npz")

The file is a zip of .npy arrays (np.load(path, allow_pickle=False); any language with an npy
reader can open it). Its keys, in this order (the order is part of the format):

    meta                  0-d string, JSON: model, config, seed, dtype, versions, loss, every
                          convention the numbers follow (meta["conventions"]), this key list
    param/<name>          every parameter (torch-style state_dict names; a tied weight under
                          each of its names)
    input/<name>          ids (B, T) int64; key_padding_mask (B, T) bool, True at padding (if any)
    act/<module>          each named module's forward output, in forward call order
    output/logits         (B, T, V)
    loss                  0-d: the objective meta["loss"] defines
    grad_act/<module>     dL/d(act/<module>), in the order backward reached each module
    grad/<name>           dL/d(param/<name>); a tied weight's is the sum of its uses

`<module>` is the numpy_tf module name (blocks.0.norm1, blocks.0.attention.qkv, ...; a module
called twice in one pass is `<module>#2` the second time). Every float array has the case's
dtype. Weights and inputs are drawn from numpy.random.default_rng(seed): weights first, in
named_parameters order, N(0, s^2) with s = init_std (default 1.2 / sqrt(width), so attention
is far from uniform and the case has teeth), norm weights 1 + N(0, 0.2^2); then the ids.

Models are one table, EXPORTS: adding a model kind (Llama, the encoder-decoder Transformer)
is one ModelExport entry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cases import Case
from .core import Module, float_dtype, record_activations
from .gpt import GPT, GPTConfig
from .objectives import NextTokenLoss

ORDER = ["meta", "param/<name>", "input/<name>", "act/<module> (forward order)",
         "output/<name>", "loss", "grad_act/<module> (backward order)", "grad/<name>"]

NEXT_TOKEN_LOSS = {
    "name": "next_token_cross_entropy", "ignore_index": -100,
    "definition": "mean over the kept (b, t) of -log softmax(logits[b, t])[ids[b, t + 1]]; the "
                  "last position, padded positions and positions followed by padding are not "
                  "kept (their target is ignore_index); 0.0 with zero gradients if nothing is "
                  "kept"}


@dataclass(frozen=True)
class ModelExport:
    """How to export one model kind."""
    presets: dict[str, dict]                        # preset name -> config fields
    build: Callable[[dict, np.dtype], Module]       # (config fields, dtype) -> model
    objective: Callable[[Module], Module]           # model -> objective: forward(**inputs)
    inputs: Callable[[Module, np.random.Generator, int, int | None, int], dict]
    conventions: Callable[[Module], dict]
    loss: dict                                      # meta["loss"]; "name" picks the torch loss
    width: Callable[[Module], int]                  # for the default weight spread


def _gpt_inputs(model: GPT, g: np.random.Generator, batch: int, length: int | None,
                pad: int) -> dict:
    """ids (batch, length) uniform over the vocabulary; `pad` padded positions at the end of
    the last row."""
    length = min(7, model.config.max_context) if length is None else length
    if not 1 <= length <= model.config.max_context:
        raise ValueError(f"length must be in [1, max_context = {model.config.max_context}]; "
                         f"got {length}")
    if not 0 <= pad < length:
        raise ValueError(f"pad must be in [0, length = {length}); got {pad}")
    inputs = {"ids": g.integers(0, model.config.vocab_size, (batch, length), dtype=np.int64)}
    if pad:
        inputs["key_padding_mask"] = np.zeros((batch, length), dtype=bool)
        inputs["key_padding_mask"][-1, length - pad:] = True
    return inputs


def _gpt_conventions(model: GPT) -> dict:
    c = model.config
    block = ("Pre-LN: u = x + attention(norm1(x)); y = u + feedforward(norm2(u))" if
             c.norm_first else "Post-LN: u = norm1(x + attention(x)); y = norm2(u + "
             "feedforward(u))")
    activation = {"gelu": "exact GELU x Phi(x) (erf; torch.nn.GELU(approximate='none'))",
                  "gelu_tanh": "tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) "
                               "(torch approximate='tanh', HF gelu_new)",
                  "relu": "ReLU"}[c.activation]
    return {
        "model": "ids -> tokens (embedding) -> positions (adds learned rows 0..T-1) -> blocks "
                 "-> final_norm -> output (Linear, no bias) = logits",
        "block": block,
        "attention": f"causal self-attention, {c.heads} heads of {c.width // c.heads}: one "
                     "fused Linear `qkv` (C -> 3C) whose output columns are [q | k | v], each "
                     "(B, T, C) -> (B, H, T, d); scores q k^T / sqrt(d); query i sees keys "
                     "j <= i; softmax over keys (row max subtracted); heads merged back to "
                     "(B, T, C), then the Linear `output`",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key (a query row with "
                            "every key blocked gives zeros, never NaN)",
        "layernorm": f"over the last axis, biased variance (divide by C), eps = {c.norm_eps} "
                     "inside the square root, weight and bias",
        "feedforward": f"Sequential: feedforward.0 Linear(C, {c.hidden or 4 * c.width}), "
                       f"feedforward.1 {activation}, feedforward.2 Linear back to C",
        "gelu": activation,
        "positions": "learned absolute positions (a (max_context, C) table); no RoPE",
        "rope": "none",
        "biases": f"attention {c.attention_bias}, feedforward {c.ffn_bias}, output head none",
        "tied": "output.weight IS tokens.weight (one Parameter, listed under both names; its "
                "gradient is the sum of both uses)" if c.tied else "untied",
        "dropout": "none (p = 0: the case is deterministic)",
        "linear_weight_layout": "(out_features, in_features), y = x W^T + b",
    }


_GPT = dict(build=None, objective=NextTokenLoss, inputs=_gpt_inputs,
            conventions=_gpt_conventions, loss=NEXT_TOKEN_LOSS,
            width=lambda model: model.config.width)

EXPORTS: dict[str, ModelExport] = {
    "tiny-gpt": ModelExport(**{**_GPT, "presets": {"tiny": {}},
                               "build": lambda fields, dtype: GPT(GPTConfig.tiny(**fields),
                                                                  dtype=dtype)}),
    "gpt2": ModelExport(**{**_GPT, "presets": {
        "gpt2-tiny": dict(vocab_size=24, max_context=10, width=16, heads=4, layers=2),
        "gpt2-124m": {}},
        "build": lambda fields, dtype: GPT(GPTConfig.gpt2(**fields), dtype=dtype)}),
}
# model kinds that will join EXPORTS when their models are merged into numpy_tf
PLANNED = ("llama", "transformer")


def resolve_config(model: str, config: str | dict | None = None,
                   overrides: dict | None = None) -> dict:
    """Config fields: a preset name (None: the first preset) or a dict, then `overrides`."""
    entry = model_export(model)
    if config is None or isinstance(config, str):
        name = next(iter(entry.presets)) if config is None else config
        if name not in entry.presets:
            raise ValueError(f"config {name!r} is neither a preset of {model} ("
                             + ", ".join(entry.presets) + ") nor config fields (a dict; on the "
                             "command line a JSON file or inline JSON)")
        config = entry.presets[name]
    if not isinstance(config, dict):
        raise TypeError(f"config must be a preset name or a dict; got {type(config).__name__}")
    return {**config, **(overrides or {})}


def model_export(model: str) -> ModelExport:
    if model not in EXPORTS:
        later = [name for name in PLANNED if name not in EXPORTS]
        note = f" ({', '.join(later)}: not in this numpy_tf yet)" if later else ""
        raise ValueError(f"unknown model {model!r}; numpy_tf exports {', '.join(EXPORTS)}{note}")
    return EXPORTS[model]


def spread_weights(model: Module, g: np.random.Generator, std: float) -> None:
    """Every parameter N(0, std^2), norm weights 1 + N(0, 0.2^2), drawn in float64 in
    named_parameters order (a tied Parameter once) and cast to the model's dtype."""
    for name, parameter in model.named_parameters():
        noise = g.standard_normal(parameter.shape)
        is_norm_weight = "norm" in name.rsplit(".", 1)[0] and name.endswith("weight")
        parameter.data[...] = (1.0 + 0.2 * noise) if is_norm_weight else std * noise


def export_case(model: str, config: str | dict | None = None, overrides: dict | None = None,
                *, seed: int = 0, dtype="float64", batch: int = 2, length: int | None = None,
                pad: int = 0, init_std: float | None = None) -> Case:
    """The case of `model` (a key of EXPORTS) built from `config` (see resolve_config), with
    weights and inputs drawn from `seed` (see the module text)."""
    from . import __version__

    entry = model_export(model)
    dtype = float_dtype(dtype)
    fields = resolve_config(model, config, overrides)
    try:
        network = entry.build(fields, dtype)
    except TypeError as error:
        raise ValueError(f"config for {model}: {error}") from None
    g = np.random.default_rng(seed)
    std = 1.2 / math.sqrt(entry.width(network)) if init_std is None else float(init_std)
    spread_weights(network, g, std)
    inputs = entry.inputs(network, g, batch, length, pad)
    objective = entry.objective(network)
    with record_activations(network) as recorder:
        loss, cache = objective.forward(**inputs)
        network.zero_grad()
        objective.backward(1.0, cache)
    arrays = {f"param/{name}": value.copy() for name, value in network.state_dict().items()}
    arrays.update({f"input/{name}": value for name, value in inputs.items()})
    arrays.update({f"act/{name}": value for name, value in recorder.activations.items()})
    arrays["output/logits"] = cache.logits
    arrays["loss"] = np.asarray(loss)
    arrays.update({f"grad_act/{name}": value for name, value in recorder.gradients.items()})
    arrays.update({f"grad/{name}": value.copy() for name, value in network.grad_dict().items()})
    meta = {"generator": "numpy_tf.export", "numpy_tf": __version__, "numpy": np.__version__,
            "model": model, "kind": model, "level": "model", "seed": seed,
            "dtype": dtype.name, "config": network.config.to_dict(), "init_std": std,
            "inputs": ["ids"], "keyword_inputs": [k for k in inputs if k != "ids"],
            "outputs": ["logits"], "loss": entry.loss, "order": ORDER,
            "conventions": {**entry.conventions(network), "dtype": f"every float array is "
                            f"{dtype.name}; ids int64; masks bool",
                            "act": "act/<module> = the module's forward output; grad_act/"
                                   "<module> = dL/d(that output); <module>#2 = second call"}}
    return Case(meta, arrays)
