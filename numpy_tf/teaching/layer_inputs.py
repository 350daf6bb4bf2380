"""How numpy_tf.teaching.layer_table draws each layer's forward arguments.

build(g, shape, dtype, **options) -> the forward's keyword arguments, in its signature's order;
g is the numpy Generator every value is drawn from (in float64, then cast to dtype), `shape`
the main input's shape, `options` the edge case's (numpy_tf.teaching.layer_table.LAYERS).
ReLU inputs stay 0.05 away from the kink: finite differences are meaningless across it.
An input named `rng` holds a seed (LayerSpec.call makes a fresh Generator of it at each call).
"""
from __future__ import annotations

import numpy as np


def normal(g, shape, dtype, scale: float = 1.0) -> np.ndarray:
    return (g.standard_normal(shape) * scale).astype(dtype)


def linear(g, shape, dtype, out_features=5, bias=True):
    return {"x": normal(g, shape, dtype),
            "weight": normal(g, (out_features, shape[-1]), dtype),
            "bias": normal(g, (out_features,), dtype) if bias else None}


def embedding(g, shape, dtype, vocab=6, dim=4, padding_idx=None, repeated=False):
    ids = np.full(shape, 3) if repeated else g.integers(0, vocab, shape)
    if padding_idx is not None:
        ids.flat[::2] = padding_idx
    return {"ids": ids, "weight": normal(g, (vocab, dim), dtype), "padding_idx": padding_idx}


def away_from_zero(g, shape, dtype, sign=None):
    x = g.standard_normal(shape)
    x = np.sign(x) * (0.05 + np.abs(x)) if sign is None else sign * (0.05 + np.abs(x))
    return {"x": x.astype(dtype)}


def elementwise(g, shape, dtype, scale=1.0, **fixed):
    return {"x": normal(g, shape, dtype, scale), **fixed}


def cross_entropy(g, shape, dtype, ignored=0, label_smoothing=0.0, reduction="mean",
                   scale=1.0, ignore_index=-100):
    targets = g.integers(0, shape[-1], shape[:-1])
    targets.flat[:targets.size if ignored == "all" else ignored] = ignore_index
    return {"logits": normal(g, shape, dtype, scale), "targets": targets,
            "ignore_index": ignore_index, "label_smoothing": label_smoothing,
            "reduction": reduction}


def attention(g, shape, dtype, kv_heads=None, keys=None, value_dim=None, causal=False,
               mask=None, padding=None, dropout_p=0.0, causal_offset=0, scale=None,
               window=None, softcap=None):
    batch, heads, queries, width = shape
    groups, keys = kv_heads or heads, keys or queries
    attn_mask = key_padding_mask = None
    if mask == "float":
        attn_mask = normal(g, (queries, keys), dtype)
    elif mask == "blocked row":                         # query 0 may see no key at all
        attn_mask = g.random((queries, keys)) < 0.3
        attn_mask[0] = True
    if padding == "one sequence all padding":
        key_padding_mask = np.zeros((batch, keys), dtype=bool)
        key_padding_mask[-1] = True
        key_padding_mask[0, -1] = True
    return {"q": normal(g, shape, dtype), "k": normal(g, (batch, groups, keys, width), dtype),
            "v": normal(g, (batch, groups, keys, value_dim or width), dtype),
            "attn_mask": attn_mask, "key_padding_mask": key_padding_mask, "is_causal": causal,
            "causal_offset": causal_offset, "dropout_p": dropout_p, "rng": 7, "scale": scale,
            "window": window, "softcap": softcap}


def flash_attention(g, shape, dtype, block_q=64, block_k=64, tiles=None, **options):
    """attention's inputs (no dropout: FlashAttention's reference has none) and the tiles
    (`tiles` (block_q, block_k) at once)."""
    inputs = attention(g, shape, dtype, **options)
    del inputs["dropout_p"], inputs["rng"], inputs["window"], inputs["softcap"]
    block_q, block_k = tiles or (block_q, block_k)
    return {**inputs, "block_q": block_q, "block_k": block_k}


