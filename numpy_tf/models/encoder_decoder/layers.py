"""The two layers of the encoder-decoder Transformer, equal to torch.nn.TransformerEncoderLayer
and torch.nn.TransformerDecoderLayer (batch_first=True). numpy_tf.transformer stacks them.

Shapes: B batch, S source length, T target length, L either, C = d_model, H = nhead,
F = dim_feedforward.

A layer is a sequence of sub-layers, each a block f (attention, or the feed-forward network)
with its own LayerNorm and a residual connection, in one of two orders:

    Post-LN (norm_first=False, torch's default, the original paper's):  y = LN(x + f(x))
    Pre-LN  (norm_first=True):                                          y = x + f(LN(x))

    encoder layer  (B, S, C) -> (B, S, C):  self-attention (norm1), FFN (norm2)
    decoder layer  (B, T, C) -> (B, T, C):  self-attention (norm1), cross-attention into the
                   encoder's output, the memory (B, S, C) (norm2), FFN (norm3)

FFN(h) = linear2(dropout(activation(linear1(h)))), activation ReLU or exact GELU; every block's
output passes its own dropout (dropout1, dropout2, dropout3) before the residual sum. The
attention is TorchMultiheadAttention (in_proj_weight, out_proj), so the parameter names are
torch's: self_attn.in_proj_weight, multihead_attn.out_proj.bias, linear1.weight, norm3.bias.

Masks have torch's meaning (SPEC §4): bool True = blocked, float added to the scores; attention
masks (Tq, Tk) or (B * H, Tq, Tk) (one per head), key padding masks (B, Tk) True at padding.
`is_causal=True` blocks the keys after each query (j > i) on top of the given mask (torch takes
it only as a hint that the mask IS causal; with that valid use both agree).

Decoding with a KV cache: the decoder layer takes `past_kv` (the self-attention's keys and values
of P earlier positions) and `static_kv` (the cross-attention's keys and values of the memory,
computed once) and returns both in its cache (`present`, `cross_kv`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ...core import validate
from ...core.module import Module
from ...layers.activations import activation as make_activation
from ...layers.dropout import Dropout
from ...layers.linear import Linear
from ...layers.multihead import TorchMultiheadAttention
from ...layers.norm import LayerNorm

ACTIVATIONS = ("relu", "gelu")          # torch's strings; "gelu" is the exact (erf) GELU


def check_batch_first(batch_first) -> None:
    if batch_first is not True:
        raise ValueError("numpy_tf's Transformer is batch-first only: inputs are (B, S, C), as "
                         f"torch's batch_first=True; got batch_first={batch_first!r}")


def check_attention_mask(name: str, mask, batch: int, heads: int, queries: int, keys: int,
                         dtype, axes: tuple[str, str]) -> None:
    """torch's attn_mask shapes: (Tq, Tk), or (B * H, Tq, Tk) for one mask per head; `axes`
    names Tq and Tk in the message (e.g. ("T", "S"))."""
    rows, columns = axes
    validate.mask_array(name, mask, {f"({rows}, {columns})": (queries, keys),
                                     f"(B * nhead, {rows}, {columns})":
                                         (batch * heads, queries, keys)}, dtype)


def check_padding_mask(name: str, mask, batch: int, keys: int, dtype, axis: str) -> None:
    validate.mask_array(name, mask, {f"(B, {axis})": (batch, keys)}, dtype, "padding")


def check_sequence(name: str, x, d_model: int, dtype, legend: str) -> None:
    validate.float_array(name, x, ndim=3, shape=legend)
    validate.last_dim(name, x, d_model, "d_model")
    if x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the layer's parameters are "
                        f"{np.dtype(dtype)}; numpy_tf never casts silently (build the layer "
                        "with the matching dtype=)")


class SublayerCache(NamedTuple):
    norm: tuple         # LayerNormCache of the sub-layer's LayerNorm
    block: tuple        # the block's caches (attention and dropout, or the FFN's)


class _Layer(Module):
    """What the encoder and decoder layers share: torch's constructor, the FFN and the residual +
    norm order. A subclass has `sublayers` = 2 (encoder) or 3 (decoder: cross-attention too);
    the attributes are made in torch's order, so the state_dict keys come in torch's order."""

    sublayers = 2

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = True, norm_first: bool = False, bias: bool = True, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        check_batch_first(batch_first)
        validate.choice("activation", activation, ACTIVATIONS)
        self.d_model = validate.positive_int("d_model", d_model)
        self.nhead = validate.positive_int("nhead", nhead)
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        self.norm_first = validate.flag("norm_first", norm_first)
        validate.flag("bias", bias)
        hidden = validate.positive_int("dim_feedforward", dim_feedforward)
        rng = np.random.default_rng(rng)
        self.self_attn = TorchMultiheadAttention(d_model, nhead, dropout, bias, rng=rng,
                                                 dtype=dtype)
        if self.sublayers == 3:
            self.multihead_attn = TorchMultiheadAttention(d_model, nhead, dropout, bias, rng=rng,
                                                          dtype=dtype)
        self.linear1 = Linear(d_model, hidden, bias, rng=rng, dtype=dtype)
        self.dropout = Dropout(dropout, dtype)
        self.linear2 = Linear(hidden, d_model, bias, rng=rng, dtype=dtype)
        self.activation = make_activation(activation, dtype)
        for index in range(1, self.sublayers + 1):
            setattr(self, f"norm{index}", LayerNorm(d_model, layer_norm_eps, bias=bias,
                                                    dtype=dtype))
        for index in range(1, self.sublayers + 1):
            setattr(self, f"dropout{index}", Dropout(dropout, dtype))

    # -- one sub-layer: the residual and its LayerNorm around a block ------------------------
    def _sublayer(self, norm: LayerNorm, block: Callable, x):
        """Post-LN: y = LN(x + f(x)); Pre-LN: y = x + f(LN(x)). `block(h) -> (f, cache)`."""
        if self.norm_first:
            h, norm_cache = norm.forward(x)                             # (B, L, C)
            f, block_cache = block(h)
            return x + f, SublayerCache(norm_cache, block_cache)
        f, block_cache = block(x)
        y, norm_cache = norm.forward(x + f)                             # (B, L, C)
        return y, SublayerCache(norm_cache, block_cache)

    def _sublayer_backward(self, norm: LayerNorm, block_backward: Callable, dy, cache):
        """The sub-layer in reverse; `block_backward(df, cache) -> (dh, dother)` (dother: the
        memory's gradient for cross-attention, else None).
        Post-LN, y = LN(s) with s = x + f(x): ds = LN'(dy), and x reaches s twice, directly and
            through f, so dx = ds + f'(ds).
        Pre-LN, y = x + f(h) with h = LN(x): the residual passes dy straight to x, and the
            block's path adds dh = f'(dy) through the norm: dx = dy + LN'(dh)."""
        if self.norm_first:
            dh, dother = block_backward(dy, cache.block)
            return dy + norm.backward(dh, cache.norm), dother
        ds = norm.backward(dy, cache.norm)
        dh, dother = block_backward(ds, cache.block)
        return ds + dh, dother

    # -- the blocks ------------------------------------------------------------------------
    def _attention_block(self, attention: TorchMultiheadAttention, dropout: Dropout, h, memory,
                         attn_mask, key_padding_mask, is_causal, rng, past_kv=None,
                         static_kv=None):
        """Self-attention (memory and static_kv None: h is the query, the key and the value) or
        cross-attention (keys and values from the memory, or its static_kv), then dropout."""
        kv = h if memory is None and static_kv is None else memory
        a, attention_cache = attention.forward(h, kv, kv, key_padding_mask, attn_mask,
                                               bool(is_causal), rng, past_kv=past_kv,
                                               static_kv=static_kv)
        a, dropped = dropout.forward(a, rng)
        return a, (attention_cache, dropped, kv is h)

    @staticmethod
    def _attention_block_backward(attention: TorchMultiheadAttention, dropout: Dropout, da,
                                  cache):
        """The key and the value are one array, so its gradient is dkey + dvalue; for
        self-attention that array is also the query: dh = dquery + dkey + dvalue.
        Returns (dh, dmemory), dmemory None for self-attention (and for static_kv)."""
        attention_cache, dropped, is_self = cache
        dquery, dkey, dvalue = attention.backward(dropout.backward(da, dropped),
                                                  attention_cache)
        dkv = None if dkey is None else dkey + dvalue
        return (dquery + dkv, None) if is_self else (dquery, dkv)

    def _feedforward_block(self, h, out_dropout: Dropout, rng):
        """f = out_dropout(linear2(dropout(activation(linear1(h))))), torch's _ff_block."""
        z, linear1 = self.linear1.forward(h)                            # (B, L, F)
        z, activation = self.activation.forward(z)
        z, dropped = self.dropout.forward(z, rng)
        f, linear2 = self.linear2.forward(z)                            # (B, L, C)
        f, dropped_out = out_dropout.forward(f, rng)
        return f, (linear1, activation, dropped, linear2, dropped_out)

    def _feedforward_block_backward(self, df, cache, out_dropout: Dropout):
        """Each step's backward in reverse: dropout (the same mask), linear2, the dropout inside,
        the activation (its derivative at the cached pre-activation), linear1. Returns
        (dh, None)."""
        linear1, activation, dropped, linear2, dropped_out = cache
        dz = self.linear2.backward(out_dropout.backward(df, dropped_out), linear2)
        dz = self.activation.backward(self.dropout.backward(dz, dropped), activation)
        return self.linear1.backward(dz, linear1), None


class EncoderLayerCache(NamedTuple):
    self_attention: SublayerCache
    feedforward: SublayerCache


class TransformerEncoderLayer(_Layer):
    """torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
    layer_norm_eps, batch_first=True, norm_first, bias): self_attn, linear1, linear2, norm1,
    norm2. forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False, rng=None)
    -> (out, cache); backward(dout, cache) -> dsrc."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False, rng=None):
        check_sequence("src", src, self.d_model, self.dtype, "(B, S, C)")
        batch, length = src.shape[:2]
        check_attention_mask("src_mask", src_mask, batch, self.nhead, length, length, src.dtype,
                             ("S", "S"))
        check_padding_mask("src_key_padding_mask", src_key_padding_mask, batch, length,
                           src.dtype, "S")
        x, attention = self._sublayer(self.norm1, lambda h: self._attention_block(
            self.self_attn, self.dropout1, h, None, src_mask, src_key_padding_mask, is_causal,
            rng), src)
        y, feedforward = self._sublayer(self.norm2, lambda h: self._feedforward_block(
            h, self.dropout2, rng), x)
        return y, EncoderLayerCache(attention, feedforward)

    def backward(self, dout, cache: EncoderLayerCache):
        """The two sub-layers in reverse (each derived in _sublayer_backward)."""
        dx, _ = self._sublayer_backward(
            self.norm2, lambda d, c: self._feedforward_block_backward(d, c, self.dropout2),
            dout, cache.feedforward)
        dsrc, _ = self._sublayer_backward(
            self.norm1, lambda d, c: self._attention_block_backward(self.self_attn,
                                                                    self.dropout1, d, c),
            dx, cache.self_attention)
        return dsrc


class DecoderLayerCache(NamedTuple):
    self_attention: SublayerCache
    cross_attention: SublayerCache
    feedforward: SublayerCache
    present: tuple      # self-attention (k, v) (B, H, P + T, C/H): pass as past_kv next time
    cross_kv: tuple     # cross-attention (k, v) of the memory (B, H, S, C/H): static_kv


class TransformerDecoderLayer(_Layer):
    """torch.nn.TransformerDecoderLayer (batch_first=True): self_attn, multihead_attn, linear1,
    linear2, norm1, norm2, norm3.
    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False,
            rng=None, *, past_kv=None, static_kv=None) -> (out, cache)
    backward(dout, cache) -> (dtgt, dmemory); dmemory is None when static_kv replaced it.
    With past_kv (P earlier positions), tgt_mask is (T, P + T), tgt_key_padding_mask (B, P + T)
    and tgt_is_causal lets query i see keys j <= P + i. With static_kv, memory is None."""

    sublayers = 3

    def check_inputs(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                     memory_key_padding_mask, past_kv, static_kv) -> None:
        check_sequence("tgt", tgt, self.d_model, self.dtype, "(B, T, C)")
        batch, length = tgt.shape[:2]
        if static_kv is None:
            check_sequence("memory", memory, self.d_model, self.dtype, "(B, S, C)")
            if memory.shape[0] != batch:
                raise ValueError(f"memory must have the batch size of tgt ({batch}); got shape "
                                 f"{memory.shape}")
            sources = memory.shape[1]
        elif memory is not None:
            raise ValueError("give either memory or static_kv (its keys and values), not both")
        else:
            sources = static_kv[0].shape[2]
        keys = length + (0 if past_kv is None else past_kv[0].shape[2])
        key_axis = "T" if past_kv is None else "P + T"
        check_attention_mask("tgt_mask", tgt_mask, batch, self.nhead, length, keys, tgt.dtype,
                             ("T", key_axis))
        check_attention_mask("memory_mask", memory_mask, batch, self.nhead, length, sources,
                             tgt.dtype, ("T", "S"))
        check_padding_mask("tgt_key_padding_mask", tgt_key_padding_mask, batch, keys, tgt.dtype,
                           key_axis)
        check_padding_mask("memory_key_padding_mask", memory_key_padding_mask, batch, sources,
                           tgt.dtype, "S")

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False,
                rng=None, *, past_kv=None, static_kv=None):
        self.check_inputs(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                          memory_key_padding_mask, past_kv, static_kv)
        x, attention = self._sublayer(self.norm1, lambda h: self._attention_block(
            self.self_attn, self.dropout1, h, None, tgt_mask, tgt_key_padding_mask,
            tgt_is_causal, rng, past_kv=past_kv), tgt)
        x, cross = self._sublayer(self.norm2, lambda h: self._attention_block(
            self.multihead_attn, self.dropout2, h, memory, memory_mask, memory_key_padding_mask,
            memory_is_causal, rng, static_kv=static_kv), x)
        y, feedforward = self._sublayer(self.norm3, lambda h: self._feedforward_block(
            h, self.dropout3, rng), x)
        return y, DecoderLayerCache(attention, cross, feedforward, attention.block[0].present,
                                    cross.block[0].present)

    def backward(self, dout, cache: DecoderLayerCache):
        """The three sub-layers in reverse (each derived in _sublayer_backward); the memory's
        gradient comes from the cross-attention alone."""
        dx, _ = self._sublayer_backward(
            self.norm3, lambda d, c: self._feedforward_block_backward(d, c, self.dropout3),
            dout, cache.feedforward)
        dx, dmemory = self._sublayer_backward(
            self.norm2, lambda d, c: self._attention_block_backward(self.multihead_attn,
                                                                    self.dropout2, d, c),
            dx, cache.cross_attention)
        dtgt, _ = self._sublayer_backward(
            self.norm1, lambda d, c: self._attention_block_backward(self.self_attn,
                                                                    self.dropout1, d, c),
            dx, cache.self_attention)
        return dtgt, dmemory
