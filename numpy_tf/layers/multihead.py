"""Multi-head attention in the three layouts users meet, around one shared computation.

Shapes: B batch, Tq / Tk query / key lengths, C model width, H query heads, G key/value heads,
d head width (C = H d unless head_dim is set).

    q = project_q(query)   (B, Tq, H d)  -> heads (B, H, Tq, d)  -> q_norm -> RoPE (optional)
    k = project_k(key)     (B, Tk, G d)  -> heads (B, G, Tk, d)  -> k_norm -> RoPE (optional)
    v = project_v(value)   (B, Tk, G d)  -> heads (B, G, Tk, d)
    a = attention(q, k, v, masks)              (B, H, Tq, d)     numpy_tf.attention
    y = output(merge(a))                       (B, Tq, C)

Layouts (the parameter names are the ones each family's torch code uses):
  MultiHeadAttention      q_proj, k_proj, v_proj, o_proj; grouped-query heads (HF Llama);
                          optionally q_norm, k_norm: an RMSNorm over each head's d features
                          of q and k, before RoPE (HF Qwen3)
  FusedAttention          qkv (one Linear to 3C), output (GPTConfig.tiny()'s GPT; GPT-2 with biases)
  TorchMultiheadAttention in_proj_weight, in_proj_bias, out_proj (torch.nn.MultiheadAttention)

forward(query, key=None, value=None, ...): key None is self-attention (backward returns dquery,
the sum over the three uses); key given and value None uses key as the value too (cross-
attention into a memory: backward returns (dquery, dkey)); all three given returns all three.
`past_kv` (k, v) heads from earlier calls are prepended (a KV cache: run state passed in, never
kept on the layer; causal masks and RoPE positions shift by its length), and `static_kv` (k, v)
replaces the key/value projections (cross-attention keys computed once). The cache's `present`
holds the (k, v) to pass next time.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from ..core.paths import kernels_enabled
from ..kernels.attention import attention_backward_into, qkv_gradient
from .attention import (AttentionCache, AttentionKernelCache, attention_backward,
                        attention_forward, check_window, kernel_attention_forward)
from .dropout import check_probability
from .linear import Linear, LinearCache, linear_backward, linear_forward
from .norm import RMSNorm, RMSNormCache
from .rope import RoPECache, rope_backward, rope_forward
from .rope_scaling import RopeScaling, as_rope_scaling


class ProjectionCaches(NamedTuple):
    q: LinearCache              # the query projection's
    k: LinearCache | None       # the key and value projections' (None with static_kv)
    v: LinearCache | None


class RotaryCaches(NamedTuple):
    q: RoPECache                # the queries' rotation
    k: RoPECache | None         # the keys' (None with static_kv: rotated when projected)


class HeadNormCaches(NamedTuple):
    q: RMSNormCache             # q_norm's, of the query heads (B, H, Tq, d)
    k: RMSNormCache | None      # k_norm's, of the key heads (B, G, Tk, d); None with static_kv


class KVCache(NamedTuple):
    """One attention layer's keys and values after a call (a plain (k, v) tuple is accepted
    wherever one is passed in)."""
    k: np.ndarray               # (B, G, Tk, d), after RoPE
    v: np.ndarray               # (B, G, Tk, d)


class AttentionLayerCache(NamedTuple):
    projections: LinearCache | ProjectionCaches     # the fused qkv's, or one per projection
    rope: RotaryCaches | None
    attention: AttentionCache   # holds the probabilities (B, H, Tq, Tk)
    output: LinearCache
    past_length: int            # keys an incoming KV cache already held
    present: KVCache            # (k, v) heads (B, G, Tk, d) after RoPE: the next KV cache
    inputs: str                 # "self", "key" or "key_value": the gradients to return
    static: bool                # keys and values came from static_kv (no projection to undo)
    head_norms: HeadNormCaches | None = None    # q_norm / k_norm's, when the layer has them

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.output.output_spec


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, T, heads d) -> (B, heads, T, d)."""
    batch, length, width = x.shape
    return x.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, heads, T, d) -> (B, T, heads d); the inverse of split_heads (and its backward)."""
    batch, heads, length, width = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * width)


class HeadAttention(Module):
    """The computation every layout shares; a layout supplies _project, _project_backward and
    the output projection (self.output_layer), and may hold q_norm / k_norm (RMSNorms over a
    head's features) and a rope_scaling."""
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    rope_scaling: RopeScaling | None = None

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dropout: float,
                 rope: bool, rope_base: float, rope_interleaved: bool, dtype):
        super().__init__(dtype)
        self.num_heads = validate.positive_int("num_heads", num_heads)
        self.num_kv_heads = validate.positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads "
                             f"({num_heads})")
        self.head_dim = validate.positive_int("head_dim", head_dim)
        if rope and head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim; got {head_dim}")
        self.dropout = check_probability(dropout)
        self.rope, self.rope_base, self.rope_interleaved = rope, float(rope_base), \
            rope_interleaved
        # a layout may narrow these (MultiHeadAttention: Mistral's and Gemma2's options)
        self.sliding_window, self.softcap, self.scale = None, None, None

    # the layout's part ------------------------------------------------------------------------
    def _project(self, query, key, value):
        raise NotImplementedError

    def _project_backward(self, dq, dk, dv, caches, inputs):
        """The projections' backward from the head gradients dq (B, H, Tq, d) and dk, dv
        (B, G, Tk, d) (None with static_kv); returns what backward returns."""
        raise NotImplementedError

    @property
    def output_layer(self) -> Linear:
        raise NotImplementedError

    def project_kv(self, memory: np.ndarray):
        """Key and value heads (B, G, Tk, d) of a memory, computed once for cross-attention
        decoding (pass them as static_kv)."""
        validate.float_array("memory", memory, ndim=3, shape="(B, Tk, C)")
        validate.last_dim("memory", memory, self.output_layer.out_features, "the model width C")
        _, k, v, _ = self._project(memory[:, :1], memory, memory)
        return KVCache(split_heads(k, self.num_kv_heads), split_heads(v, self.num_kv_heads))

    # the shared computation -------------------------------------------------------------------
    def _check_inputs(self, query, key, value, past_kv, static_kv) -> None:
        """query (B, Tq, C), key and value (B, Tk, C) of the query's dtype, and the KV caches
        (k, v) heads (B, G, P, d) of the query's batch and dtype, before any work."""
        width = self.output_layer.out_features
        if key is None and value is None and static_kv is None and \
                type(query) is np.ndarray and query.ndim == 3 and \
                query.dtype in validate.FLOAT_DTYPES and query.shape[2] == width and \
                (past_kv is None or self._plain_kv(past_kv, query)):
            return                      # self-attention's usual inputs, accepted in one test
        validate.float_array("query", query, ndim=3, shape="(B, Tq, C)")
        validate.last_dim("query", query, width, "the model width C")
        if static_kv is not None and key is not None:
            raise ValueError("give either key/value or static_kv, not both")
        for name, x in (("key", key), ("value", value)):
            if x is not None:
                validate.float_array(name, x, ndim=3, shape="(B, Tk, C)")
                validate.same_dtype(query=query, **{name: x})
                validate.last_dim(name, x, width, "the model width C")
                if x.shape[0] != query.shape[0]:
                    raise ValueError(f"{name} must have the query's batch size "
                                     f"{query.shape[0]}; got shape {x.shape}")
        if value is not None and value.shape[:2] != key.shape[:2]:
            raise ValueError(f"key and value must have the same batch and length; got "
                             f"{key.shape} and {value.shape}")
        for name, pair in (("past_kv", past_kv), ("static_kv", static_kv)):
            if pair is not None:
                self._check_kv(name, pair, query)

    def _plain_kv(self, pair, query: np.ndarray) -> bool:
        """_check_kv's requirements of a usual KV cache in one expression (a decoded token's
        checks cost more than its attention)."""
        if not isinstance(pair, tuple) or len(pair) != 2:
            return False
        k, v = pair
        return (type(k) is np.ndarray and type(v) is np.ndarray and k.ndim == 4
                and k.dtype == query.dtype == v.dtype
                and k.shape == v.shape == (query.shape[0], self.num_kv_heads, k.shape[2],
                                           self.head_dim))

    def _check_kv(self, name: str, pair, query: np.ndarray) -> None:
        """A KV cache: (k, v), each (B, G, P, d) with the query's B and dtype, one P."""
        legend = (f"(B, G, P, d) = ({query.shape[0]}, {self.num_kv_heads}, P, "
                  f"{self.head_dim})")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{name} must be a pair (k, v) of arrays {legend} (the `present` "
                            f"of an earlier call's cache); got {validate.kind_of(pair)}")
        for part, array in zip(("k", "v"), pair):
            validate.float_array(f"{name}'s {part}", array, ndim=4, shape=legend)
            validate.same_dtype(query=query, **{f"{name}'s {part}": array})
        k, v = pair
        expected = (query.shape[0], self.num_kv_heads, k.shape[2], self.head_dim)
        if k.shape != expected or v.shape != expected:
            raise ValueError(f"{name} must be (k, v), each of shape {legend} with one P: the "
                             f"`present` of an earlier call's cache; got {k.shape} and "
                             f"{v.shape}")

    def forward(self, query, key=None, value=None, *, attn_mask=None, key_padding_mask=None,
                is_causal: bool = False, positions=None, past_kv=None, static_kv=None,
                rng: np.random.Generator | None = None):
        self._check_inputs(query, key, value, past_kv, static_kv)
        inputs = "self" if key is None else ("key" if value is None else "key_value")
        key = query if key is None else key
        value = key if value is None else value
        static = static_kv is not None
        q, k, v, projections = self._project(query, None if static else key,
                                             None if static else value)
        q = split_heads(q, self.num_heads)                              # (B, H, Tq, d)
        past_length = 0 if past_kv is None else past_kv[0].shape[2]
        rope_caches = head_norms = None
        if static:
            k, v = static_kv
        else:
            k = split_heads(k, self.num_kv_heads)                       # (B, G, Tk, d)
            v = split_heads(v, self.num_kv_heads)
        if self.q_norm is not None:
            q, q_norm = self.q_norm.forward(q)                          # (B, H, Tq, d)
            k_norm = None
            if not static:
                k, k_norm = self.k_norm.forward(k)                      # (B, G, Tk, d)
            head_norms = HeadNormCaches(q_norm, k_norm)
        if self.rope:
            if positions is None:
                positions = np.arange(past_length, past_length + query.shape[1])
            q, q_rope = rope_forward(q, positions, self.rope_base, self.rope_interleaved,
                                     self.rope_scaling)
            k_rope = None
            if not static:
                k, k_rope = rope_forward(k, positions, self.rope_base, self.rope_interleaved,
                                         self.rope_scaling)
            rope_caches = RotaryCaches(q_rope, k_rope)
        if past_kv is not None:
            k = np.concatenate([past_kv[0], k], axis=2)
            v = np.concatenate([past_kv[1], v], axis=2)
        forward = kernel_attention_forward if kernels_enabled() else attention_forward
        heads, attention = forward(
            q, k, v, attn_mask, key_padding_mask, is_causal, past_length,
            self.dropout if self.training else 0.0, rng, self.scale, self.sliding_window,
            self.softcap)                                               # (B, H, Tq, dv)
        out, output = self.output_layer.forward(merge_heads(heads))     # (B, Tq, C)
        return out, AttentionLayerCache(projections, rope_caches, attention, output,
                                        past_length, KVCache(k, v), inputs, static, head_norms)

    def _check_cache(self, cache) -> None:
        """The cache is an AttentionLayerCache of this layout (projection_cache), made by a
        layer with this one's heads."""
        if not isinstance(cache, AttentionLayerCache) or \
                not isinstance(cache.projections, self.projection_cache):
            made = validate.kind_of(cache)
            if isinstance(cache, AttentionLayerCache):
                made += f" of projections {type(cache.projections).__name__}"
            raise TypeError(f"cache must be the AttentionLayerCache this layer's forward "
                            f"returned (projections {self.projection_cache.__name__}); got "
                            f"{made}")
        validate.cache_fits("number of query heads", cache.attention.q.shape[1],
                            self.num_heads)

    def backward(self, dout, cache: AttentionLayerCache):
        """The forward in reverse: output projection, merge of the heads, attention, RoPE
        (its inverse rotation), q_norm / k_norm, split of the heads, the projections. Gradients of keys an
        incoming KV cache held (or of static_kv) are not propagated: they were inputs of an
        earlier call. A forward outside reference_path() left an AttentionKernelCache, which
        takes the kernel's attention backward."""
        self._check_cache(cache)
        validate.backward_inputs(dout, cache, AttentionLayerCache)
        return self._heads_backward(dout, cache)

    def _heads_backward(self, dout, cache: AttentionLayerCache):
        """backward, once dout and the cache are checked."""
        dheads = split_heads(self.output_layer.backward(dout, cache.output), self.num_heads)
        if type(cache.attention) is AttentionKernelCache:
            dq, dk, dv = attention_backward_into(dheads, *cache.attention)
        else:
            dq, dk, dv = attention_backward(dheads, cache.attention)
        dk, dv = dk[:, :, cache.past_length:], dv[:, :, cache.past_length:]
        if cache.rope is not None:
            dq = rope_backward(dq, cache.rope.q)
            if cache.rope.k is not None:
                dk = rope_backward(dk, cache.rope.k)
        if cache.head_norms is not None:
            dq = self.q_norm.backward(dq, cache.head_norms.q)
            if cache.head_norms.k is not None:
                dk = self.k_norm.backward(dk, cache.head_norms.k)
        if cache.static:
            dk = dv = None
        return self._project_backward(dq, dk, dv, cache.projections, cache.inputs)


