"""Embedding's backward added straight into the weight's gradient: the sum of
layers.embedding.embedding_backward (the reference), accumulated in place.

Faster because np.add.at adds the looked-up rows' gradients into the (V, D) gradient array the
Parameter already holds, instead of building a (V, D) table of zeros per call (V is the
vocabulary) and adding that; the padding row's positions are left out instead of zeroed
afterwards. Into a zero gradient the result is the reference's bit for bit; into one that
already holds a sum (a tied weight, a second call), each row's additions are grouped
differently, (g + a) + b instead of g + (a + b), and may differ in the last bit.
"""
from __future__ import annotations

import numpy as np


def embedding_backward_into(grad: np.ndarray, dout: np.ndarray, ids: np.ndarray,
                            padding_idx: int | None) -> None:
    """grad[ids[n]] += dout[n] for every position n whose id is not padding_idx."""
    ids = ids.reshape(-1)
    rows = dout.reshape(-1, dout.shape[-1])                         # (N, D)
    if padding_idx is not None:
        kept = ids != padding_idx
        ids, rows = ids[kept], rows[kept]
    np.add.at(grad, ids, rows)
