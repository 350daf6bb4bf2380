"""FlashAttention-2 as a reference algorithm: attention computed tile by tile with an online
softmax, so the (Tq, Tk) matrix of probabilities is never held, neither forward nor backward.
Readable NumPy, not a speed path: these are the steps a fused kernel (Triton, CUDA, Pallas)
takes, written so that each one can be compared with the kernel's.

Shapes: as numpy_tf.layers.attention (B batch, H query heads, G key/value heads, r = H / G,
Tq queries, Tk keys, d, dv), and tiles of bq = block_q queries by bk = block_k keys.

    q (B, H, Tq, d), k (B, G, Tk, d), v (B, G, Tk, dv) -> out (B, H, Tq, dv)

It computes what attention_forward computes, with the same masks (SPEC §4: bool True =
blocked, a float mask added, key_padding_mask (B, Tk) True at padding, causal with an offset,
key/value head j serving query heads j r .. j r + r - 1):

    S = scale q k^T + M,  -inf where blocked;   P = softmax(S) over keys;   out = P v

The forward, for each tile i of queries (every batch row and head at once):

    m = -inf, l = 0, acc = 0                          running row max, row sum, output
    for each tile j of keys (a tile wholly above the causal diagonal is skipped):
        S_ij = scale q_i k_j^T + M_ij                 (B, H, bq, bk)
        m_new = max(m, rowmax S_ij)
        P~_ij = exp(S_ij - m_new)
        l = exp(m - m_new) l + rowsum P~_ij
        acc = exp(m - m_new) acc + P~_ij v_j
        m = m_new
    O_i = acc / l,   L_i = m + log l                  kept for the backward: O and L only

Why the rescaling makes the tiled result exact. After the key tiles seen so far,

    m = max S,   l = sum exp(S - m),   acc = sum exp(S - m) v      (over the keys seen).

A new tile may raise the maximum to m_new. Since exp(S - m_new) = exp(S - m) exp(m - m_new),
multiplying the old l and acc by exp(m - m_new) turns their terms into exp(S - m_new): the
three statements hold again, now over one tile more. After the last tile,
acc / l = sum exp(S - m) v / sum exp(S - m) = sum softmax(S) v (the common factor exp(-m)
cancels) and m + log l = log sum exp(S) = L, the row's logsumexp. Every exponent is <= 0, so
nothing overflows. Only the order of the roundings differs from attention_forward.

A fully masked query row (every key blocked) has S = -inf throughout and m stays -inf; the
shift uses 0 in place of a -inf maximum (as masked_softmax does), so P~ = 0, l = 0, acc = 0,
and the division is by 1: the output row is 0, as attention_forward gives. Its L is +inf (what
FlashAttention-2's kernels write), so the backward's P = exp(S - L) = 0 and every gradient of
the row is 0. No NaN can arise: -inf - (-inf) never occurs.

flash_decoding is the split-KV variant for decoding: one block of queries against a long KV
cache cut into chunks, each chunk's partial output, m and l, then the exact combine.
flash_attention_statistics gives m and l after every key tile (and L), the numbers a kernel
author compares tile by tile (numpy_tf.checking.flash_case writes them into a case file).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from .attention import attention_masks, attention_scale, check_qkv


class FlashAttentionCache(NamedTuple):
    q: np.ndarray               # (B, H, Tq, d)
    k: np.ndarray               # (B, G, Tk, d)
    v: np.ndarray               # (B, G, Tk, dv)
    out: np.ndarray             # (B, H, Tq, dv) O
    logsumexp: np.ndarray       # (B, H, Tq) L = m + log l; +inf for a fully masked row
    blocked: np.ndarray | None  # bool, broadcasts to (B, H, Tq, Tk), True where blocked
    bias: np.ndarray | None     # float, broadcasts to (B, H, Tq, Tk), added to the scores
    scale: float
    is_causal: bool             # with causal_offset: which tiles the backward skips
    causal_offset: int
    block_q: int
    block_k: int

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.out.shape, self.out.dtype


def _block_size(name: str, size) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"{name} must be a positive integer (queries or keys per tile); got "
                         f"{size!r}")
    return int(size)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, G, T, w) -> (B, H, T, w): key/value head j repeated for query heads j r .. j r + r - 1
    (torch's repeat_interleave, HF Llama's repeat_kv)."""
    return np.repeat(x, heads // x.shape[1], axis=1)


def _tile_scores(q_tile, k_tile, blocked, bias, shape, rows: slice, cols: slice, scale: float):
    """S_ij = scale q_i k_j^T + M_ij, -inf where blocked: (B, H, bq, bk). The masks broadcast
    to `shape` = (B, H, Tq, Tk); the tile reads rows x cols of them."""
    scores = scale * (q_tile @ k_tile.swapaxes(-1, -2))                # (B, H, bq, bk)
    if bias is not None:
        scores += np.broadcast_to(bias, shape)[:, :, rows, cols]
    if blocked is not None:
        scores[np.broadcast_to(blocked, shape)[:, :, rows, cols]] = -np.inf
    return scores


def _above_diagonal(is_causal: bool, causal_offset: int, rows: slice, key_start: int) -> bool:
    """A tile lies wholly above the causal diagonal when its first key is later than the last
    key its last query may see: key_start > (rows.stop - 1) + causal_offset."""
    return is_causal and key_start > rows.stop - 1 + causal_offset


def flash_attention_forward(q, k, v, attn_mask=None, key_padding_mask=None,
                            is_causal: bool = False, causal_offset: int = 0,
                            scale: float | None = None, block_q: int = 64, block_k: int = 64):
    """FlashAttention-2's forward, tile by tile (see the module text); returns
    (out (B, H, Tq, dv), FlashAttentionCache). Equal to attention_forward's output."""
    check_qkv(q, k, v)
    block_q, block_k = _block_size("block_q", block_q), _block_size("block_k", block_k)
    batch, heads, tq, width = q.shape
    tk, value_width = k.shape[2], v.shape[3]
    scale = attention_scale(scale, q)
    shape = (batch, heads, tq, tk)
    blocked, bias = attention_masks(shape, q.dtype, attn_mask, key_padding_mask, is_causal,
                                    causal_offset)
    k_heads, v_heads = _heads(k, heads), _heads(v, heads)              # (B, H, Tk, d | dv)
    out = np.zeros((batch, heads, tq, value_width), dtype=q.dtype)     # O
    logsumexp = np.zeros((batch, heads, tq), dtype=q.dtype)            # L
    for query_start in range(0, tq, block_q):
        rows = slice(query_start, min(query_start + block_q, tq))
        q_tile = q[:, :, rows]                                         # (B, H, bq, d)
        row_max = np.full(q_tile.shape[:3] + (1,), -np.inf, dtype=q.dtype)   # m (B, H, bq, 1)
        row_sum = np.zeros_like(row_max)                               # l (B, H, bq, 1)
        acc = np.zeros(q_tile.shape[:3] + (value_width,), dtype=q.dtype)     # (B, H, bq, dv)
        for key_start in range(0, tk, block_k):
            if _above_diagonal(is_causal, causal_offset, rows, key_start):
                break                                   # so is every tile to its right
            cols = slice(key_start, min(key_start + block_k, tk))
            scores = _tile_scores(q_tile, k_heads[:, :, cols], blocked, bias, shape, rows,
                                  cols, scale)                         # S_ij (B, H, bq, bk)
            new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))   # m_new
            shift = np.where(np.isfinite(new_max), new_max, 0.0)       # 0 until a key is seen
            probs = np.exp(scores - shift)                             # P~_ij (B, H, bq, bk)
            rescale = np.exp(row_max - shift)                          # exp(m - m_new)
            row_sum = rescale * row_sum + probs.sum(axis=-1, keepdims=True)
            acc = rescale * acc + probs @ v_heads[:, :, cols]
            row_max = new_max
        seen = row_sum > 0.0                                           # False: fully masked
        divisor = np.where(seen, row_sum, 1.0)
        out[:, :, rows] = acc / divisor
        logsumexp[:, :, rows] = np.where(seen, row_max + np.log(divisor), np.inf)[..., 0]
    return out, FlashAttentionCache(q, k, v, out, logsumexp, blocked, bias, scale,
                                    bool(is_causal), int(causal_offset), block_q, block_k)


