"""The encoder-decoder Transformer, equal to torch.nn.Transformer.

Shapes: B batch, S source length, T target length, C = d_model, H = nhead. With
batch_first=True (numpy_tf's default) src is (B, S, C), tgt and the output (B, T, C); with
batch_first=False (torch's default) they are sequence-first, (S, B, C) and (T, B, C), and so
are dout and the gradients; masks are the same in both (each layer swaps the axes at its entry
and exit, see layers.py).

    memory = encoder.norm(encoder layers(src))              (B, S, C)
    out    = decoder.norm(decoder layers(tgt, memory))      (B, T, C)

The layers (Post-LN or Pre-LN, their sub-layers and KV caches) are in
numpy_tf.models.encoder_decoder.layers. Each stack ends with a final LayerNorm (`encoder.norm`,
`decoder.norm`), which nn.Transformer always adds, Pre-LN or Post-LN; `final_norms=False`
leaves both out (the stacks then end with their last layer, as many Post-LN codebases build
them).

Masks have torch's meaning (SPEC §4): bool True = blocked, float added to the scores.
    src_mask (S, S), tgt_mask (T, T), memory_mask (T, S), or (B * H, ., .) for one per head;
    src_key_padding_mask, memory_key_padding_mask (B, S), tgt_key_padding_mask (B, T), True at
    padding.
`*_is_causal=True` blocks the keys after each query (j > i) on top of the given mask. torch
takes it only as a hint that the mask IS causal, and refuses it without one; with torch's valid
use (the causal mask given too) both agree, and numpy_tf also accepts the flag alone. None (the
default) is False: the mask is used as given, which is what torch's detection amounts to.
A query whose keys are all blocked (the first rows of a left-padded target under the causal
mask) gets a zero attention output, as torch's SDPA path gives; the layer's output there is the
residual and norms of its input, not zero.

Parameter names are torch's state_dict keys (encoder.layers.0.self_attn.in_proj_weight, ...,
decoder.layers.0.multihead_attn.out_proj.bias, decoder.norm.weight).

One difference from torch: in eval mode without gradients, torch's TransformerEncoder may take a
"fast path" (nested tensors) that returns zeros at padded source positions before encoder.norm;
numpy_tf always computes the standard path (what torch computes with gradients). Padded memory
positions are never attended to, so every real position agrees either way.
"""
from __future__ import annotations

import copy
import math
from typing import NamedTuple

import numpy as np

from ...core import validate
from ...core.module import Module, ModuleList
from ...layers.norm import LayerNorm, LayerNormCache
from .layers import (TransformerDecoderLayer, TransformerEncoderLayer, check_attention_mask,
                     check_padding_mask, caller_layout, check_sequence, legend)

__all__ = ["Transformer", "TransformerEncoder", "TransformerDecoder",
           "TransformerEncoderLayer", "TransformerDecoderLayer"]

# torch.nn.Transformer's keyword arguments and torch's defaults (those numpy_tf reads: the
# interop converters and parameter accounting take its kwargs; device and dtype are not read)
TORCH_TRANSFORMER_DEFAULTS = {
    "d_model": 512, "nhead": 8, "num_encoder_layers": 6, "num_decoder_layers": 6,
    "dim_feedforward": 2048, "dropout": 0.1, "activation": "relu", "custom_encoder": None,
    "custom_decoder": None, "layer_norm_eps": 1e-5, "batch_first": False, "norm_first": False,
    "bias": True}


class StackCache(NamedTuple):
    layers: list                    # one EncoderLayerCache per layer, in forward order
    norm: LayerNormCache | None     # the final LayerNorm's (None: the stack has none)


class _Stack(Module):
    """`num_layers` copies of a layer (`layers.0`, ...; each its own Parameters, equal at first,
    as torch's clones) and an optional final LayerNorm `norm`."""

    def __init__(self, layer: Module, num_layers: int, norm: LayerNorm | None = None):
        super().__init__(layer.dtype)
        num_layers = validate.positive_int("num_layers", num_layers)
        self.layers = ModuleList([copy.deepcopy(layer) for _ in range(num_layers)],
                                 dtype=self.dtype)
        self.norm = norm


