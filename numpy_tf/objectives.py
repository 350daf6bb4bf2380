"""Training objectives that wrap a model: the loss is the output, so the pair can be checked by
finite differences and trained like any Module.

    next-token (causal LM):  loss = mean over t of CE(logits[:, t], ids[:, t + 1])

A padded position predicts nothing, and nothing is asked to predict padding: both get
ignore_index, so the mean runs over the real (position, next token) pairs only.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .core import Module
from .loss import CrossEntropyCache, cross_entropy_backward, cross_entropy_forward


def shifted_targets(ids: np.ndarray, key_padding_mask=None, ignore_index: int = -100):
    """(B, T) int64 targets aligned with the logits of every position: ids[:, t + 1], and
    ignore_index at the last position, at padded positions and before padded tokens."""
    targets = np.full(ids.shape, ignore_index, dtype=np.int64)
    targets[:, :-1] = ids[:, 1:]
    if key_padding_mask is not None:
        ignored = key_padding_mask.copy()
        ignored[:, :-1] |= key_padding_mask[:, 1:]
        targets[ignored] = ignore_index
    return targets


class NextTokenLossCache(NamedTuple):
    model: tuple
    loss: CrossEntropyCache
    logits: np.ndarray          # (B, T, V), kept for whoever wants to look at them


class NextTokenLoss(Module):
    """forward(ids, key_padding_mask=None) -> (mean next-token cross-entropy, cache) of a
    causal language model; backward(dloss, cache) runs the model's backward."""

    def __init__(self, model: Module, label_smoothing: float = 0.0):
        super().__init__(model.dtype)
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, ids, key_padding_mask=None, **model_kwargs):
        logits, model_cache = self.model.forward(ids, key_padding_mask=key_padding_mask,
                                                 **model_kwargs)
        loss, loss_cache = cross_entropy_forward(logits, shifted_targets(ids, key_padding_mask),
                                                 label_smoothing=self.label_smoothing)
        return loss, NextTokenLossCache(model_cache, loss_cache, logits)

    def backward(self, dloss, cache: NextTokenLossCache):
        return self.model.backward(cross_entropy_backward(dloss, cache.loss), cache.model)


class TargetLossCache(NamedTuple):
    model: tuple
    loss: CrossEntropyCache
    logits: np.ndarray


class TargetLoss(Module):
    """forward(inputs, targets, **model_kwargs) -> (mean cross-entropy of model(inputs)
    against targets, cache), targets already aligned with the logits (ignore_index where no
    target): the objective of next-token windows, whose targets come shifted."""

    def __init__(self, model: Module, ignore_index: int = -100, label_smoothing: float = 0.0):
        super().__init__(model.dtype)
        self.model = model
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, inputs, targets, **model_kwargs):
        logits, model_cache = self.model.forward(inputs, **model_kwargs)
        loss, loss_cache = cross_entropy_forward(logits, targets, self.ignore_index,
                                                 self.label_smoothing)
        return loss, TargetLossCache(model_cache, loss_cache, logits)

    def backward(self, dloss, cache: TargetLossCache):
        return self.model.backward(cross_entropy_backward(dloss, cache.loss), cache.model)