def flash_attention_backward(dout: np.ndarray, cache: FlashAttentionCache):
    """FlashAttention-2's backward: P recomputed tile by tile from L, never stored.

    With S = scale q k^T + M, P = softmax(S), O = P v (attention_backward's derivation):
        dV = P^T dO,   dP = dO V^T,   dS_ik = P_ik (dP_ik - sum_j P_ij dP_ij),
        dQ = scale dS K,   dK = scale dS^T Q.
    Three facts make this work on tiles:
    1. P_ij = exp(S_ij - L_i) exactly, since softmax(S)_ij = exp(S_ij) / exp(L_i) with
       L_i = log sum_j exp(S_ij): one (B, H, Tq) array recovers any tile of P from its S.
       A fully masked row has S = -inf and L = +inf: exp(-inf) = 0, so its P and its
       gradients are 0.
    2. The softmax's row sum needs the whole row of P and dP, which no tile holds. But
           sum_j P_ij dP_ij = sum_j P_ij (dO_i . v_j) = dO_i . (sum_j P_ij v_j) = dO_i . O_i,
       so D = rowsum(dO * O) (B, H, Tq), computed once before the tiles, is that row sum:
           dS_ij = P_ij * (dP_ij - D_i).
    3. Every gradient is a sum over tiles: for each key tile j and query tile i,
           dV_j += P_ij^T dO_i       dP_ij = dO_i V_j^T       dS_ij = P_ij * (dP_ij - D_i)
           dQ_i += scale dS_ij K_j   dK_j += scale dS_ij^T Q_i
       The key tiles are the outer loop (a kernel keeps dK_j and dV_j on chip while it walks
       the query tiles, and adds into dQ_i atomically). Tiles wholly above the causal
       diagonal have P = 0 and are skipped, as in the forward.
    Grouped-query heads: k and v are repeated to the H query heads (repeat_interleave), and
    the gradients of the r copies of key/value head j are summed. Returns (dq, dk, dv).
    """
    validate.backward_inputs(dout, cache, FlashAttentionCache)
    (q, k, v, out, logsumexp, blocked, bias, scale, is_causal, causal_offset, block_q,
     block_k) = cache
    batch, heads, tq, width = q.shape
    groups, tk = k.shape[1], k.shape[2]
    shape = (batch, heads, tq, tk)
    k_heads, v_heads = _heads(k, heads), _heads(v, heads)              # (B, H, Tk, d | dv)
    delta = np.sum(dout * out, axis=-1)                                # D (B, H, Tq)
    dq = np.zeros_like(q)                                              # (B, H, Tq, d)
    dk_heads = np.zeros_like(k_heads)                                  # (B, H, Tk, d)
    dv_heads = np.zeros_like(v_heads)                                  # (B, H, Tk, dv)
    for key_start in range(0, tk, block_k):
        cols = slice(key_start, min(key_start + block_k, tk))
        k_tile, v_tile = k_heads[:, :, cols], v_heads[:, :, cols]     # (B, H, bk, d | dv)
        for query_start in range(0, tq, block_q):
            rows = slice(query_start, min(query_start + block_q, tq))
            if _above_diagonal(is_causal, causal_offset, rows, key_start):
                continue
            q_tile, dout_tile = q[:, :, rows], dout[:, :, rows]       # (B, H, bq, d | dv)
            scores = _tile_scores(q_tile, k_tile, blocked, bias, shape, rows, cols, scale)
            probs = np.exp(scores - logsumexp[:, :, rows, None])       # P_ij (B, H, bq, bk)
            dv_heads[:, :, cols] += probs.swapaxes(-1, -2) @ dout_tile
            dprobs = dout_tile @ v_tile.swapaxes(-1, -2)               # dP_ij
            dscores = probs * (dprobs - delta[:, :, rows, None])       # dS_ij
            dq[:, :, rows] += scale * (dscores @ k_tile)
            dk_heads[:, :, cols] += scale * (dscores.swapaxes(-1, -2) @ q_tile)
    ratio = heads // groups
    dk = dk_heads.reshape(batch, groups, ratio, tk, width).sum(axis=2)          # (B, G, Tk, d)
    dv = dv_heads.reshape(batch, groups, ratio, tk, v.shape[3]).sum(axis=2)     # (B, G, Tk, dv)
    return dq, dk, dv


