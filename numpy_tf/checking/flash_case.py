"""A case file of FlashAttention with its per-tile statistics, for a kernel author who compares
a fused attention kernel with numpy_tf tile by tile.

    case = export_flash_attention_case(seed=0, block_q=2, block_k=3, is_causal=True)
    case.save("flash.npz")          # then: numpy-tf compare flash.npz theirs.npz

Keys (SPEC §7; every float array in the case's dtype):

    input/q (B, H, Tq, d), input/k (B, G, Tk, d), input/v (B, G, Tk, dv)
    input/key_padding_mask (B, Tk) bool, True at padding (if pad > 0)
    act/tiles.row_max (B, H, Tq, n)   m after key tiles 0 .. t (n = ceil(Tk / block_k));
                                      -inf while a row has seen no visible key
    act/tiles.row_sum (B, H, Tq, n)   l after key tiles 0 .. t, sum of exp(S - m) (0 before)
    act/logsumexp (B, H, Tq)          L = m + log l, what the forward keeps (+inf: fully masked)
    output/out (B, H, Tq, dv)
    grad_output/out                   the upstream gradient dO (drawn, N(0, 1))
    grad_act/delta (B, H, Tq)         D = rowsum(dO * O), the backward's per-row term (the
                                      row sums of dP * P); not the gradient of an act/ tensor
    grad_input/q, grad_input/k, grad_input/v

S = scale q k^T + M in natural-log units (a kernel in base 2 holds m log2(e)); the statistics do
not depend on block_q. The meta states the tiles, the masks and these conventions.
"""
from __future__ import annotations

import numpy as np

from ..core.module import float_dtype
from ..layers.flash_attention import (flash_attention_backward, flash_attention_forward,
                                      flash_attention_statistics)
from .case_file import Case


def export_flash_attention_case(*, seed: int = 0, dtype="float64", batch: int = 2,
                                heads: int = 4, kv_heads: int = 2, queries: int = 5,
                                keys: int = 7, head_dim: int = 4, value_dim: int | None = None,
                                block_q: int = 2, block_k: int = 3, is_causal: bool = True,
                                causal_offset: int | None = None, pad: int = 1,
                                scale: float | None = None) -> Case:
    """A flash_attention case drawn from numpy.random.default_rng(seed): q, k, v N(0, 1) (in
    float64, then cast), then dO; the last `pad` keys of the last sequence are padding.
    causal_offset defaults to keys - queries (the queries are the last ones of the sequence,
    as with a KV cache)."""
    from .. import __version__

    dtype = float_dtype(dtype)
    value_dim = head_dim if value_dim is None else value_dim
    if causal_offset is None:
        causal_offset = max(0, keys - queries)
    if not 0 <= pad <= keys:
        raise ValueError(f"pad must be in [0, keys = {keys}]; got {pad}")
    g = np.random.default_rng(seed)
    q = g.standard_normal((batch, heads, queries, head_dim)).astype(dtype)
    k = g.standard_normal((batch, kv_heads, keys, head_dim)).astype(dtype)
    v = g.standard_normal((batch, kv_heads, keys, value_dim)).astype(dtype)
    inputs = {"q": q, "k": k, "v": v}
    if pad:
        padding = np.zeros((batch, keys), dtype=bool)
        padding[-1, keys - pad:] = True
        inputs["key_padding_mask"] = padding
    options = dict(is_causal=is_causal, causal_offset=causal_offset, scale=scale)
    out, cache = flash_attention_forward(**inputs, **options, block_q=block_q, block_k=block_k)
    statistics = flash_attention_statistics(q, k, key_padding_mask=inputs.get(
        "key_padding_mask"), **options, block_k=block_k)
    dout = g.standard_normal(out.shape).astype(dtype)
    dq, dk, dv = flash_attention_backward(dout, cache)
    arrays = {f"input/{name}": value for name, value in inputs.items()}
    arrays.update({"act/tiles.row_max": statistics.row_max,
                   "act/tiles.row_sum": statistics.row_sum,
                   "act/logsumexp": cache.logsumexp, "output/out": out,
                   "grad_output/out": dout,
                   "grad_act/delta": np.sum(dout * out, axis=-1),
                   "grad_input/q": dq, "grad_input/k": dk, "grad_input/v": dv})
    config = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "queries": queries,
              "keys": keys, "head_dim": head_dim, "value_dim": value_dim, "block_q": block_q,
              "block_k": block_k, "is_causal": is_causal, "causal_offset": causal_offset,
              "scale": cache.scale, "pad": pad}
    meta = {"generator": "numpy_tf.checking.flash_case", "numpy_tf": __version__,
            "numpy": np.__version__, "kind": "flash_attention", "level": "layer",
            "seed": seed, "dtype": dtype.name, "config": config,
            "inputs": list(inputs), "keyword_inputs": ["key_padding_mask"] if pad else [],
            "outputs": ["out"],
            "conventions": {
                "scores": "S = scale q k^T, scale = 1/sqrt(d) unless config.scale says "
                          "otherwise; -inf where blocked (padding, causal: query i sees keys "
                          "j <= i + causal_offset)",
                "grouped_query": "key/value head j serves query heads j r .. j r + r - 1, "
                                 "r = heads / kv_heads (repeat_interleave)",
                "tiles": "act/tiles.* after key tile t = keys 0 .. (t + 1) block_k - 1; "
                         "natural-log units of S; independent of block_q",
                "fully_masked_row": "zero output and gradients, L = +inf",
                "delta": "grad_act/delta is D = rowsum(dO * O), not a gradient of an act/ "
                         "tensor"}}
    return Case(meta, arrays)
