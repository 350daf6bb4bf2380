"""numpy_tf.interop's reader of a Hugging Face config's RoPE: rope_theta and a scaled RoPE
(numpy_tf.layers.rope_scaling.RopeScaling), from every place transformers writes them.

transformers 5 writes one `rope_parameters` dict (rope_type, rope_theta, factor, ...); older
config.json files hold `rope_theta` at the top and `rope_scaling` (rope_type, or its older
name `type`, factor, ...). Both are read; a non-empty rope_scaling is the one HF uses, and a
top-level rope_theta must agree with the table's. rope_type
default, linear, dynamic, llama3, yarn and longrope are implemented; every other type,
a partial_rotary_factor other than 1 and per-layer-type RoPE are refused by name.
longrope (Phi-3 128k) is read too.

The context lengths each type reads are HF's: llama3, yarn and longrope take
original_max_position_embeddings from the rope parameters (a Phi-3 config's own top-level
field first, as HF standardises it; max_position_embeddings when neither has it), dynamic
takes the config's max_position_embeddings, and yarn and longrope without a factor take
max_position_embeddings / original_max_position_embeddings.
"""
from __future__ import annotations

from typing import Mapping

from ..layers.rope_scaling import ROPE_TYPES, RopeScaling


def _rope_tables(config: Mapping) -> list[tuple[str, dict]]:
    tables = []
    for where in ("rope_parameters", "rope_scaling"):
        table = config.get(where) or {}
        if not isinstance(table, Mapping):
            raise ValueError(f"{where} must be a dict; got {type(table).__name__}")
        if any(isinstance(value, Mapping) for value in table.values()):
            raise ValueError(f"{where} holds one RoPE per layer type ({', '.join(table)}): "
                             "per-layer-type RoPE is not implemented (numpy_tf's Llama has one "
                             "RoPE for every layer)")
        tables.append((where, dict(table)))
    return tables


def read_rope(config: Mapping) -> tuple[float, RopeScaling | None]:
    """(rope_theta, the scaled RoPE or None) of a Hugging Face config dict; refuses what
    numpy_tf lacks, by name."""
    (_, parameters), (_, scaling) = _rope_tables(config)
    merged = scaling or parameters          # HF: rope_scaling, when given, replaces the rest
    if "type" in merged and "rope_type" not in merged:
        merged["rope_type"] = merged.pop("type")
    theta = merged.get("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("rope_theta") is not None and config["rope_theta"] != theta:
        raise ValueError(f"rope_theta ({config['rope_theta']!r}) and rope_parameters' "
                         f"rope_theta ({theta!r}) disagree")
    theta = 10000.0 if theta is None else theta
    partial = merged.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor={partial!r} is not implemented (numpy_tf's "
                         "Llama rotates every feature of a head: partial_rotary_factor 1.0)")
    rope_type = merged.get("rope_type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not implemented (numpy_tf reads rope_type "
                         f"default, {', '.join(ROPE_TYPES)})")
    max_positions = config.get("max_position_embeddings")
    original = config.get("original_max_position_embeddings") \
        or merged.get("original_max_position_embeddings") or max_positions
    factor = merged.get("factor")
    if rope_type == "dynamic":
        original = max_positions
    if rope_type in ("yarn", "longrope") and factor is None:
        factor = max_positions / original
    if factor is None:
        raise ValueError(f"rope_type {rope_type!r} needs a factor in rope_parameters")
    fields = dict(rope_type=rope_type, factor=factor,
                  original_max_position_embeddings=original)
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if merged.get(key) is None:
                raise ValueError(f"rope_type 'llama3' needs {key} in rope_parameters")
            fields[key] = merged[key]
    if rope_type == "yarn":
        fields.update(beta_fast=merged.get("beta_fast") or 32.0,
                      beta_slow=merged.get("beta_slow") or 1.0,
                      attention_factor=merged.get("attention_factor"),
                      mscale=merged.get("mscale"), mscale_all_dim=merged.get("mscale_all_dim"),
                      truncate=bool(merged.get("truncate", True)))
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            if not merged.get(key):
                raise ValueError(f"rope_type 'longrope' needs {key} in rope_parameters")
        fields.update(short_factor=merged["short_factor"], long_factor=merged["long_factor"],
                      attention_factor=merged.get("attention_factor"))
    return theta, RopeScaling(**fields)


def rope_config_fields(rope_theta: float, scaling: RopeScaling | None) -> dict:
    """The rope_parameters entry of an HF config.json for numpy_tf's rope_theta and scaling
    (read_rope reads it back)."""
    parameters = {"rope_type": "default", "rope_theta": rope_theta}
    if scaling is not None:
        parameters = {"rope_theta": rope_theta, **{
            key: value for key, value in scaling.to_dict().items() if value is not None}}
    return {"rope_parameters": parameters}
