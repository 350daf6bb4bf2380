"""Embedding's backward added straight into the weight's gradient: the sum of
layers.embedding.embedding_backward (the reference), accumulated in place.

Faster because the looked-up rows' gradients are added into the (V, D) gradient array the
Parameter already holds, instead of into a (V, D) table of zeros built per call (V is the
vocabulary) that is then added; the padding row's positions are left out instead of zeroed
afterwards. Into a zero gradient the result is the reference's bit for bit; into one that
already holds a sum (a tied weight, a second call), each row's additions are grouped
differently, (g + a) + b instead of g + (a + b), and may differ in the last bit.

The adds are np.add.at's, g[ids[n]] += dout[n] for n in order, made in occurrence levels: level
k adds, for every id seen more than k times, the gradient of its (k + 1)-th position. An id
appears at most once in a level, so a level is one gather, add and scatter of whole rows, and
each row of g receives its positions' gradients in their order, the same additions in the
same order as np.add.at: the same bits. np.add.at walks the positions one at a time; the
levels are as many as the most frequent id's count (10 for the benchmarks' small GPT's batch,
1,024 ids over a vocabulary of 256: 0.19-0.24 ms against np.add.at's 1.35, float32, D = 128;
D = 768: 0.56 against 8.3). A gradient of fewer than LEVELS_MIN_SIZE elements (N x D), where
the levels' own calls cost what np.add.at's walk does (1,024 ids of D = 16: 0.24 ms against
0.15), or whose most frequent id fills more than an eighth of the positions, runs np.add.at.
"""
from __future__ import annotations

import numpy as np

LEVELS_MIN_SIZE = 32768     # elements of dout (N x D) below which np.add.at runs


def embedding_backward_into(grad: np.ndarray, dout: np.ndarray, ids: np.ndarray,
                            padding_idx: int | None) -> None:
    """grad[ids[n]] += dout[n] for every position n whose id is not padding_idx, in order of
    n."""
    ids = ids.reshape(-1)
    rows = dout.reshape(-1, dout.shape[-1])                         # (N, D)
    if padding_idx is not None:
        kept = ids != padding_idx
        ids, rows = ids[kept], rows[kept]
    levels = _occurrence_levels(ids) if rows.size >= LEVELS_MIN_SIZE else None
    if levels is None:
        np.add.at(grad, ids, rows)
        return
    for positions in levels:                                        # distinct ids in each
        grad[ids[positions]] += rows[positions]


def _occurrence_levels(ids: np.ndarray) -> list[np.ndarray] | None:
    """[positions of the first occurrence of each id, of the second of each id seen twice,
    ...] for ids (N,); None when the most frequent id takes more than N / 8 positions (as
    many levels as that: np.add.at is then the cheaper)."""
    count = ids.size
    order = np.argsort(ids, kind="stable")           # positions grouped by id, each in order
    grouped = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
    run_lengths = np.diff(starts, append=count)
    if run_lengths.max() > count // 8:
        return None
    occurrence = np.arange(count) - np.repeat(starts, run_lengths)  # 0 for an id's first, ...
    by_level = order[np.argsort(occurrence, kind="stable")]
    ends = np.cumsum(np.bincount(occurrence))
    return np.split(by_level, ends[:-1])
