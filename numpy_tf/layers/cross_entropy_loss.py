"""Cross-entropy from logits, as torch.nn.functional.cross_entropy, with the classes on the LAST
axis (torch puts them on axis 1): logits (..., C), targets (...) integer class ids.

For one position with log-probabilities l = log_softmax(z), target y and smoothing e:

    loss = -(1 - e) l_y - (e / C) sum_c l_c

A target equal to `ignore_index` (default -100) contributes nothing. reduction="mean" divides
the sum by the number of targets that are not ignored; "sum" does not divide; "none" returns the
per-position losses (0 at ignored positions). If every target is ignored, "mean" gives 0.0 with
a zero gradient; torch returns nan there (SPEC §5).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module

REDUCTIONS = ("mean", "sum", "none")


class CrossEntropyCache(NamedTuple):
    logits: np.ndarray          # (..., C) the input: backward recomputes the softmax from it
    row_max: np.ndarray         # (..., 1) max_c z_c
    log_sum: np.ndarray         # (..., 1) log sum_c exp(z_c - max), so that
                                # softmax(z) = exp((z - max) - log_sum), as torch's log_softmax
    targets: np.ndarray         # (...) class ids, ignored positions set to 0
    keep: np.ndarray            # (...) bool, False where the target is ignore_index
    count: int                  # the number of kept targets (the "mean" divisor)
    label_smoothing: float
    reduction: str

    @property
    def output_spec(self):  # the (shape, dtype) dloss must have
        return (self.keep.shape if self.reduction == "none" else ()), self.logits.dtype


def _at_targets(values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """values[..., targets[...]]: (..., C) and (...) -> (...), a view of the picked entries'
    positions as one flat fancy index (take_along_axis's Python layer costs more at small
    sizes)."""
    rows = values.reshape(-1, values.shape[-1])
    return rows[np.arange(len(rows)), targets.reshape(-1)].reshape(targets.shape)


def _check_cross_entropy(logits, targets, ignore_index, label_smoothing, reduction) -> None:
    validate.float_array("logits", logits, min_ndim=1, shape="(..., C)")
    validate.integer_array("targets", targets)
    validate.choice("reduction", reduction, REDUCTIONS)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {logits.shape[:-1]} (logits' shape without "
                         f"the class axis); got {targets.shape}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1]; got {label_smoothing}")
    validate.ids_in_range("targets", targets, logits.shape[-1], allowed_extra=ignore_index)


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean"):
    """(loss, cache): loss is 0-d for "mean"/"sum", shape (...) for "none"; logits' dtype."""
    _check_cross_entropy(logits, targets, ignore_index, label_smoothing, reduction)
    classes = logits.shape[-1]
    keep = targets != ignore_index                                      # (...)
    safe_targets = np.where(keep, targets, 0)
    row_max = logits.max(axis=-1, keepdims=True)                        # (..., 1)
    shifted = logits - row_max                                          # (..., C) z - max
    log_sum = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))       # (..., 1)
    picked = _at_targets(shifted, safe_targets) - log_sum[..., 0]       # l_y
    losses = -(1.0 - label_smoothing) * picked                          # (...)
    if label_smoothing:                                                 # sum_c l_c
        log_probs_sum = shifted.sum(axis=-1) - classes * log_sum[..., 0]
        losses -= (label_smoothing / classes) * log_probs_sum
    losses = np.where(keep, losses, 0.0).astype(logits.dtype, copy=False)
    count = int(keep.sum())
    if reduction == "none":
        loss = losses
    else:
        loss = losses.sum() if reduction == "sum" else losses.sum() / max(count, 1)
    cache = CrossEntropyCache(logits, row_max, log_sum, safe_targets, keep, count,
                              label_smoothing, reduction)
    return np.asarray(loss, dtype=logits.dtype), cache


def cross_entropy_backward(dloss, cache: CrossEntropyCache) -> np.ndarray:
    """d loss_n / d z_nc for one kept position n, with p = softmax(z_n):
    since d l_k / d z_c = [k = c] - p_c,

        d/dz_c [-(1 - e) l_y - (e / C) sum_k l_k] = p_c - (1 - e) [c = y] - e / C.

    Ignored positions get 0. "mean" scales by 1 / count (0 if nothing is kept), "sum" by 1,
    "none" by each position's own upstream gradient. `dloss` is the upstream gradient of the
    loss (1.0 when the loss is the final objective).

    Cached: the logits themselves (the caller keeps them anyway), and per row the max and
    log_sum, from which p = exp((z - max) - log_sum) is recomputed here: one exp instead of a
    kept (..., C) array. Subtracting the max first, then log_sum, is torch's log_softmax order;
    z - (max + log_sum) would round the sum first, and with logits of 1e4 in float32 that
    rounding alone (5e-4) would be the error of every p.
    """
    validate.backward_inputs(dloss, cache, CrossEntropyCache, "dloss")
    logits, row_max, log_sum, targets, keep, count, smoothing, reduction = cache
    classes = logits.shape[-1]
    dlogits = np.exp((logits - row_max) - log_sum)                      # p (..., C)
    rows = dlogits.reshape(-1, classes)                                 # the same array
    rows[np.arange(len(rows)), targets.reshape(-1)] -= 1.0 - smoothing  # - (1 - e) [c = y]
    if smoothing:
        dlogits -= smoothing / classes                                  # - e / C
    dloss = np.asarray(dloss, dtype=logits.dtype)
    if reduction == "mean":
        dloss = dloss / count if count else np.zeros_like(dloss)
    scale = np.where(keep, dloss, 0.0).astype(logits.dtype, copy=False)    # (...)
    dlogits *= scale[..., None]
    return dlogits


def cross_entropy(logits, targets, ignore_index: int = -100, label_smoothing: float = 0.0):
    """Mean cross-entropy and its gradient with respect to the logits, in one call:
    (loss, dlogits) — what a training step needs."""
    loss, cache = cross_entropy_forward(logits, targets, ignore_index, label_smoothing)
    return loss, cross_entropy_backward(1.0, cache)


class CrossEntropyLoss(Module):
    """torch.nn.CrossEntropyLoss(ignore_index, label_smoothing, reduction), classes on the last
    axis. forward(logits, targets) -> (loss, cache); backward(dloss, cache) -> dlogits."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean", dtype=np.float64):
        super().__init__(dtype)
        validate.choice("reduction", reduction, REDUCTIONS)
        self.ignore_index, self.label_smoothing, self.reduction = \
            ignore_index, label_smoothing, reduction

    def forward(self, logits, targets):
        return cross_entropy_forward(logits, targets, self.ignore_index, self.label_smoothing,
                                     self.reduction)

    def backward(self, dloss, cache):
        return cross_entropy_backward(dloss, cache)
