"""Conventions of other frameworks that make their numbers differ from numpy_tf's without a
bug. `numpy-tf compare` recognises them at the first divergence and explains the difference
there, instead of naming it as the place to look. Both were measured (tests/test_jax_bridge.py
checks the numbers):

JAX_FLOAT32_SOFTMAX. jax.nn.dot_product_attention computes its softmax in float32 whatever the
dtype of its inputs (it casts the scores to float32 and the probabilities back). With float64
inputs (jax_enable_x64) its output therefore agrees with float64 attention only to float32
size: 1.5e-7 of the output's largest value (1.0e-7 in norm) over 200 drawn shapes. In the
float64 case of the tiny GPT (GPTConfig.tiny(), seed 5), a Flax mirror calling it first differs
at act/blocks.0.attention.output (by 2.0e-7) and no tensor differs by more than
1.2e-7 max(1, S); the same mirror with its softmax in the working dtype agrees to 6e-15.
Recognised when their file was written by numpy_tf.jax_bridge.run_jax from a float64 case, the
first divergence is an attention tensor (its name holds "attention" or "attn", or the case is
an attention layer), and every divergence is of float32 size (max abs error <= 1e-5
max(1, S)).

MASKED_ROW_MEAN. JAX and Flax attention fill masked scores with a large finite negative number
(Flax jnp.finfo(dtype).min, jax.nn a large float32 one), not -inf, so a query row whose keys are
all masked gets uniform weights: the mean of v (measured: Flax's dot_product_attention in
float64 to 1.1e-16, jax.nn.dot_product_attention to 8e-9). numpy_tf gives that row 0, as
torch's SDPA path does (SPEC §4). Recognised when the first divergence, a (B, T, ...) or
(B, H, T, ...) tensor, differs only in the query rows the reference case's masks (input/
attn_mask, input/key_padding_mask) block entirely.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

JAX_BRIDGE = "numpy_tf.jax_bridge.run_jax"
FLOAT32_SIZE = 1e-5         # max abs error / max(1, S) of a float32-sized difference


@dataclass(frozen=True)
class Explanation:
    convention: str             # JAX_FLOAT32_SOFTMAX or MASKED_ROW_MEAN
    text: str                   # what compare prints after the first divergence

    def to_dict(self) -> dict:
        return {"convention": self.convention, "text": self.text}


def fully_masked_queries(inputs: dict) -> np.ndarray | None:
    """(B or 1, H or 1, Tq) bool, True where a query may see no key at all under the case's
    attn_mask ((Tq, Tk) or 4-D; bool True = blocked, or float -inf) and key_padding_mask
    ((B, Tk), True at padding); None if the case has neither."""
    masks = []
    for name in ("attn_mask", "key_padding_mask"):
        mask = inputs.get(name)
        if mask is None:
            continue
        blocked = mask if mask.dtype == bool else np.isneginf(mask)
        if name == "key_padding_mask":
            blocked = blocked[:, None, None, :]                        # (B, 1, 1, Tk)
        elif blocked.ndim == 2:
            blocked = blocked[None, None]                              # (1, 1, Tq, Tk)
        masks.append(blocked)
    if not masks:
        return None
    return np.logical_or.reduce(np.broadcast_arrays(*masks)).all(axis=-1)


def _attention_tensor(key: str, kind: str) -> bool:
    name = key.split("/", 1)[-1]
    return "attention" in name or "attn" in name or "attention" in kind


def _float32_softmax(rows, reference_meta: dict, their_meta: dict, dtype: str,
                     scale_of: Callable[[str], float]) -> Explanation | None:
    first = next(row for row in rows if not row.comparison.passed).comparison
    if their_meta.get("generator") != JAX_BRIDGE or dtype != "float64" or \
            first.key.split("/")[0] not in ("act", "output") or \
            not _attention_tensor(first.key, str(reference_meta.get("kind", ""))):
        return None
    sizes = [row.comparison.max_abs_error / max(1.0, scale_of(row.comparison.key))
             for row in rows if not row.comparison.passed]
    if not all(np.isfinite(size) and size <= FLOAT32_SIZE for size in sizes):
        return None
    return Explanation("JAX_FLOAT32_SOFTMAX", (
        f"jax.nn.dot_product_attention computes its softmax in float32 even for float64 "
        f"inputs, so a float64 JAX model using it agrees with numpy_tf to float32 size only "
        f"(measured: 1.5e-7 of the attention output's largest value). Every diverging tensor "
        f"is of that size (largest max abs error / max(1, S): {max(sizes):.1e} <= "
        f"{FLOAT32_SIZE:g}), as this one cause gives. To check the rest in float64, compute "
        f"the attention's softmax in the working dtype; or compare a float32 case"))


def _masked_row_mean(rows, reference_arrays: dict, their_arrays: dict, tolerance,
                     scale_of: Callable[[str], float]) -> Explanation | None:
    first = next(row for row in rows if not row.comparison.passed).comparison
    inputs = {key.split("/", 1)[1]: value for key, value in reference_arrays.items()
              if key.startswith("input/")}
    blocked = fully_masked_queries(inputs)
    ours, theirs = reference_arrays[first.key], their_arrays[first.key]
    if blocked is None or not blocked.any() or ours.shape != theirs.shape or ours.ndim < 2:
        return None
    heads_first = ours.ndim == 4 and all(b in (1, s) for b, s in zip(blocked.shape, ours.shape))
    if heads_first:
        rows_blocked = np.broadcast_to(blocked, ours.shape[:3])        # (B, H, T)
    elif blocked.shape[0] in (1, ours.shape[0]) and blocked.shape[2] == ours.shape[1]:
        rows_blocked = np.broadcast_to(blocked.any(axis=1), ours.shape[:2])   # (B, T)
    else:
        return None
    wrong = ~tolerance.within(theirs, ours, scale_of(first.key))
    wrong_rows = wrong.reshape(rows_blocked.shape + (-1,)).any(axis=-1)
    if not wrong_rows.any() or (wrong_rows & ~rows_blocked).any():
        return None
    return Explanation("MASKED_ROW_MEAN", (
        f"it differs only in the {int(wrong_rows.sum())} query rows whose keys are all masked. "
        "There numpy_tf gives 0 (torch's SDPA rule, SPEC §4), while JAX and Flax attention, "
        "which fill masked scores with a large finite negative number, give uniform weights and "
        "so the mean of v (measured: to 1.1e-16 in Flax float64). Tensors after it inherit the "
        "difference and cannot be checked against this reference: mask no row fully, or make "
        "the model zero such rows, to compare them"))


def explain_first_divergence(rows, reference_meta: dict, reference_arrays: dict,
                             their_meta: dict, their_arrays: dict, dtype: str, tolerance,
                             scale_of: Callable[[str], float]) -> Explanation | None:
    """The known convention that explains the first diverging row of a comparison, or None.
    `rows` are compare's rows in search order; scale_of(key) is the S of a key's group."""
    if all(row.comparison.passed for row in rows):
        return None
    return _float32_softmax(rows, reference_meta, their_meta, dtype, scale_of) or \
        _masked_row_mean(rows, reference_arrays, their_arrays, tolerance, scale_of)
