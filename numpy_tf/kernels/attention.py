"""Attention's forward in chunks of the batch, its backward in place and into given arrays, and the
fused qkv gradient: the values of layers.attention.attention_forward and attention_backward (the
references, whose docstrings are the derivation) and of the reference backward of
layers.multihead.FusedAttention.

Faster because
- the batch is cut into chunks whose (Tq, Tk) scores fit in the cache, so that the passes of
  the masked softmax (and of the backward's dS) read what the product has just written
  instead of main memory. Every entry is computed by the reference's operations in the
  reference's order (the softmax's max, shift, exp, sum and division run along each row,
  which no chunk divides, and each sample's products are the same products), so the forward
  is the reference's bit for bit;
- the products write straight into arrays the caller gives (`out`), which may be strided views:
  FusedAttention passes the thirds of its qkv output's gradient (B, T, 3C), seen as heads
  (B, H, T, d), so dq, dk and dv are never arrays of their own and nothing is copied (each
  head's (T, d) block is a strided matrix BLAS writes in place);
- dS is built inside dP's own array, and the row sums sum_j dP_ij P_ij are one pass of einsum
  (no (Tq, Tk) temporary for the product).
einsum adds a row in another order than NumPy's pairwise sum, so dq and dk may differ from the
reference's in their last bits (the measured bound is stated in tests/test_kernels.py); dv,
which needs no row sum, is the same bit for bit.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

CHUNK_BYTES = 1 << 19       # the scores of one chunk of the batch: half a megabyte


def _chunks(q: np.ndarray, tk: int):
    """range(B) of q (B, H, Tq, d) cut into consecutive slices of samples whose scores
    (H, Tq, Tk) take at most CHUNK_BYTES together (at least one sample each)."""
    batch, heads, tq, _ = q.shape
    per_chunk = max(1, CHUNK_BYTES // max(1, heads * tq * tk * q.dtype.itemsize))
    return [slice(start, min(start + per_chunk, batch)) for start in range(0, batch, per_chunk)]


def one_chunk(q: np.ndarray, tk: int) -> bool:
    """Whether the whole batch of q (B, H, Tq, d) against Tk keys is a single chunk (a decoded
    token, a small batch): attention_rows would then do the reference's operations on whole
    arrays, with the chunking's calls on top, so the classes run the reference instead."""
    batch, heads, tq, _ = q.shape
    return batch == 1 or batch * heads * tq * tk * q.dtype.itemsize <= CHUNK_BYTES


def _batch_part(mask: np.ndarray | None, span: slice) -> np.ndarray | None:
    """The rows of a mask broadcastable to (B, H, Tq, Tk) for the samples in span: a 4-D
    mask with a batch axis is sliced, any other is the same for every sample."""
    if mask is None or mask.ndim < 4 or mask.shape[0] == 1:
        return mask
    return mask[span]