def _gradients(inputs: str, dquery, dkey, dvalue):
    """What backward returns for each way forward was called."""
    if inputs == "self":
        return dquery + dkey + dvalue if dkey is not None else dquery
    if inputs == "key":
        return dquery, (dkey + dvalue if dkey is not None else None)
    return dquery, dkey, dvalue


class MultiHeadAttention(HeadAttention):
    """Separate q_proj, k_proj, v_proj, o_proj (HF Llama names), grouped-query heads:
    H = num_heads query heads, G = num_kv_heads key/value heads (G = 1: multi-query).

    `bias` gives q_proj, k_proj and v_proj biases, and o_proj too unless `output_bias` says
    otherwise (Qwen2: bias=True, output_bias=False). `head_norm_eps` adds q_norm and k_norm,
    RMSNorms (weight (d,), that eps) over each query and key head before RoPE (Qwen3).
    `rope_scaling` is a scaled RoPE (numpy_tf.layers.rope_scaling).

    Options of the Llama-like families: `sliding_window` W (Mistral, Gemma2's sliding layers):
    query i sees only keys j > i - W (positions counted with a KV cache's, which keeps every
    key: decoding past the window equals recomputing the whole sequence); `softcap` c (Gemma2):
    scores c tanh(score / c); `scale` (Gemma2: query_pre_attn_scalar^-1/2) in place of
    1/sqrt(head_dim)."""
    projection_cache = ProjectionCaches

    def __init__(self, width: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, bias: bool = False, dropout: float = 0.0,
                 rope: bool = False, rope_base: float = 10000.0, rope_interleaved: bool = False,
                 *, output_bias: bool | None = None, head_norm_eps: float | None = None,
                 rope_scaling: RopeScaling | None = None, sliding_window: int | None = None,
                 softcap: float | None = None, scale: float | None = None,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        width = validate.positive_int("width", width)
        num_heads = validate.positive_int("num_heads", num_heads)
        if head_dim is None:
            if width % num_heads:
                raise ValueError(f"width ({width}) must be divisible by num_heads ({num_heads})"
                                 " (or give head_dim)")
            head_dim = width // num_heads
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        super().__init__(num_heads, num_kv_heads, head_dim, dropout, rope, rope_base,
                         rope_interleaved, dtype)
        self.sliding_window = check_window("sliding_window", sliding_window)
        self.softcap = None if softcap is None else validate.positive_float("softcap", softcap)
        self.scale = None if scale is None else validate.positive_float("scale", scale)
        rng = np.random.default_rng(rng)
        self.q_proj = Linear(width, num_heads * head_dim, bias, rng=rng, dtype=dtype)
        self.k_proj = Linear(width, num_kv_heads * head_dim, bias, rng=rng, dtype=dtype)
        self.v_proj = Linear(width, num_kv_heads * head_dim, bias, rng=rng, dtype=dtype)
        self.o_proj = Linear(num_heads * head_dim, width,
                             bias if output_bias is None else output_bias, rng=rng, dtype=dtype)
        if head_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, head_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, head_norm_eps, dtype=dtype)
        if rope_scaling is not None:
            if not rope:
                raise ValueError("rope_scaling needs rope=True: it scales the rotary "
                                 "frequencies")
            self.rope_scaling = as_rope_scaling(rope_scaling)

    @property
    def output_layer(self):
        return self.o_proj

    def _project(self, query, key, value):
        q, q_cache = self.q_proj.forward(query)
        if key is None:
            return q, None, None, ProjectionCaches(q_cache, None, None)
        k, k_cache = self.k_proj.forward(key)
        v, v_cache = self.v_proj.forward(value)
        return q, k, v, ProjectionCaches(q_cache, k_cache, v_cache)

    def _project_backward(self, dq, dk, dv, caches, inputs):
        dquery = self.q_proj.backward(merge_heads(dq), caches.q)
        if dk is None:
            return _gradients(inputs, dquery, None, None)
        return _gradients(inputs, dquery, self.k_proj.backward(merge_heads(dk), caches.k),
                          self.v_proj.backward(merge_heads(dv), caches.v))