class TransformerEncoder(_Stack):
    """torch.nn.TransformerEncoder(encoder_layer: TransformerEncoderLayer, num_layers, norm).
    forward(src, mask=None, src_key_padding_mask=None, is_causal=None, rng=None)
    -> (memory, cache); backward(dmemory, cache) -> dsrc."""

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None, rng=None):
        """src (B, S, C) -> memory (B, S, C)."""
        caches, norm = [], None
        x = src
        for layer in self.layers:
            x, cache = layer.forward(x, mask, src_key_padding_mask, is_causal, rng)  # (B, S, C)
            caches.append(cache)
        if self.norm is not None:
            x, norm = self.norm.forward(x)                          # (B, S, C)
        return x, StackCache(caches, norm)

    def backward(self, dout, cache: StackCache):
        """The forward in exact reverse; returns dsrc (B, S, C)."""
        dx = dout
        if self.norm is not None:
            dx = self.norm.backward(dx, cache.norm)                 # x = norm(x)
        for layer, layer_cache in zip(reversed(list(self.layers)), reversed(cache.layers)):
            dx = layer.backward(dx, layer_cache)                    # x = layer(x)
        return dx


class DecoderCache(NamedTuple):
    layers: list                    # one DecoderLayerCache per layer, in forward order
    norm: LayerNormCache | None     # the final LayerNorm's (None: the stack has none)
    present: list       # per layer, the self-attention KVCache (k, v): past_kv of the next call
    cross_kv: list      # per layer, the memory's KVCache (k, v): static_kv of the next call


