"""Attention's backward in place and into given arrays, and the fused qkv gradient: the values of
layers.attention.attention_backward (the reference, whose docstring is the derivation) and of
the reference backward of layers.multihead.FusedAttention.

Faster because
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

import numpy as np


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
    are written there and returned."""
    if out is not None:
        _check_out(out, q, k, v)
    out_q, out_k, out_v = out if out is not None else (None, None, None)
    batch, heads, tq, width = q.shape
    groups, tk = k.shape[1], k.shape[2]
    weights = probs if dropout is None else probs * dropout            # W (B, H, Tq, Tk)
    dout_grouped = _grouped(dout, groups)                               # (B, G, r Tq, dv)
    dv = np.matmul(_grouped(weights, groups).swapaxes(-1, -2), dout_grouped,
                   out=out_v)                                           # (B, G, Tk, dv)
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
        dq = np.matmul(dscores, k, out=out_q)                           # (B, H, Tq, d)
    else:
        dq = (dscores_grouped @ k).reshape(batch, heads, tq, width)
        if out_q is not None:
            out_q[...] = dq
            dq = out_q
    dq *= scale
    dk = np.matmul(dscores_grouped.swapaxes(-1, -2), _grouped(q, groups),
                   out=out_k)                                           # (B, G, Tk, d)
    dk *= scale
    return dq, dk, dv


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
    attention_backward_into(dheads, q, k, v, probs, dropout, scale, capped, out=thirds)
    return dqkv