def _scale_and_masks(q, k, attn_mask, key_padding_mask, is_causal, causal_offset, scale):
    """(shape (B, H, Tq, Tk), scale, blocked, bias) as flash_attention_forward sets them."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    scale = attention_scale(scale, q)
    blocked, bias = attention_masks(shape, q.dtype, attn_mask, key_padding_mask, is_causal,
                                    causal_offset)
    return shape, scale, blocked, bias


class FlashDecoding(NamedTuple):
    out: np.ndarray             # (B, H, Tq, dv) the combined output, equal to attention's
    chunk_out: np.ndarray       # (C, B, H, Tq, dv) O_c, each chunk's normalised output
    chunk_max: np.ndarray       # (C, B, H, Tq) m_c (-inf where the chunk has no visible key)
    chunk_sum: np.ndarray       # (C, B, H, Tq) l_c = sum over the chunk of exp(S - m_c)
    logsumexp: np.ndarray       # (B, H, Tq) L (+inf for a fully masked row)


def flash_decoding(q, k, v, attn_mask=None, key_padding_mask=None, is_causal: bool = False,
                   causal_offset: int = 0, scale: float | None = None,
                   chunk_size: int = 256) -> FlashDecoding:
    """Split-KV attention for decoding (flash-decoding): one block of queries (one new token,
    Tq = 1, or a few) against a long KV cache cut into C chunks of chunk_size keys. Each chunk
    is attended on its own (on a GPU, in parallel), leaving its normalised output O_c, its row
    max m_c and row sum l_c; then the combine step

        m = max_c m_c,   w_c = l_c exp(m_c - m),   out = sum_c w_c O_c / sum_c w_c,
        L = m + log sum_c w_c.

    It is exact: w_c O_c = exp(m_c - m) sum_{j in c} exp(S_j - m_c) v_j = sum_{j in c}
    exp(S_j - m) v_j, and sum_c w_c = sum_j exp(S_j - m), so out = sum_j softmax(S)_j v_j.
    (A kernel that writes each chunk's L_c = m_c + log l_c instead uses w_c / sum_c w_c =
    exp(L_c - L), the same numbers.) A chunk in which a row sees no key has m_c = -inf and
    l_c = 0: its weight is 0. A row that sees no key anywhere gives 0, as attention does.
    Masks and arguments as flash_attention_forward."""
    check_qkv(q, k, v)
    chunk_size = _block_size("chunk_size", chunk_size)
    tq, tk, heads = q.shape[2], k.shape[2], q.shape[1]
    shape, scale, blocked, bias = _scale_and_masks(q, k, attn_mask, key_padding_mask,
                                                   is_causal, causal_offset, scale)
    k_heads, v_heads = _heads(k, heads), _heads(v, heads)              # (B, H, Tk, d | dv)
    every_query = slice(0, tq)
    chunks = -(-tk // chunk_size)                                      # C (0 when Tk = 0)
    chunk_out = np.zeros((chunks, *q.shape[:3], v.shape[3]), q.dtype)  # O_c
    chunk_max = np.zeros((chunks, *q.shape[:3]), q.dtype)              # m_c
    chunk_sum = np.zeros_like(chunk_max)                               # l_c
    for c in range(chunks):                                            # each chunk alone
        cols = slice(c * chunk_size, min((c + 1) * chunk_size, tk))
        scores = _tile_scores(q, k_heads[:, :, cols], blocked, bias, shape, every_query, cols,
                              scale)                                   # (B, H, Tq, chunk)
        chunk_max[c] = scores.max(axis=-1)                             # m_c (B, H, Tq)
        shift = np.where(np.isfinite(chunk_max[c]), chunk_max[c], 0.0)
        probs = np.exp(scores - shift[..., None])
        chunk_sum[c] = probs.sum(axis=-1)                              # l_c (B, H, Tq)
        chunk_out[c] = probs @ v_heads[:, :, cols] / np.where(chunk_sum[c] > 0.0, chunk_sum[c],
                                                              1.0)[..., None]
    row_max = np.max(chunk_max, axis=0, initial=-np.inf)               # m (B, H, Tq)
    shift = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = chunk_sum * np.exp(chunk_max - shift)                    # w_c (C, B, H, Tq)
    total = weights.sum(axis=0)                                        # (B, H, Tq)
    divisor = np.where(total > 0.0, total, 1.0)
    out = (weights[..., None] * chunk_out).sum(axis=0) / divisor[..., None]
    logsumexp = np.where(total > 0.0, shift + np.log(divisor), np.inf)
    return FlashDecoding(out, chunk_out, chunk_max, chunk_sum, logsumexp)


class FlashTileStatistics(NamedTuple):
    row_max: np.ndarray         # (B, H, Tq, n) m after key tiles 0 .. t (-inf: no key yet)
    row_sum: np.ndarray         # (B, H, Tq, n) l after key tiles 0 .. t, relative to that m
    logsumexp: np.ndarray       # (B, H, Tq) L (+inf for a fully masked row)


def flash_attention_statistics(q, k, attn_mask=None, key_padding_mask=None,
                               is_causal: bool = False, causal_offset: int = 0,
                               scale: float | None = None,
                               block_k: int = 64) -> FlashTileStatistics:
    """The running statistics of flash_attention_forward after each of its n = ceil(Tk /
    block_k) key tiles, computed in closed form from the whole score matrix (not by the loop,
    so they check it): after tile t, with K_t the keys 0 .. (t + 1) block_k - 1,

        m_t = max_{j in K_t} S_ij,    l_t = sum_{j in K_t} exp(S_ij - m_t),

    and L = m_{n-1} + log l_{n-1}. The units are those of S = scale q k^T + M, natural
    logarithms (a kernel working in base 2, with log2(e) folded into its scale, holds
    m log2(e)). They do not depend on block_q; a tile the causal forward skips leaves them
    as they were (its keys are blocked)."""
    check_qkv(q, k, k)                                  # the statistics need no values
    block_k = _block_size("block_k", block_k)
    tq, tk, heads = q.shape[2], k.shape[2], q.shape[1]
    shape, scale, blocked, bias = _scale_and_masks(q, k, attn_mask, key_padding_mask,
                                                   is_causal, causal_offset, scale)
    every = (slice(0, tq), slice(0, tk))
    scores = _tile_scores(q, _heads(k, heads), blocked, bias, shape, *every, scale)
    tiles = -(-tk // block_k)                                          # n (0 when Tk = 0)
    row_max = np.zeros((*shape[:3], tiles), q.dtype)                   # m (B, H, Tq, n)
    row_sum = np.zeros_like(row_max)                                   # l (B, H, Tq, n)
    for t in range(tiles):
        seen = scores[..., :min((t + 1) * block_k, tk)]                # keys of tiles 0 .. t
        row_max[..., t] = seen.max(axis=-1)
        shift = np.where(np.isfinite(row_max[..., t]), row_max[..., t], 0.0)
        row_sum[..., t] = np.exp(seen - shift[..., None]).sum(axis=-1)
    last_max, last_sum = (row_max[..., -1], row_sum[..., -1]) if tiles else \
        (np.zeros(shape[:3], q.dtype),) * 2                            # no key: L = +inf
    divisor = np.where(last_sum > 0.0, last_sum, 1.0)
    logsumexp = np.where(last_sum > 0.0, last_max + np.log(divisor), np.inf)
    return FlashTileStatistics(row_max, row_sum, logsumexp)
