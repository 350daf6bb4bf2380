"""GPT-NeoX's self-attention (HF GPTNeoXAttention): one fused `query_key_value` Linear whose
output is grouped per head, rotary positions on the first rotary_dim features of each head
only, causal attention, and the `dense` output projection.

Shapes: B batch, T new positions, P positions already in a KV cache, C width, H heads,
d = C / H head width, R rotary_dim (even, 0 < R <= d).

    qkv = query_key_value(x)                 (B, T, 3C)   per head h: [q_h | k_h | v_h]
        -> (B, H, T, 3d) -> q, k, v          (B, H, T, d) each: features 0..d-1, d..2d-1, 2d..3d-1
    q, k = partial RoPE (features 0..R-1 rotate, halves layout; R..d-1 pass through)
    a = attention(q, [past_k, k], [past_v, v])   causal, scale 1/sqrt(d)   (B, H, T, d)
    y = dense(merge(a))                      (B, T, C)

The per-head grouping is the difference from GPT-2's fused qkv (numpy_tf's FusedAttention),
whose output is [all q | all k | all v]: output feature 3d h + j is q_h's feature j, 3d h + d + j
is k_h's and 3d h + 2d + j is v_h's (HF: `qkv.view(B, T, H, 3d).transpose(1, 2).chunk(3, -1)`).
A checkpoint's query_key_value is therefore loaded as it is, and its gradient is returned in
the same per-head layout.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.paths import kernels_enabled
from ..kernels.attention import attention_backward_into
from .attention import (AttentionCache, AttentionKernelCache, attention_backward,
                        attention_forward, kernel_attention_forward)
from .dropout import check_probability
from .linear import Linear, LinearCache
from .multihead import KVCache, merge_heads, split_heads
from .rope import PartialRoPECache, partial_rope_backward, partial_rope_forward


class NeoXAttentionCache(NamedTuple):
    query_key_value: LinearCache    # x (B, T, C) and the weight (3C, C)
    rope_q: PartialRoPECache        # the queries' rotation
    rope_k: PartialRoPECache        # the new keys' rotation
    attention: AttentionCache       # holds the probabilities (B, H, T, P + T)
    dense: LinearCache              # the merged heads (B, T, C)
    past_length: int                # P: keys an incoming KV cache already held
    present: KVCache                # (k, v) heads (B, H, P + T, d) after RoPE: the next cache

    @property
    def output_spec(self):          # the (shape, dtype) dy must have: dense's output
        return self.dense.output_spec


class NeoXAttention(Module):
    """Causal self-attention with GPT-NeoX's names (query_key_value, dense) and layout.

    forward(x, key_padding_mask=None, positions=None, past_kv=None, rng=None): x (B, T, C);
    key_padding_mask (B, P + T) True at padding; positions (T,) or (B, T), default
    P .. P + T - 1; past_kv the `present` (k, v) of an earlier call. Returns (y, cache);
    backward(dy, cache) -> dx."""

    def __init__(self, width: int, num_heads: int, rotary_dim: int | None = None,
                 rope_base: float = 10000.0, bias: bool = True, dropout: float = 0.0, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        width = validate.positive_int("width", width)
        self.num_heads = validate.positive_int("num_heads", num_heads)
        if width % num_heads:
            raise ValueError(f"width ({width}) must be divisible by num_heads ({num_heads})")
        self.head_dim = width // num_heads
        rotary_dim = self.head_dim if rotary_dim is None else rotary_dim
        self.rotary_dim = validate.even_positive_int("rotary_dim", rotary_dim,
                                                     "RoPE rotates pairs of features")
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be at most the head width "
                             f"width / num_heads = {self.head_dim}")
        self.rope_base = validate.positive_float("rope_base", rope_base)
        self.dropout = check_probability(dropout)
        rng = np.random.default_rng(rng)
        self.query_key_value = Linear(width, 3 * width, bias, rng=rng, dtype=dtype)
        self.dense = Linear(width, width, bias, rng=rng, dtype=dtype)

    def forward(self, x, key_padding_mask=None, positions=None, past_kv=None, rng=None):
        validate.float_array("x", x, ndim=3, shape="(B, T, C)")
        d = self.head_dim
        past_length = 0 if past_kv is None else past_kv[0].shape[2]
        if positions is None:
            positions = np.arange(past_length, past_length + x.shape[1])     # (T,)
        qkv, query_key_value = self.query_key_value.forward(x)               # (B, T, 3C)
        qkv = split_heads(qkv, self.num_heads)                               # (B, H, T, 3d)
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]          # (B, H, T, d)
        q, rope_q = partial_rope_forward(q, positions, self.rotary_dim, base=self.rope_base)
        k, rope_k = partial_rope_forward(k, positions, self.rotary_dim, base=self.rope_base)
        if past_kv is not None:
            k = np.concatenate([past_kv[0], k], axis=2)                      # (B, H, P + T, d)
            v = np.concatenate([past_kv[1], v], axis=2)
        forward = kernel_attention_forward if kernels_enabled() else attention_forward
        heads, attention = forward(
            q, k, v, None, key_padding_mask, True, past_length,
            self.dropout if self.training else 0.0, rng)                     # (B, H, T, d)
        y, dense = self.dense.forward(merge_heads(heads))                    # (B, T, C)
        return y, NeoXAttentionCache(query_key_value, rope_q, rope_k, attention, dense,
                                     past_length, KVCache(k, v))

    def backward(self, dy, cache: NeoXAttentionCache):
        """The forward in reverse. The three head gradients join along the last axis in the
        order they were cut from each head's 3d features, [dq_h | dk_h | dv_h], and merging
        the heads puts them back in query_key_value's per-head output layout. Gradients of the
        keys an incoming KV cache held are not propagated (they were an earlier call's)."""
        validate.backward_inputs(dy, cache, NeoXAttentionCache, "dy")
        validate.cache_fits("number of heads", cache.attention.q.shape[1], self.num_heads)
        validate.cache_fits("rotary_dim", cache.rope_q.rotary_dim, self.rotary_dim)
        validate.cache_fits("query_key_value weight", cache.query_key_value.weight,
                            self.query_key_value.weight.data)
        validate.cache_fits("dense weight", cache.dense.weight, self.dense.weight.data)
        dheads = split_heads(self.dense.backward(dy, cache.dense), self.num_heads)  # (B, H, T, d)
        if type(cache.attention) is AttentionKernelCache:
            dq, dk, dv = attention_backward_into(dheads, *cache.attention)
        else:
            dq, dk, dv = attention_backward(dheads, cache.attention)
        p = cache.past_length
        dk, dv = dk[:, :, p:], dv[:, :, p:]                                  # (B, H, T, d)
        dq = partial_rope_backward(dq, cache.rope_q)
        dk = partial_rope_backward(dk, cache.rope_k)
        dqkv = merge_heads(np.concatenate([dq, dk, dv], axis=-1))            # (B, T, 3C)
        return self.query_key_value.backward(dqkv, cache.query_key_value)