class TransformerDecoder(_Stack):
    """torch.nn.TransformerDecoder(decoder_layer: TransformerDecoderLayer, num_layers, norm).
    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False,
            rng=None, *, past_kv=None, static_kv=None) -> (out, cache), past_kv and static_kv
    being lists with one (k, v) per layer; backward(dout, cache) -> (dtgt, dmemory)."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False,
                rng=None, *, past_kv=None, static_kv=None):
        for name, per_layer in (("past_kv", past_kv), ("static_kv", static_kv)):
            if per_layer is not None and len(per_layer) != len(self.layers):
                raise ValueError(f"{name} must hold one (k, v) per layer ({len(self.layers)}); "
                                 f"got {len(per_layer)}")
        caches, norm = [], None
        x = tgt
        for index, layer in enumerate(self.layers):
            x, cache = layer.forward(
                x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                tgt_is_causal, memory_is_causal, rng,
                past_kv=None if past_kv is None else past_kv[index],
                static_kv=None if static_kv is None else static_kv[index])  # (B, T, C)
            caches.append(cache)
        if self.norm is not None:
            x, norm = self.norm.forward(x)                          # (B, T, C)
        return x, DecoderCache(caches, norm, [c.present for c in caches],
                               [c.cross_kv for c in caches])

    def backward(self, dout, cache: DecoderCache):
        """The forward in exact reverse; returns (dtgt, dmemory). Every layer reads the same
        memory, so its gradient is the sum over the layers (None when static_kv stood for it)."""
        dmemory = None
        dx = dout
        if self.norm is not None:
            dx = self.norm.backward(dx, cache.norm)                 # x = norm(x)
        for layer, layer_cache in zip(reversed(list(self.layers)), reversed(cache.layers)):
            dx, dlayer_memory = layer.backward(dx, layer_cache)     # x = layer(x, memory)
            if dlayer_memory is not None:
                dmemory = dlayer_memory if dmemory is None else dmemory + dlayer_memory
        return dx, dmemory


class TransformerCache(NamedTuple):
    encoder: StackCache         # src -> memory (B, S, C)
    decoder: DecoderCache       # tgt, memory -> out (B, T, C)
    out: np.ndarray             # (B, T, C) or (T, B, C) the output (the array returned)

    @property
    def output_spec(self):      # the (shape, dtype) of the output: dout's
        return self.out.shape, self.out.dtype


class Transformer(Module):
    """torch.nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
    dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias),
    with torch's defaults but batch_first (True here: (B, S, C); False: (S, B, C), torch's);
    every weight matrix xavier-uniform as torch initialises it.
    `final_norms=False` (numpy_tf's option: torch.nn.Transformer always has them) leaves out
    the stacks' final LayerNorms, encoder.norm and decoder.norm, as a torch TransformerEncoder /
    TransformerDecoder built without `norm` (a Post-LN stack already ends in a LayerNorm).
    forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
            tgt_key_padding_mask, memory_key_padding_mask, src_is_causal, tgt_is_causal,
            memory_is_causal, rng) -> (out (B, T, C), cache); backward(dout, cache) ->
    (dsrc, dtgt)."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = True, norm_first: bool = False, bias: bool = True, *,
                 final_norms: bool = True, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        final_norms = validate.flag("final_norms", final_norms)
        num_encoder_layers = validate.positive_int("num_encoder_layers", num_encoder_layers)
        num_decoder_layers = validate.positive_int("num_decoder_layers", num_decoder_layers)
        dropout = validate.number("dropout", dropout, low=0.0, high=1.0, high_open=True)
        layer_norm_eps = validate.positive_float("layer_norm_eps", layer_norm_eps)
        rng = np.random.default_rng(rng)
        options = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                       layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                       norm_first=norm_first, bias=bias, rng=rng, dtype=dtype)
        self.d_model, self.nhead = d_model, nhead
        self.batch_first = validate.flag("batch_first", batch_first)
        self.encoder = TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **options), num_encoder_layers,
            LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype) if final_norms else None)
        self.decoder = TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **options), num_decoder_layers,
            LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype) if final_norms else None)
        for parameter in self.parameters():
            if parameter.data.ndim > 1:                                 # xavier_uniform_
                bound = math.sqrt(6.0 / sum(parameter.shape))
                parameter.data[...] = rng.uniform(-bound, bound, parameter.shape)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False, rng=None):
        check_sequence("src", src, self.d_model, self.dtype, legend("S", self.batch_first))
        check_sequence("tgt", tgt, self.d_model, self.dtype, legend("T", self.batch_first))
        batch, sources = caller_layout(src, self.batch_first).shape[:2]
        if caller_layout(tgt, self.batch_first).shape[0] != batch:
            axis = 0 if self.batch_first else 1
            raise ValueError(f"src and tgt must have the same batch size; got {src.shape[axis]} "
                             f"and {tgt.shape[axis]}")
        check_attention_mask("src_mask", src_mask, batch, self.nhead, sources, sources,
                             src.dtype, ("S", "S"))
        check_padding_mask("src_key_padding_mask", src_key_padding_mask, batch, sources,
                           src.dtype, "S")
        self.decoder.layers[0].check_inputs(tgt, src, tgt_mask, memory_mask,
                                            tgt_key_padding_mask, memory_key_padding_mask,
                                            None, None)
        memory, encoder = self.encoder.forward(src, src_mask, src_key_padding_mask,
                                               src_is_causal, rng)              # (B, S, C)
        out, decoder = self.decoder.forward(tgt, memory, tgt_mask, memory_mask,
                                            tgt_key_padding_mask, memory_key_padding_mask,
                                            tgt_is_causal, memory_is_causal, rng)  # (B, T, C)
        return out, TransformerCache(encoder, decoder, out)

    def backward(self, dout, cache: TransformerCache):
        """The decoder in reverse gives dtgt and the memory's gradient (summed over the decoder
        layers); the encoder in reverse turns the latter into dsrc. dout must have exactly
        the output's shape and dtype."""
        validate.backward_inputs(dout, cache, TransformerCache)
        dtgt, dmemory = self.decoder.backward(dout, cache.decoder)  # out = decoder(tgt, memory)
        dsrc = self.encoder.backward(dmemory, cache.encoder)        # memory = encoder(src)
        return dsrc, dtgt
