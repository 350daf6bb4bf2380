"""Scaled dot-product attention with every mask, and grouped-query heads.

Shapes: B batch, H query heads, G key/value heads (G divides H, r = H / G), Tq queries,
Tk keys, d the query/key width of a head, dv the value width of a head.

    q (B, H, Tq, d), k (B, G, Tk, d), v (B, G, Tk, dv) -> out (B, H, Tq, dv)

    S = q k^T / sqrt(d) + M        scores (B, H, Tq, Tk); M the float mask (0 where none)
                                   (with a soft cap c: S = c tanh(q k^T / (sqrt(d) c)) + M)
    S_ij = -inf where blocked      bool masks, key padding, causal, sliding window
    P = softmax(S) over keys       the attention probabilities, kept in the cache
    out = P v

Masks (SPEC §4): a boolean mask is True where attention is BLOCKED (torch.nn.MultiheadAttention
meaning; torch.nn.functional.scaled_dot_product_attention uses the opposite); a float mask is
added to the scores; `key_padding_mask` (B, Tk) is True at padding; `is_causal` lets query i
see keys j <= i + causal_offset (the offset counts the positions a KV cache already holds);
a sliding `window` W lets query i see only keys j > i + causal_offset - W, the W most recent
positions up to its own (Mistral's and Gemma2's window, HF's `kv_idx > q_idx - sliding_window`).
Masks broadcast as torch does: (Tq, Tk), (B or 1, H or 1, Tq, Tk); and a 3-D mask is
(B, Tq, Tk), one per sample, the same for every head (as encoder-decoder codebases build them;
torch's SDPA would broadcast it as (1, B, Tq, Tk), and nn.MultiheadAttention reads a 3-D mask
as (B * H, Tq, Tk), which TorchMultiheadAttention keeps). A query row whose keys are all blocked
gives a zero output and zero gradients, never NaN (the rule of torch's SDPA path).

Grouped-query attention: key/value head j serves query heads j r .. j r + r - 1 (HF Llama's
repeat_kv order). Writing the H query heads as G groups of r heads stacked along the query axis,
q (B, H, Tq, d) -> (B, G, r Tq, d), every group is ordinary attention against its own k and v,
and the backward's products sum the r heads' contributions to dk and dv by themselves.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.paths import kernels_enabled
from ..kernels.attention import attention_backward_into, attention_rows, one_chunk
from .dropout import check_probability, dropout_mask
from .softcap import softcap_backward, softcap_forward, SoftCapCache


class AttentionCache(NamedTuple):
    q: np.ndarray               # (B, H, Tq, d)
    k: np.ndarray               # (B, G, Tk, d)
    v: np.ndarray               # (B, G, Tk, dv)
    probs: np.ndarray           # (B, H, Tq, Tk) P, the attention probabilities (for study too)
    dropout: np.ndarray | None  # (B, H, Tq, Tk) dropout mask (0 or 1/(1-p)) applied to P
    scale: float                # 1 / sqrt(d) unless given
    capped: np.ndarray | None = None    # (B, H, Tq, Tk) tanh(s q k^T / c) with a soft cap c

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return (*self.probs.shape[:3], self.v.shape[3]), self.q.dtype


class AttentionKernelCache(AttentionCache):
    """An AttentionCache whose backward is the kernel's (numpy_tf.kernels.attention): the same
    fields; a layer class makes it when its forward runs outside reference_path()."""
    __slots__ = ()


def causal_mask(query_length: int, key_length: int, offset: int = 0) -> np.ndarray:
    """(Tq, Tk) bool, True where key j is in the future of query i: j > i + offset."""
    return np.triu(np.ones((query_length, key_length), dtype=bool), k=offset + 1)


def sliding_window_mask(query_length: int, key_length: int, window: int,
                        offset: int = 0) -> np.ndarray:
    """(Tq, Tk) bool, True where key j is W = window or more positions behind query i:
    j <= i + offset - W. With the causal mask, query i sees keys i + offset - W < j <= i +
    offset, the W most recent positions including its own (HF's sliding window)."""
    return np.tril(np.ones((query_length, key_length), dtype=bool), k=offset - window)


@functools.lru_cache(maxsize=64)
def _shared_causal_mask(query_length: int, key_length: int, offset: int) -> np.ndarray:
    """causal_mask, built once per shape and kept read-only (every layer of every step asks
    for the same one)."""
    mask = causal_mask(query_length, key_length, offset)
    mask.flags.writeable = False
    return mask


@functools.lru_cache(maxsize=64)
def _shared_window_mask(query_length: int, key_length: int, window: int,
                        offset: int) -> np.ndarray:
    """sliding_window_mask, built once per shape and kept read-only."""
    mask = sliding_window_mask(query_length, key_length, window, offset)
    mask.flags.writeable = False
    return mask


def check_window(name: str, window) -> int | None:
    """A sliding window is None (every earlier key) or a positive int (the keys a query sees,
    its own included)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window <= 0:
        raise ValueError(f"{name} must be None or a positive int (the number of most recent "
                         f"positions a query sees, its own included); got {window!r}")
    return int(window)


def _check_mask(name: str, mask, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """mask is (Tq, Tk), (B, Tq, Tk) (one per sample, the same for every head) or 4-D, each axis
    1 or the full size; returned broadcastable to (B, H, Tq, Tk): a 3-D mask as (B, 1, Tq, Tk)
    (its first axis is the batch, not, as NumPy's broadcasting would read it, the heads)."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(mask).__name__}")
    validate.plain_arithmetic(name, mask)
    if mask.dtype != bool and mask.dtype != dtype:
        raise TypeError(f"{name} must be bool (True = blocked) or a float mask of the query "
                        f"dtype {dtype}; got dtype {mask.dtype}")
    full = {2: shape[2:], 3: (shape[0], *shape[2:]), 4: shape}.get(mask.ndim)
    if full is None or any(m not in (1, f) for m, f in zip(mask.shape, full)):
        raise ValueError(f"{name} must broadcast to (B, H, Tq, Tk) = {shape} from (Tq, Tk), "
                         "(B, Tq, Tk) (one mask per sample, for every head) or a 4-D shape of "
                         f"sizes or 1s; got {mask.shape}")
    return mask[:, None] if mask.ndim == 3 else mask                   # (B, 1, Tq, Tk)


def attention_masks(shape: tuple, dtype: np.dtype, attn_mask=None, key_padding_mask=None,
                    is_causal: bool = False, causal_offset: int = 0, window: int | None = None):
    """Combine every mask into (blocked, bias): `blocked` a bool array broadcastable to
    (B, H, Tq, Tk) (None if nothing is blocked) and `bias` a float one (None if no float mask).
    `window` W blocks the keys j <= i + causal_offset - W (sliding_window_mask)."""
    batch, heads, tq, tk = shape
    window = check_window("window", window)
    blocked, bias = [], []
    if attn_mask is not None:
        attn_mask = _check_mask("attn_mask", attn_mask, shape, dtype)
        (blocked if attn_mask.dtype == bool else bias).append(attn_mask)
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, np.ndarray):
            raise TypeError("key_padding_mask must be a numpy array; got "
                            f"{type(key_padding_mask).__name__}")
        validate.plain_arithmetic("key_padding_mask", key_padding_mask)
        if key_padding_mask.shape != (batch, tk):
            raise ValueError(f"key_padding_mask must have shape (B, Tk) = ({batch}, {tk}); got "
                             f"{key_padding_mask.shape}")
        if key_padding_mask.dtype != bool and key_padding_mask.dtype != dtype:
            raise TypeError("key_padding_mask must be bool (True = padding) or a float mask of "
                            f"the query dtype {dtype}; got dtype {key_padding_mask.dtype}")
        padding = key_padding_mask[:, None, None, :]                     # (B, 1, 1, Tk)
        (blocked if padding.dtype == bool else bias).append(padding)
    causal_offset = validate.integer("causal_offset", causal_offset)
    if causal_offset < 0:
        raise ValueError(f"causal_offset must be >= 0; got {causal_offset}")
    if is_causal:
        blocked.append(_shared_causal_mask(tq, tk, causal_offset))
    if window is not None:
        if causal_offset < 0:
            raise ValueError(f"causal_offset must be >= 0; got {causal_offset}")
        blocked.append(_shared_window_mask(tq, tk, window, causal_offset))
    combined_blocked = None
    for mask in blocked:
        combined_blocked = mask if combined_blocked is None else combined_blocked | mask
    combined_bias = None
    for mask in bias:
        combined_bias = mask if combined_bias is None else combined_bias + mask
    return combined_blocked, combined_bias


def masked_softmax(scores: np.ndarray) -> np.ndarray:
    """softmax over the last axis of scores holding -inf where blocked, in place; a row with
    every entry -inf becomes all zeros (its max is -inf: shift by 0 instead, every exp is 0,
    and the zero sum is divided by 1). With no keys at all (Tk = 0) there is nothing to do."""
    if scores.shape[-1] == 0:
        return scores
    row_max = np.maximum.reduce(scores, axis=-1, keepdims=True)
    finite = np.isfinite(row_max)
    if not finite.all():                        # only fully blocked rows (or NaN input)
        row_max[~finite] = 0.0
    scores -= row_max
    np.exp(scores, out=scores)
    total = np.add.reduce(scores, axis=-1, keepdims=True)
    if not total.all():
        total[total == 0.0] = 1.0
    scores /= total
    return scores


def _grouped(x: np.ndarray, groups: int) -> np.ndarray:
    """(B, H, T, w) -> (B, G, r T, w): the r heads of each group stacked along the T axis.
    With one head per group (r = 1) that is x itself, strided or not: matmul reads the heads
    of a fused projection in place, so nothing is copied."""
    batch, heads, length, width = x.shape
    if heads == groups:
        return x
    return np.ascontiguousarray(x).reshape(batch, groups, (heads // groups) * length, width)


def check_qkv(q, k, v) -> None:
    """q (B, H, Tq, d), k (B, G, Tk, d), v (B, G, Tk, dv): float arrays of one dtype, one batch
    size, keys and values of one length, G dividing H (every attention function's inputs)."""
    if _plain_qkv(q, k, v):
        return                          # the usual inputs, accepted in one test
    validate.float_array("q", q, ndim=4, shape="(B, H, Tq, d)")
    validate.float_array("k", k, ndim=4, shape="(B, G, Tk, d)")
    validate.float_array("v", v, ndim=4, shape="(B, G, Tk, dv)")
    validate.same_dtype(q=q, k=k, v=v)
    batch, heads, _, width = q.shape
    groups, tk = k.shape[1], k.shape[2]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must share the batch size; got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if k.shape[3] != width:
        raise ValueError(f"k must have the query head width d = {width}; got shape {k.shape}")
    if v.shape[1:3] != (groups, tk):
        raise ValueError(f"v must have the heads and length of k ({groups}, {tk}) (key and "
                         f"value lengths must agree); got shape {v.shape}")
    if heads % groups:
        raise ValueError(f"the key/value heads ({groups}) must divide the query heads "
                         f"({heads})")



def _plain_qkv(q, k, v) -> bool:
    """check_qkv's requirements of the usual inputs in one expression (ndarrays themselves, so
    nothing unusual slips through); False sends them through the full checks, which say what
    is wrong. The checks cost more than a decoded token's attention itself."""
    return (type(q) is np.ndarray and type(k) is np.ndarray and type(v) is np.ndarray
            and q.dtype in validate.FLOAT_DTYPES and q.dtype == k.dtype == v.dtype
            and q.ndim == k.ndim == v.ndim == 4
            and q.shape[0] == k.shape[0] == v.shape[0] and k.shape[3] == q.shape[3]
            and v.shape[1:3] == k.shape[1:3] and k.shape[1] > 0
            and q.shape[1] % k.shape[1] == 0)


def attention_scale(scale, q: np.ndarray) -> float:
    """The scale s of the scores: 1 / sqrt(d) for None, else a finite real number (any sign and
    0 are allowed, as torch's scaled_dot_product_attention allows them; NaN and infinities are
    refused), as a Python float so that float32 stays float32."""
    if scale is None:
        return 1.0 / math.sqrt(q.shape[3])
    return validate.finite_number("scale", scale)


def _check_attention_inputs(q, k, v, dropout_p, rng) -> float:
    """check_qkv, and a Generator when something is dropped. Returns dropout_p as a float."""
    check_qkv(q, k, v)
    dropout_p = check_probability(dropout_p)
    if dropout_p > 0.0 and not isinstance(rng, np.random.Generator):
        raise TypeError("attention dropout needs rng=numpy.random.Generator; got "
                        f"{type(rng).__name__}")
    return dropout_p


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, attn_mask=None,
                      key_padding_mask=None, is_causal: bool = False, causal_offset: int = 0,
                      dropout_p: float = 0.0, rng: np.random.Generator | None = None,
                      scale: float | None = None, window: int | None = None,
                      softcap: float | None = None):
    """Scaled dot-product attention; returns (out (B, H, Tq, dv), AttentionCache). `window`
    W: query i sees only keys j > i + causal_offset - W; `softcap` c: the scaled scores
    become c tanh(s q k^T / c) before the masks (Gemma2's attn_logit_softcapping). No queries
    (Tq = 0) give an empty output; no keys (Tk = 0) a zero one, as for a fully masked row."""
    dropout_p = _check_attention_inputs(q, k, v, dropout_p, rng)
    softcap = None if softcap is None else validate.positive_float("softcap", softcap)
    batch, heads, tq, width = q.shape
    groups, tk = k.shape[1], k.shape[2]
    scale = attention_scale(scale, q)
    blocked, bias = attention_masks((batch, heads, tq, tk), q.dtype, attn_mask,
                                    key_padding_mask, is_causal, causal_offset, window)
    scores = _grouped(q * scale, groups) @ k.swapaxes(-1, -2)           # (B, G, r Tq, Tk)
    scores = scores.reshape(batch, heads, tq, tk)                       # S (B, H, Tq, Tk)
    capped = None
    if softcap is not None:
        scores, (capped,) = softcap_forward(scores, softcap)            # c tanh(S / c)
    if bias is not None:
        scores += bias
    if blocked is not None:
        np.copyto(scores, -np.inf, where=blocked)                       # S_ij = -inf
    probs = masked_softmax(scores)                                      # P, in scores' array
    dropout = None if dropout_p == 0.0 else dropout_mask(probs.shape, dropout_p, rng,
                                                          probs.dtype)
    weights = probs if dropout is None else probs * dropout             # W
    out = _grouped(weights, groups) @ v                                 # (B, G, r Tq, dv)
    out = out.reshape(batch, heads, tq, v.shape[3])                     # (B, H, Tq, dv)
    return out, AttentionCache(q, k, v, probs, dropout, scale, capped)


def kernel_attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, attn_mask=None,
                             key_padding_mask=None, is_causal: bool = False,
                             causal_offset: int = 0, dropout_p: float = 0.0,
                             rng: np.random.Generator | None = None,
                             scale: float | None = None, window: int | None = None,
                             softcap: float | None = None):
    """attention_forward's values and cache, computed by the kernel tier, the cache an
    AttentionKernelCache (whose backward is the kernel's): the same checks and masks, then
    kernels.attention.attention_rows, the reference's arithmetic in cache-sized chunks of the
    batch. With dropout or a soft cap, or when the batch is one chunk (a decoded token, a
    small batch: the same operations without the chunking's calls; a decoded token of a
    4-head model took 176k instructions here instead of 183k), the reference computes the
    forward."""
    if softcap is not None or check_probability(dropout_p) > 0.0 or \
            (_plain_qkv(q, k, v) and one_chunk(q, k.shape[2])):
        out, cache = attention_forward(q, k, v, attn_mask, key_padding_mask, is_causal,
                                       causal_offset, dropout_p, rng, scale, window, softcap)
        return out, AttentionKernelCache(*cache)
    check_qkv(q, k, v)                  # nothing is dropped: rng needs no check
    scale = attention_scale(scale, q)
    blocked, bias = attention_masks((*q.shape[:3], k.shape[2]), q.dtype, attn_mask,
                                    key_padding_mask, is_causal, causal_offset, window)
    out, probs = attention_rows(q, k, v, blocked, bias, scale, masked_softmax)
    return out, AttentionKernelCache(q, k, v, probs, None, scale, None)


def attention_backward(dout: np.ndarray, cache: AttentionCache):
    """Gradients of out = W v, W = P (or P * m with the dropout mask m), P = softmax(S),
    S = s q k^T + M (s the scale), per group; * is elementwise. The code's names: weights W,
    probs P, dweights dW, dprobs dP, dscores dS.

    1. out = W v:
           dW = dout v^T                              (B, H, Tq, Tk)
           dv = W^T dout                              summed over the r heads of a group
       then dP = dW * m (or dW without dropout).
    2. Row-wise softmax, P_ij = exp(S_ij) / sum_l exp(S_il), has dP_ij/dS_ik = P_ij([j=k] - P_ik):
           dS_ik = sum_j dP_ij P_ij ([j = k] - P_ik) = P_ik (dP_ik - sum_j dP_ij P_ij),
       that is dS = P * (dP - rowsum(dP * P)). Blocked entries have P = 0, so their dS is 0;
       a fully blocked row has P = 0 throughout and its gradients are all 0 (no NaN:
       S = -inf never enters the arithmetic).
    3. With a soft cap c, S = c tanh(R / c) + M of the raw scores R = s q k^T
       (layers/softcap.py): dR = dS (1 - t^2), t = tanh(R / c) cached as `capped`; the cap
       cancels. A blocked entry has dS = 0, so dR = 0 there too. Without a cap R = S - M and
       dR = dS. Below, dS stands for dR.
    4. S = s q k^T:
           dq = s dS k                                (B, H, Tq, d)
           dk = s dS^T q                              summed over the r heads of a group
       The scale s multiplies the small products (Tq or Tk by d), not dS (Tq by Tk); the
       forward likewise scales q before q k^T.
    Cached: q, k, v and P (the probabilities are also what a student looks at), the dropout
    mask and t with a soft cap; nothing else is needed (a sliding window only blocks entries,
    so its P = 0 there says all). Returns (dq, dk, dv).
    """
    validate.backward_inputs(dout, cache, AttentionCache)
    q, k, v, probs, dropout, scale, capped = cache
    groups = k.shape[1]
    weights = probs if dropout is None else probs * dropout             # W (B, H, Tq, Tk)
    dout_grouped = _grouped(dout, groups)                               # (B, G, r Tq, dv)
    dv = _grouped(weights, groups).swapaxes(-1, -2) @ dout_grouped      # (B, G, Tk, dv)
    dweights = (dout_grouped @ v.swapaxes(-1, -2)).reshape(probs.shape)     # dW
    dprobs = dweights if dropout is None else dweights * dropout            # dP
    dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))   # dS
    if capped is not None:
        dscores = softcap_backward(dscores, SoftCapCache(capped))       # dR = dS (1 - t^2)
    dscores_grouped = _grouped(dscores, groups)                         # (B, G, r Tq, Tk)
    dq = (dscores_grouped @ k).reshape(q.shape) * scale                 # (B, H, Tq, d)
    dk = (dscores_grouped.swapaxes(-1, -2) @ _grouped(q, groups)) * scale   # (B, G, Tk, d)
    return dq, dk, dv


class ScaledDotProductAttention(Module):
    """attention_forward / attention_backward as a Module (no parameters):
    forward(q, k, v, attn_mask=None, key_padding_mask=None) -> (out, cache). Its backward runs
    kernels.attention unless the forward ran inside numpy_tf.reference_path()."""

    def __init__(self, is_causal: bool = False, dropout: float = 0.0, dtype=np.float64):
        super().__init__(dtype)
        self.is_causal, self.dropout = is_causal, check_probability(dropout)

    def forward(self, q, k, v, attn_mask=None, key_padding_mask=None, causal_offset: int = 0,
                rng: np.random.Generator | None = None):
        forward = kernel_attention_forward if kernels_enabled() else attention_forward
        return forward(q, k, v, attn_mask, key_padding_mask, self.is_causal, causal_offset,
                       self.dropout if self.training else 0.0, rng)

    def backward(self, dout, cache):
        if type(cache) is AttentionKernelCache:
            validate.backward_inputs(dout, cache, AttentionCache)
            return attention_backward_into(dout, *cache)
        return attention_backward(dout, cache)