def row_norm(g, shape, dtype, weight=True, bias=True, special_rows=False, eps=1e-5,
              rms=False, unit_offset=False):
    """LayerNorm's inputs, or RMSNorm's (`rms`; with `unit_offset`, Gemma's 1 + w scale)."""
    x = g.standard_normal(shape)
    if special_rows:                # RMSNorm: rows of zeros; LayerNorm: rows of nearly one value
        x.reshape(-1, shape[-1])[0] = 0.0 if rms else 0.7 + 1e-7 * g.standard_normal(shape[-1])
        x.reshape(-1, shape[-1])[1] = 0.0 if rms else -1.3
    inputs = {"x": x.astype(dtype),
              "weight": (1.0 + normal(g, shape[-1:], np.float64, 0.3)).astype(dtype)
              if weight else None}
    if not rms:
        inputs["bias"] = normal(g, shape[-1:], dtype) if bias else None
        return {**inputs, "eps": eps}
    return {**inputs, "eps": eps, "unit_offset": unit_offset}


def learned_positions(g, shape, dtype, max_context=6, offset=0):
    return {"x": normal(g, shape, dtype), "weight": normal(g, (max_context, shape[-1]),
                                                               dtype), "offset": offset}


def rope(g, shape, dtype, interleaved=False, per_batch=False, offset=0, base=10000.0):
    batch, _, length, _ = shape
    positions = np.stack([offset + g.permutation(3 * length)[:length] for _ in range(batch)]) \
        if per_batch else np.arange(offset, offset + length)
    return {"x": normal(g, shape, dtype), "positions": positions, "base": base,
            "interleaved": interleaved}


def partial_rope(g, shape, dtype, rotary_dim=None, interleaved=False, per_batch=False,
                 offset=0, base=10000.0):
    """RoPE's inputs and rotary_dim (default: an even half of D, at least 2)."""
    inputs = rope(g, shape, dtype, interleaved, per_batch, offset, base)
    inputs["rotary_dim"] = max(2, shape[-1] // 4 * 2) if rotary_dim is None else rotary_dim
    return inputs


def swiglu(g, shape, dtype, hidden=6, bias=False, activation="silu"):
    """`bias`: True (all three), False (none), or the ones to have, e.g. ("down",)."""
    width = shape[-1]
    inputs = {"x": normal(g, shape, dtype), "gate_weight": normal(g, (hidden, width), dtype),
              "up_weight": normal(g, (hidden, width), dtype),
              "down_weight": normal(g, (width, hidden), dtype)}
    for name, size in (("gate_bias", hidden), ("up_bias", hidden), ("down_bias", width)):
        wanted = bias if isinstance(bias, bool) else name[:-len("_bias")] in bias
        inputs[name] = normal(g, (size,), dtype) if wanted else None
    return {**inputs, "activation": activation}


def _top_k_margin(logits, top_k) -> float:
    """The smallest gap between a row's k-th and (k+1)-th largest logit (inf for k = E)."""
    if top_k == logits.shape[-1]:
        return np.inf
    ordered = -np.sort(-logits.reshape(-1, logits.shape[-1]), axis=-1)
    return float((ordered[:, top_k - 1] - ordered[:, top_k]).min())


def moe(g, shape, dtype, experts=4, top_k=2, hidden=3):
    """Redrawn until every token's top-k router logits lead the rest by 0.01: the routing is
    piecewise constant, and finite differences are meaningless across a tie."""
    width = shape[-1]
    while True:
        x, router = g.standard_normal(shape), g.standard_normal((experts, width))
        if _top_k_margin(x @ router.T, top_k) >= 0.01:
            break
    return {"x": x.astype(dtype), "router_weight": router.astype(dtype),
            "gate_weights": normal(g, (experts, hidden, width), dtype),
            "up_weights": normal(g, (experts, hidden, width), dtype),
            "down_weights": normal(g, (experts, width, hidden), dtype), "top_k": top_k}


def load_balancing_loss(g, shape, dtype, top_k=2, padded=False, scale=1.0):
    """Router logits (L, N, E) of standard deviation 2 `scale`, redrawn until every row's
    top-k lead by 0.01 (as moe)."""
    while True:
        logits = g.standard_normal(shape) * (2.0 * scale)
        if min(_top_k_margin(z, top_k) for z in logits) >= 0.01:
            break
    padding = np.arange(shape[1]) % 3 == 2 if padded else None
    return {"router_logits": logits.astype(dtype), "top_k": top_k, "padding_mask": padding}


def cbow(g, shape, dtype, vocab=7, dim=3, repeated=False):
    contexts = g.integers(0, vocab, shape)
    if repeated:
        contexts[:, :2] = 4                 # a word twice in every context
    return {"contexts": contexts, "weight": normal(g, (vocab, dim), dtype)}


def gate(g, shape, dtype, scale=1.0, activation="silu"):
    return {"gate": normal(g, shape, dtype, scale), "up": normal(g, shape, dtype),
            "activation": activation}