def attention_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, blocked: np.ndarray | None,
                   bias: np.ndarray | None, scale: float,
                   softmax: Callable[[np.ndarray], np.ndarray]):
    """(out, probs) of out = P v, P = softmax(s q k^T + bias, -inf where blocked), for checked
    q (B, H, Tq, d), k (B, G, Tk, d), v (B, G, Tk, dv) and the masks as
    layers.attention.attention_masks combines them (no dropout, no soft cap). `softmax` is
    the reference's masked softmax (layers.attention.masked_softmax, in place over the last
    axis), applied chunk by chunk."""
    batch, heads, tq, _ = q.shape
    groups, tk, width_v = k.shape[1], k.shape[2], v.shape[3]
    probs = np.empty((batch, heads, tq, tk), q.dtype)                   # P (B, H, Tq, Tk)
    out = np.empty((batch, heads, tq, width_v), q.dtype)                # (B, H, Tq, dv)
    stacked = (heads // groups) * tq                                    # r Tq
    for span in _chunks(q, tk):
        samples = span.stop - span.start
        scores = probs[span]                                            # S, in P's array
        np.matmul(_grouped(q[span] * scale, groups), k[span].swapaxes(-1, -2),
                  out=scores.reshape(samples, groups, stacked, tk))
        part_bias, part_blocked = _batch_part(bias, span), _batch_part(blocked, span)
        if part_bias is not None:
            scores += part_bias
        if part_blocked is not None:
            np.copyto(scores, -np.inf, where=part_blocked)
        softmax(scores)
        np.matmul(_grouped(scores, groups), v[span],
                  out=out[span].reshape(samples, groups, stacked, width_v))
    return out, probs


def _grouped(x: np.ndarray, groups: int) -> np.ndarray:
    """(B, H, T, w) -> (B, G, r T, w), the r heads of each group stacked along T (x itself,
    strided or not, when r = 1)."""
    batch, heads, length, width = x.shape
    if heads == groups:
        return x
    return np.ascontiguousarray(x).reshape(batch, groups, (heads // groups) * length, width)


def _check_out(out, q, k, v) -> None:
    wanted = (q, k, v)
    if len(out) != 3 or any(not isinstance(o, np.ndarray) or o.shape != w.shape or
                            o.dtype != w.dtype for o, w in zip(out, wanted)):
        raise ValueError("out must be three arrays shaped and typed like q, k and v "
                         f"({', '.join(f'{w.shape} {w.dtype}' for w in wanted)}); got "
                         + ", ".join(f"{getattr(o, 'shape', o)} {getattr(o, 'dtype', '')}"
                                     for o in out))


def attention_backward_into(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                            probs: np.ndarray, dropout: np.ndarray | None, scale: float,
                            capped: np.ndarray | None = None, out=None):
    """(dq, dk, dv) of out = W v, W = P (or P m), P = softmax(s q k^T + M) (or, with a soft
    cap c, softmax(c t + M), t = tanh(s q k^T / c) given as `capped`), from the fields of an
    AttentionCache; with `out`, three arrays shaped and typed like q, k and v, the gradients
    are written there and returned. The batch is cut into chunks as attention_rows cuts it; no
    entry's sums cross samples."""
    if out is not None:
        _check_out(out, q, k, v)
    else:
        out = (np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype),
               np.empty(v.shape, v.dtype))
    _backward_into(dout, q, k, v, probs, dropout, scale, capped, *out)
    return out


def _backward_into(dout, q, k, v, probs, dropout, scale, capped, out_q, out_k, out_v) -> None:
    """attention_backward_into once `out` is checked: chunk by chunk (the whole batch at once
    when it is one chunk)."""
    chunks = _chunks(q, k.shape[2])
    if len(chunks) == 1:
        _backward_chunk(dout, q, k, v, probs, dropout, scale, capped, out_q, out_k, out_v)
        return
    for span in chunks:
        _backward_chunk(dout[span], q[span], k[span], v[span], probs[span],
                        None if dropout is None else dropout[span], scale,
                        None if capped is None else capped[span], out_q[span], out_k[span],
                        out_v[span])


def _backward_chunk(dout, q, k, v, probs, dropout, scale, capped, out_q, out_k, out_v) -> None:
    """attention_backward_into for some samples, written into out_q, out_k and out_v."""
    batch, heads, tq, width = q.shape
    groups, tk = k.shape[1], k.shape[2]
    weights = probs if dropout is None else probs * dropout            # W (B, H, Tq, Tk)
    dout_grouped = _grouped(dout, groups)                               # (B, G, r Tq, dv)
    np.matmul(_grouped(weights, groups).swapaxes(-1, -2), dout_grouped,
              out=out_v)                                                # dv (B, G, Tk, dv)
    dprobs = (dout_grouped @ v.swapaxes(-1, -2)).reshape(batch, heads, tq, tk)  # dW
    if dropout is not None:
        dprobs *= dropout                                               # dP
    dscores = dprobs                                                    # dS, in dP's array
    dscores -= np.einsum("bhij,bhij->bhi", dprobs, probs)[..., None]   # sum_j dP_ij P_ij
    dscores *= probs
    if capped is not None:
        dscores *= 1.0 - capped * capped                                # dR = dS (1 - t^2)
    dscores_grouped = _grouped(dscores, groups)                         # (B, G, r Tq, Tk)
    if groups == heads:
        np.matmul(dscores, k, out=out_q)                                # dq (B, H, Tq, d)
    else:
        out_q[...] = (dscores_grouped @ k).reshape(batch, heads, tq, width)
    out_q *= scale
    np.matmul(dscores_grouped.swapaxes(-1, -2), _grouped(q, groups),
              out=out_k)                                                # dk (B, G, Tk, d)
    out_k *= scale


def qkv_gradient(dheads: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                 probs: np.ndarray, dropout: np.ndarray | None, scale: float,
                 capped: np.ndarray | None = None) -> np.ndarray:
    """The gradient (B, T, 3C) of a fused projection's output qkv = [q | k | v] (each (B, T, C)
    split into H heads (B, H, T, d), no RoPE, no KV cache), from the gradient of the attention
    output's heads dheads (B, H, T, d): attention_backward_into writes dq, dk and dv into the
    three thirds, seen as heads."""
    batch, heads, length, width = q.shape
    model_width = heads * width
    dqkv = np.empty((batch, length, 3 * model_width), dheads.dtype)
    thirds = tuple(dqkv[..., part * model_width:(part + 1) * model_width]
                   .reshape(batch, length, heads, width).transpose(0, 2, 1, 3)
                   for part in range(3))                                # (B, H, T, d) views
    _backward_into(dheads, q, k, v, probs, dropout, scale, capped, *thirds)
    return dqkv
