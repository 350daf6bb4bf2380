"""numpy_tf.interop's tables for Hugging Face BERT (BertForMaskedLM): its config read into a
BertConfig, and its names mapped onto numpy_tf's Bert.

    HF (per layer i, under bert.encoder.layer.i.)    numpy_tf (under encoder.layers.i.)
    attention.self.{query,key,value}.weight          self_attn.in_proj_weight  (joined, axis 0)
    attention.self.{query,key,value}.bias            self_attn.in_proj_bias    (joined)
    attention.output.dense / .LayerNorm              self_attn.out_proj / norm1
    intermediate.dense / output.dense / .LayerNorm   linear1 / linear2 / norm2

and bert.embeddings.{word,position,token_type}_embeddings / .LayerNorm -> embeddings.*_embeddings
/ embeddings.norm, cls.predictions.transform.dense / .LayerNorm / decoder -> mlm_head.dense /
norm / decoder. HF's attention_mask (1 real, 0 padding) is numpy_tf's key_padding_mask ==
(attention_mask == 0).
"""
from __future__ import annotations

from typing import Mapping

from ..core import validate
from ..models.bert import BertConfig
from ..models.encoder_decoder.layers import ACTIVATIONS
from .layout import Layout


def bert_config(config: Mapping) -> BertConfig:
    """numpy_tf's BertConfig for a Hugging Face BertConfig dict of a BertForMaskedLM; refuses
    what we lack. Dropout is not carried over (numpy_tf's model equals HF's in eval mode; give
    BertConfig a dropout to train with one)."""
    architectures = config.get("architectures") or ["BertForMaskedLM"]
    if list(architectures) != ["BertForMaskedLM"]:
        raise ValueError(f"architectures {architectures!r} is not supported: numpy_tf reads "
                         "BertForMaskedLM (the encoder and its MLM head, no pooler)")
    activation = config.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"hidden_act {activation!r} is not implemented: numpy_tf's BERT is "
                         "built from TransformerEncoderLayer, whose activations are 'gelu' "
                         "(exact, erf: BERT's) and 'relu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {config['position_embedding_type']!r} is "
                         "not implemented (numpy_tf's BERT has absolute learned positions)")
    for key in ("is_decoder", "add_cross_attention"):
        if config.get(key):
            raise ValueError(f"{key}={config[key]!r} is not implemented (numpy_tf's BERT is a "
                             "bidirectional encoder without cross-attention)")
    return BertConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"], hidden_act=activation,
        max_position_embeddings=config.get("max_position_embeddings", 512),
        type_vocab_size=validate.positive_int("type_vocab_size",
                                              config.get("type_vocab_size", 2)),
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        tie_word_embeddings=config.get("tie_word_embeddings", True),
        pad_token_id=config.get("pad_token_id"),
        initializer_range=config.get("initializer_range", 0.02))


def bert_layout(config: BertConfig) -> Layout:
    """HF's query, key and value (weights, then biases) join into in_proj_weight and
    in_proj_bias; the rest is one name for one name, nothing transposed. HF's decoder bias is
    also `cls.predictions.bias`: one tensor under two names when tied; when untied (transformers
    5 ties neither) `cls.predictions.bias` is left out of HF's computation, hence `unused`."""
    rows = [(f"embeddings.{ours}", f"bert.embeddings.{their}", False) for ours, their in [
        ("word_embeddings.weight", "word_embeddings.weight"),
        ("position_embeddings.weight", "position_embeddings.weight"),
        ("token_type_embeddings.weight", "token_type_embeddings.weight"),
        ("norm.weight", "LayerNorm.weight"), ("norm.bias", "LayerNorm.bias")]]
    order = [their for _, their, _ in rows]
    for i in range(config.num_hidden_layers):
        ours, hf = f"encoder.layers.{i}.", f"bert.encoder.layer.{i}."
        for kind in ("weight", "bias"):
            rows.append((f"{ours}self_attn.in_proj_{kind}", tuple(
                f"{hf}attention.self.{part}.{kind}" for part in ("query", "key", "value")),
                False))
        order += [f"{hf}attention.self.{part}.{kind}" for part in ("query", "key", "value")
                  for kind in ("weight", "bias")]
        for our_name, their_name in [("self_attn.out_proj", "attention.output.dense"),
                                     ("norm1", "attention.output.LayerNorm"),
                                     ("linear1", "intermediate.dense"),
                                     ("linear2", "output.dense"), ("norm2", "output.LayerNorm")]:
            for kind in ("weight", "bias"):
                rows.append((f"{ours}{our_name}.{kind}", f"{hf}{their_name}.{kind}", False))
                order.append(f"{hf}{their_name}.{kind}")
    head = [(f"mlm_head.{ours}", f"cls.predictions.{their}", False) for ours, their in [
        ("dense.weight", "transform.dense.weight"), ("dense.bias", "transform.dense.bias"),
        ("norm.weight", "transform.LayerNorm.weight"), ("norm.bias", "transform.LayerNorm.bias"),
        ("decoder.weight", "decoder.weight"), ("decoder.bias", "decoder.bias")]]
    unused = {}
    if config.tie_word_embeddings:
        head.append(("mlm_head.decoder.bias", "cls.predictions.bias", False))
    else:
        unused["cls.predictions.bias"] = (config.vocab_size,)
    order += ["cls.predictions.bias"] + [their for _, their, _ in head[:6]]
    return Layout(rows + head, unused, order)


def bert_buffer(key: str) -> bool:
    """The position_ids / token_type_ids buffers older transformers versions saved."""
    return key.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))