class FusedAttention(HeadAttention):
    """One `qkv` Linear to 3C (q, k, v in that order along the output) and an `output` Linear:
    the 7,232-parameter Pre-LN GPT, GPTConfig.tiny() (no biases), and GPT-2 (with biases).
    Self-attention only."""
    projection_cache = LinearCache

    def __init__(self, width: int, num_heads: int, bias: bool = False, dropout: float = 0.0,
                 rope: bool = False, rope_base: float = 10000.0, rope_interleaved: bool = False,
                 *, rng: np.random.Generator | int = 0, dtype=np.float64):
        width = validate.positive_int("width", width)
        num_heads = validate.positive_int("num_heads", num_heads)
        if width % num_heads:
            raise ValueError(f"width ({width}) must be divisible by num_heads ({num_heads})")
        super().__init__(num_heads, num_heads, width // num_heads, dropout, rope, rope_base,
                         rope_interleaved, dtype)
        rng = np.random.default_rng(rng)
        self.width = width
        self.qkv = Linear(width, 3 * width, bias, rng=rng, dtype=dtype)
        self.output = Linear(width, width, bias, rng=rng, dtype=dtype)

    @property
    def output_layer(self):
        return self.output

    def forward(self, x, *, attn_mask=None, key_padding_mask=None, is_causal: bool = False,
                positions=None, past_kv=None, rng=None):
        return super().forward(x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                               is_causal=is_causal, positions=positions, past_kv=past_kv,
                               rng=rng)

    def _project(self, query, key, value):
        qkv, cache = self.qkv.forward(query)                            # (B, T, 3C)
        width = self.width
        q, k, v = qkv[..., :width], qkv[..., width:2 * width], qkv[..., 2 * width:]
        return q, k, v, cache

    def _heads_backward(self, dout, cache: AttentionLayerCache):
        """As HeadAttention's. A cache the kernels made, without RoPE or a KV cache, takes
        kernels.attention.qkv_gradient instead: the head gradients are written straight into
        the thirds of the qkv output's gradient (B, T, 3C), which is the same array the
        reference assembles from dq, dk and dv."""
        if type(cache.attention) is not AttentionKernelCache or cache.rope is not None or \
                cache.past_length:
            return super()._heads_backward(dout, cache)
        dheads = split_heads(self.output.backward(dout, cache.output), self.num_heads)
        dqkv = qkv_gradient(dheads, *cache.attention)                   # (B, T, 3C)
        del dheads                  # not held through the qkv backward, the step's peak
        return self.qkv.backward(dqkv, cache.projections)

    def _project_backward(self, dq, dk, dv, caches, inputs):
        """qkv = [q | k | v] along the last axis, so its gradient is [dq | dk | dv]."""
        dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
        return self.qkv.backward(dqkv, caches)                          # (B, T, 3C)


