"""The two layers of the encoder-decoder Transformer, equal to torch.nn.TransformerEncoderLayer
and torch.nn.TransformerDecoderLayer. transformer.py stacks them.

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

Each forward lists both orders in full, one module per line; each backward lists them in exact
reverse, one named gradient per line; the cache has one field per module, named as it.

Layouts: batch_first=True (numpy_tf's default) is (B, S, C); batch_first=False (torch's
default) is sequence-first (S, B, C) for src, tgt, memory, the outputs, dout and the returned
gradients. The layer swaps the first two axes at its entry and exit (batch_major, caller_layout) and
computes in (B, S, C) in between, so the listings below read the same for both and the numbers
are batch_first's bit for bit; masks and KV caches have the same shapes in both layouts (key
padding (B, S), heads (B, H, S, C/H)).

Masks have torch's meaning (SPEC §4): bool True = blocked, float added to the scores; attention
masks (Tq, Tk) or (B * H, Tq, Tk) (one per head), key padding masks (B, Tk) True at padding.
`is_causal=True` blocks the keys after each query (j > i) on top of the given mask (torch takes
it only as a hint that the mask IS causal; with that valid use both agree).

Decoding with a KV cache: the decoder layer takes `past_kv` (the self-attention's keys and values
of P earlier positions) and `static_kv` (the cross-attention's keys and values of the memory,
computed once) and returns both in its cache (`present`, `cross_kv`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...core import validate
from ...core.module import Module
from ...layers.activations import activation as make_activation
from ...layers.dropout import Dropout, DropoutCache
from ...layers.linear import Linear, LinearCache
from ...layers.multihead import AttentionLayerCache, KVCache, TorchMultiheadAttention
from ...layers.norm import LayerNorm, LayerNormCache

ACTIVATIONS = ("relu", "gelu")          # torch's strings; "gelu" is the exact (erf) GELU


def batch_major(x, batch_first: bool):
    """A layer's input (or dout) as (B, L, C): x itself when batch_first, else the sequence-
    first (L, B, C) with its first two axes swapped, in memory order (a copy, unless x is
    itself a swapped view of a (B, L, C) array, as one layer's output is to the next layer).
    So the arithmetic in between is batch_first's, bit for bit."""
    return x if batch_first or x is None else np.ascontiguousarray(x.swapaxes(0, 1))


def caller_layout(y, batch_first: bool):
    """A (B, L, C) result in the caller's layout: itself, or its (L, B, C) view."""
    return y if batch_first or y is None else y.swapaxes(0, 1)


def legend(axis: str, batch_first: bool) -> str:
    """The shape a sequence argument has in the layout: "(B, S, C)" or "(S, B, C)"."""
    return f"(B, {axis}, C)" if batch_first else f"({axis}, B, C), batch_first=False"


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


class _Layer(Module):
    """What the encoder and decoder layers share: torch's constructor. A subclass has
    `sublayers` = 2 (encoder) or 3 (decoder: cross-attention too); the attributes are made in
    torch's order, so the state_dict keys come in torch's order."""

    sublayers = 2

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = True, norm_first: bool = False, bias: bool = True, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        self.batch_first = validate.flag("batch_first", batch_first)
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


class EncoderLayerCache(NamedTuple):
    """One field per sub-layer the forward ran, named as its module (torch's names)."""
    norm1: LayerNormCache               # Pre-LN: of src; Post-LN: of src + a
    self_attn: AttentionLayerCache      # query, key and value all src (Pre-LN: norm1(src))
    dropout1: DropoutCache              # of the attention output a
    norm2: LayerNormCache               # Pre-LN: of u; Post-LN: of u + f
    linear1: LinearCache                # (B, S, C) -> (B, S, F)
    activation: tuple                   # ReLUCache or GELUCache of (B, S, F)
    dropout: DropoutCache               # inside the FFN, of (B, S, F)
    linear2: LinearCache                # (B, S, F) -> (B, S, C)
    dropout2: DropoutCache              # of the FFN output f


class TransformerEncoderLayer(_Layer):
    """torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
    layer_norm_eps, batch_first, norm_first, bias): self_attn, linear1, linear2, norm1,
    norm2 (batch_first True by default: (B, S, C); False: (S, B, C)). forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False, rng=None)
    -> (out, cache); backward(dout, cache) -> dsrc."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False, rng=None):
        """src (B, S, C) -> y (B, S, C), one sub-layer per line:
            Pre-LN   u = src + dropout1(self_attn(norm1(src)))   y = u + dropout2(ffn(norm2(u)))
            Post-LN  u = norm1(src + dropout1(self_attn(src)))   y = norm2(u + dropout2(ffn(u)))
        with ffn(h) = linear2(dropout(activation(linear1(h))))."""
        check_sequence("src", src, self.d_model, self.dtype, legend("S", self.batch_first))
        src = batch_major(src, self.batch_first)                    # (B, S, C)
        batch, length = src.shape[:2]
        check_attention_mask("src_mask", src_mask, batch, self.nhead, length, length, src.dtype,
                             ("S", "S"))
        check_padding_mask("src_key_padding_mask", src_key_padding_mask, batch, length,
                           src.dtype, "S")
        options = dict(key_padding_mask=src_key_padding_mask, attn_mask=src_mask,
                       is_causal=bool(is_causal), rng=rng)
        if self.norm_first:
            h, norm1 = self.norm1.forward(src)                      # (B, S, C)
            a, self_attn = self.self_attn.forward(h, h, h, **options)  # (B, S, C)
            a, dropout1 = self.dropout1.forward(a, rng)
            u = src + a
            h, norm2 = self.norm2.forward(u)                        # (B, S, C)
            z, linear1 = self.linear1.forward(h)                    # (B, S, F)
            z, activation = self.activation.forward(z)
            z, dropout = self.dropout.forward(z, rng)
            f, linear2 = self.linear2.forward(z)                    # (B, S, C)
            f, dropout2 = self.dropout2.forward(f, rng)
            y = u + f
        else:
            a, self_attn = self.self_attn.forward(src, src, src, **options)  # (B, S, C)
            a, dropout1 = self.dropout1.forward(a, rng)
            u, norm1 = self.norm1.forward(src + a)                  # (B, S, C)
            z, linear1 = self.linear1.forward(u)                    # (B, S, F)
            z, activation = self.activation.forward(z)
            z, dropout = self.dropout.forward(z, rng)
            f, linear2 = self.linear2.forward(z)                    # (B, S, C)
            f, dropout2 = self.dropout2.forward(f, rng)
            y, norm2 = self.norm2.forward(u + f)                    # (B, S, C)
        y = caller_layout(y, self.batch_first)
        return y, EncoderLayerCache(norm1, self_attn, dropout1, norm2, linear1, activation,
                                    dropout, linear2, dropout2)

    def backward(self, dy, cache: EncoderLayerCache):
        """The forward in exact reverse, each line commented with the forward line it undoes.
        A residual sum passes its gradient to both terms, so a value that reached a sum twice
        (directly and through a branch) gets the sum of the two gradients; Post-LN's ds is the
        gradient of the sum inside a norm. The self-attention reads its input three times, as
        the query, the key and the value: that input's gradient is dquery + dkey + dvalue."""
        dy = batch_major(dy, self.batch_first)                      # (B, S, C)
        if self.norm_first:
            df = self.dropout2.backward(dy, cache.dropout2)         # f = dropout2(f); y = u + f
            dz = self.linear2.backward(df, cache.linear2)           # f = linear2(z)
            dz = self.dropout.backward(dz, cache.dropout)           # z = dropout(z)
            dz = self.activation.backward(dz, cache.activation)     # z = activation(z)
            dh = self.linear1.backward(dz, cache.linear1)           # z = linear1(h)
            du = dy + self.norm2.backward(dh, cache.norm2)          # h = norm2(u)
            da = self.dropout1.backward(du, cache.dropout1)         # a = dropout1(a); u = src + a
            dquery, dkey, dvalue = self.self_attn.backward(da, cache.self_attn)
            dh = dquery + (dkey + dvalue)                           # a = self_attn(h, h, h)
            dsrc = du + self.norm1.backward(dh, cache.norm1)        # h = norm1(src)
        else:
            ds = self.norm2.backward(dy, cache.norm2)               # y = norm2(u + f)
            df = self.dropout2.backward(ds, cache.dropout2)         # f = dropout2(f)
            dz = self.linear2.backward(df, cache.linear2)           # f = linear2(z)
            dz = self.dropout.backward(dz, cache.dropout)           # z = dropout(z)
            dz = self.activation.backward(dz, cache.activation)     # z = activation(z)
            du = ds + self.linear1.backward(dz, cache.linear1)      # z = linear1(u)
            ds = self.norm1.backward(du, cache.norm1)               # u = norm1(src + a)
            da = self.dropout1.backward(ds, cache.dropout1)         # a = dropout1(a)
            dquery, dkey, dvalue = self.self_attn.backward(da, cache.self_attn)
            dsrc = ds + (dquery + (dkey + dvalue))                  # a = self_attn(src, src, src)
        return caller_layout(dsrc, self.batch_first)


class DecoderLayerCache(NamedTuple):
    """One field per sub-layer the forward ran, named as its module (torch's names), and the
    two KV caches the next decoding step passes in."""
    norm1: LayerNormCache               # Pre-LN: of tgt; Post-LN: of tgt + a
    self_attn: AttentionLayerCache      # query, key and value all tgt (Pre-LN: norm1(tgt))
    dropout1: DropoutCache              # of the self-attention output a
    norm2: LayerNormCache               # Pre-LN: of u; Post-LN: of u + c
    multihead_attn: AttentionLayerCache     # query u (Pre-LN: norm2(u)), key and value memory
    dropout2: DropoutCache              # of the cross-attention output c
    norm3: LayerNormCache               # Pre-LN: of w; Post-LN: of w + f
    linear1: LinearCache                # (B, T, C) -> (B, T, F)
    activation: tuple                   # ReLUCache or GELUCache of (B, T, F)
    dropout: DropoutCache               # inside the FFN, of (B, T, F)
    linear2: LinearCache                # (B, T, F) -> (B, T, C)
    dropout3: DropoutCache              # of the FFN output f
    present: KVCache    # self-attention (k, v) (B, H, P + T, C/H): pass as past_kv next time
    cross_kv: KVCache   # cross-attention (k, v) of the memory (B, H, S, C/H): static_kv


class TransformerDecoderLayer(_Layer):
    """torch.nn.TransformerDecoderLayer (batch_first True by default: (B, T, C); False: (T, B, C)):
    self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3.
    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False,
            rng=None, *, past_kv=None, static_kv=None) -> (out, cache)
    backward(dout, cache) -> (dtgt, dmemory); dmemory is None when static_kv replaced it.
    With past_kv (P earlier positions), tgt_mask is (T, P + T), tgt_key_padding_mask (B, P + T)
    and tgt_is_causal lets query i see keys j <= P + i. With static_kv, memory is None."""

    sublayers = 3

    def check_inputs(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                     memory_key_padding_mask, past_kv, static_kv) -> None:
        """tgt and memory in the layer's layout (batch_first or not)."""
        check_sequence("tgt", tgt, self.d_model, self.dtype, legend("T", self.batch_first))
        batch, length = caller_layout(tgt, self.batch_first).shape[:2]
        if static_kv is None:
            check_sequence("memory", memory, self.d_model, self.dtype,
                           legend("S", self.batch_first))
            memory_batch, sources = caller_layout(memory, self.batch_first).shape[:2]
            if memory_batch != batch:
                raise ValueError(f"memory must have the batch size of tgt ({batch}); got shape "
                                 f"{memory.shape}")
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
        """tgt (B, T, C), memory (B, S, C) -> y (B, T, C), one sub-layer per line:
            Pre-LN   u = tgt + dropout1(self_attn(norm1(tgt)))
                     w = u + dropout2(multihead_attn(norm2(u), memory))
                     y = w + dropout3(ffn(norm3(w)))
            Post-LN  u = norm1(tgt + dropout1(self_attn(tgt)))
                     w = norm2(u + dropout2(multihead_attn(u, memory)))
                     y = norm3(w + dropout3(ffn(w)))
        with ffn(h) = linear2(dropout(activation(linear1(h)))); the memory is the cross-
        attention's key and value (with static_kv, memory is None and static_kv holds them)."""
        self.check_inputs(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                          memory_key_padding_mask, past_kv, static_kv)
        tgt = batch_major(tgt, self.batch_first)                    # (B, T, C)
        memory = batch_major(memory, self.batch_first)              # (B, S, C)
        self_options = dict(key_padding_mask=tgt_key_padding_mask, attn_mask=tgt_mask,
                            is_causal=bool(tgt_is_causal), rng=rng, past_kv=past_kv)
        cross_options = dict(key_padding_mask=memory_key_padding_mask, attn_mask=memory_mask,
                             is_causal=bool(memory_is_causal), rng=rng, static_kv=static_kv)
        if self.norm_first:
            h, norm1 = self.norm1.forward(tgt)                      # (B, T, C)
            a, self_attn = self.self_attn.forward(h, h, h, **self_options)  # (B, T, C)
            a, dropout1 = self.dropout1.forward(a, rng)
            u = tgt + a
            h, norm2 = self.norm2.forward(u)                        # (B, T, C)
            c, multihead_attn = self.multihead_attn.forward(h, memory, memory, **cross_options)
            c, dropout2 = self.dropout2.forward(c, rng)             # (B, T, C)
            w = u + c
            h, norm3 = self.norm3.forward(w)                        # (B, T, C)
            z, linear1 = self.linear1.forward(h)                    # (B, T, F)
            z, activation = self.activation.forward(z)
            z, dropout = self.dropout.forward(z, rng)
            f, linear2 = self.linear2.forward(z)                    # (B, T, C)
            f, dropout3 = self.dropout3.forward(f, rng)
            y = w + f
        else:
            a, self_attn = self.self_attn.forward(tgt, tgt, tgt, **self_options)  # (B, T, C)
            a, dropout1 = self.dropout1.forward(a, rng)
            u, norm1 = self.norm1.forward(tgt + a)                  # (B, T, C)
            c, multihead_attn = self.multihead_attn.forward(u, memory, memory, **cross_options)
            c, dropout2 = self.dropout2.forward(c, rng)             # (B, T, C)
            w, norm2 = self.norm2.forward(u + c)                    # (B, T, C)
            z, linear1 = self.linear1.forward(w)                    # (B, T, F)
            z, activation = self.activation.forward(z)
            z, dropout = self.dropout.forward(z, rng)
            f, linear2 = self.linear2.forward(z)                    # (B, T, C)
            f, dropout3 = self.dropout3.forward(f, rng)
            y, norm3 = self.norm3.forward(w + f)                    # (B, T, C)
        y = caller_layout(y, self.batch_first)
        return y, DecoderLayerCache(norm1, self_attn, dropout1, norm2, multihead_attn, dropout2,
                                    norm3, linear1, activation, dropout, linear2, dropout3,
                                    self_attn.present, multihead_attn.present)

    def backward(self, dy, cache: DecoderLayerCache):
        """The forward in exact reverse, each line commented with the forward line it undoes
        (the residual sums as in TransformerEncoderLayer.backward). The memory is the cross-
        attention's key and value, so its gradient is dkey + dvalue (None with static_kv:
        those keys and values were computed by an earlier call)."""
        dy = batch_major(dy, self.batch_first)                      # (B, T, C)
        if self.norm_first:
            df = self.dropout3.backward(dy, cache.dropout3)         # f = dropout3(f); y = w + f
            dz = self.linear2.backward(df, cache.linear2)           # f = linear2(z)
            dz = self.dropout.backward(dz, cache.dropout)           # z = dropout(z)
            dz = self.activation.backward(dz, cache.activation)     # z = activation(z)
            dh = self.linear1.backward(dz, cache.linear1)           # z = linear1(h)
            dw = dy + self.norm3.backward(dh, cache.norm3)          # h = norm3(w)
            dc = self.dropout2.backward(dw, cache.dropout2)         # c = dropout2(c); w = u + c
            dh, dkey, dvalue = self.multihead_attn.backward(dc, cache.multihead_attn)
            dmemory = None if dkey is None else dkey + dvalue       # c = multihead_attn(h, memory)
            du = dw + self.norm2.backward(dh, cache.norm2)          # h = norm2(u)
            da = self.dropout1.backward(du, cache.dropout1)         # a = dropout1(a); u = tgt + a
            dquery, dkey, dvalue = self.self_attn.backward(da, cache.self_attn)
            dh = dquery + (dkey + dvalue)                           # a = self_attn(h, h, h)
            dtgt = du + self.norm1.backward(dh, cache.norm1)        # h = norm1(tgt)
        else:
            ds = self.norm3.backward(dy, cache.norm3)               # y = norm3(w + f)
            df = self.dropout3.backward(ds, cache.dropout3)         # f = dropout3(f)
            dz = self.linear2.backward(df, cache.linear2)           # f = linear2(z)
            dz = self.dropout.backward(dz, cache.dropout)           # z = dropout(z)
            dz = self.activation.backward(dz, cache.activation)     # z = activation(z)
            dw = ds + self.linear1.backward(dz, cache.linear1)      # z = linear1(w)
            ds = self.norm2.backward(dw, cache.norm2)               # w = norm2(u + c)
            dc = self.dropout2.backward(ds, cache.dropout2)         # c = dropout2(c)
            dquery, dkey, dvalue = self.multihead_attn.backward(dc, cache.multihead_attn)
            dmemory = None if dkey is None else dkey + dvalue       # c = multihead_attn(u, memory)
            du = ds + dquery
            ds = self.norm1.backward(du, cache.norm1)               # u = norm1(tgt + a)
            da = self.dropout1.backward(ds, cache.dropout1)         # a = dropout1(a)
            dquery, dkey, dvalue = self.self_attn.backward(da, cache.self_attn)
            dtgt = ds + (dquery + (dkey + dvalue))                  # a = self_attn(tgt, tgt, tgt)
        return caller_layout(dtgt, self.batch_first), caller_layout(dmemory, self.batch_first)