class TorchMultiheadAttention(HeadAttention):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, batch_first):
    in_proj_weight (3E, E) holding W_q, W_k, W_v stacked, in_proj_bias (3E,), out_proj.

    forward(query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False) has
    torch's meaning (bool True = blocked; a 3-D attn_mask is (B * num_heads, Tq, Tk)) and
    backward returns (dquery, dkey, dvalue) -- pass the same array three times for self-
    attention and add the three gradients, as autograd would.

    batch_first=True (numpy_tf's default) takes (B, T, E); batch_first=False (torch's default)
    takes and returns sequence-first (T, B, E), as do backward's dout and gradients: the
    first two axes are swapped at the entry (into memory order, so the arithmetic is
    batch_first's bit for bit) and the exit (a view), and everything in between (the weights,
    key_padding_mask (B, Tk), attn_mask, the KV caches' (B, H, T, d)) is the same."""
    projection_cache = ProjectionCaches

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 *, batch_first: bool = True, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        self.batch_first = validate.flag("batch_first", batch_first)
        embed_dim = validate.positive_int("embed_dim", embed_dim)
        num_heads = validate.positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        super().__init__(num_heads, num_heads, embed_dim // num_heads, dropout, False, 0.0,
                         False, dtype)
        rng = np.random.default_rng(rng)
        self.embed_dim = embed_dim
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))           # xavier_uniform_
        self.in_proj_weight = Parameter(rng.uniform(-bound, bound, (3 * embed_dim, embed_dim))
                                        .astype(self.dtype))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, self.dtype)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias, rng=rng, dtype=dtype)
        if bias:
            self.out_proj.bias.data[:] = 0.0

    @property
    def output_layer(self):
        return self.out_proj

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None,
                is_causal: bool = False, rng=None, *, past_kv=None, static_kv=None):
        """torch's forward (need_weights=False). `past_kv` and `static_kv` are the KV caches of
        HeadAttention (with static_kv, key and value are None; backward then returns
        (dquery, None, None))."""
        if not self.batch_first:                    # (T, B, E) in: seen as (B, T, E)
            for name, x in (("query", query), ("key", key), ("value", value)):
                if x is not None:
                    validate.float_array(name, x, ndim=3, shape="(T, B, E), batch_first=False")
            query, key, value = (None if x is None else np.ascontiguousarray(x.swapaxes(0, 1))
                                 for x in (query, key, value))
        validate.float_array("query", query, ndim=3, shape="(B, Tq, C)")
        batch = query.shape[0]
        if isinstance(attn_mask, np.ndarray) and attn_mask.ndim == 3:
            if attn_mask.shape[0] != batch * self.num_heads:
                raise ValueError(f"a 3-D attn_mask must have shape (B * num_heads, Tq, Tk) = "
                                 f"({batch * self.num_heads}, ...); got {attn_mask.shape}")
            attn_mask = attn_mask.reshape(batch, self.num_heads, *attn_mask.shape[1:])
        out, cache = super().forward(query, key, value, attn_mask=attn_mask,
                                     key_padding_mask=key_padding_mask, is_causal=is_causal,
                                     past_kv=past_kv, static_kv=static_kv, rng=rng)
        return (out if self.batch_first else out.swapaxes(0, 1)), cache   # (T, B, E) out

    def backward(self, dout, cache: AttentionLayerCache):
        """HeadAttention's backward; with batch_first=False, dout and the gradients are
        (T, B, E), swapped at the entry and the exit as forward swaps its arrays."""
        if self.batch_first:
            return super().backward(dout, cache)
        self._check_cache(cache)
        (batch, length, width), dtype = cache.output_spec                # dout is (T, B, E)
        validate.gradient("dout", dout, (length, batch, width), dtype,
                          "TorchMultiheadAttention (batch_first=False)")
        grads = self._heads_backward(np.ascontiguousarray(dout.swapaxes(0, 1)), cache)
        return tuple(None if g is None else g.swapaxes(0, 1) for g in grads)

    def _slices(self):
        e = self.embed_dim
        return slice(0, e), slice(e, 2 * e), slice(2 * e, 3 * e)

    def _project(self, query, key, value):
        weight = self.in_proj_weight.data
        bias = None if self.in_proj_bias is None else self.in_proj_bias.data
        outputs, caches = [], []
        for x, part in zip((query, key, value), self._slices()):
            if x is None:
                outputs.append(None)
                caches.append(None)
                continue
            y, c = linear_forward(x, weight[part], None if bias is None else bias[part])
            outputs.append(y)
            caches.append(c)
        return (*outputs, ProjectionCaches(*caches))

    def _project_backward(self, dq, dk, dv, caches, inputs):
        grads = []
        for d, part, c in zip((dq, dk, dv), self._slices(), caches):
            if d is None:
                grads.append(None)
                continue
            dx, dweight, dbias = linear_backward(merge_heads(d), c)
            self.in_proj_weight.grad[part] += dweight
            if self.in_proj_bias is not None:
                self.in_proj_bias.grad[part] += dbias
            grads.append(dx)
        return tuple(grads)
