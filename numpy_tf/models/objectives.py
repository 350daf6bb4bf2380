"""Training objectives that wrap a model: the loss is the output, so the pair can be checked by
finite differences and trained like any Module.

    next-token (causal LM):  loss = mean over t of CE(logits[:, t], ids[:, t + 1])
    masked LM (BERT):        loss = mean over the chosen positions t of
                             CE(logits[:, t], labels[:, t]), the model reading the corrupted
                             inputs (every position sees every other: nothing is shifted)
    sequence-to-sequence:    loss = mean over t of CE(logits[:, t], target[:, t]), the decoder
                             reading BOS + target (teacher forcing): logits[:, t] sees
                             target[:, :t] only (the causal mask)

A padded position predicts nothing, and nothing is asked to predict padding: both get
ignore_index, so the mean runs over the real (position, next token) pairs only.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..layers.cross_entropy_loss import (CrossEntropyCache, cross_entropy_backward,
                                         cross_entropy_forward)


def shifted_targets(ids: np.ndarray, key_padding_mask=None, ignore_index: int = -100):
    """(B, T) int64 targets aligned with the logits of every position: ids[:, t + 1], and
    ignore_index at the last position, at padded positions and before padded tokens.

    key_padding_mask: None, or a bool (B, S) array, True at padding, S >= T: its last T
    columns are the ids' (with a past_kv the model's mask also covers the P cached positions
    before them, S = P + T). A float mask, which the model adds to the scores, names no
    padding and is refused."""
    validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
    ignore_index = validate.integer("ignore_index", ignore_index)
    batch, length = ids.shape
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, np.ndarray):
            raise TypeError("key_padding_mask must be a numpy array; got "
                            f"{type(key_padding_mask).__name__}")
        validate.plain_arithmetic("key_padding_mask", key_padding_mask)
        if key_padding_mask.dtype != bool:
            raise TypeError("key_padding_mask must be bool (True = padding) to say which "
                            f"targets the loss ignores; got dtype {key_padding_mask.dtype} (a "
                            "float mask, added to the scores, names no padding)")
        if key_padding_mask.ndim != 2 or key_padding_mask.shape[0] != batch or \
                key_padding_mask.shape[1] < length:
            raise ValueError(f"key_padding_mask must have shape (B, S) = ({batch}, S), S >= T "
                             f"= {length} (its last T columns the ids'); got "
                             f"{key_padding_mask.shape}")
        key_padding_mask = key_padding_mask[:, key_padding_mask.shape[1] - length:]
    targets = np.full(ids.shape, ignore_index, dtype=np.int64)
    targets[:, :-1] = ids[:, 1:]
    if key_padding_mask is not None:
        ignored = key_padding_mask.copy()
        ignored[:, :-1] |= key_padding_mask[:, 1:]
        targets[ignored] = ignore_index
    return targets


class ModelLossCache(NamedTuple):
    model: tuple                # the model's cache (GPTCache, LlamaCache, BertCache, ...)
    loss: CrossEntropyCache     # of the logits against the targets
    logits: np.ndarray          # (B, T, V), kept for whoever wants to look at them


NextTokenLossCache = ModelLossCache


class _ModelLoss(Module):
    """A model and the mean cross-entropy of its logits; backward runs the model's backward."""

    def __init__(self, model: Module, label_smoothing: float = 0.0):
        super().__init__(model.dtype)
        self.model = model
        self.label_smoothing = label_smoothing

    _copies = 0     # > 0 only inside copy_losses

    def _loss(self, logits, model_cache, targets):
        if self._copies:                    # copy_losses: one mean per copy of the batch
            losses, loss_cache = cross_entropy_forward(logits, targets, reduction="none",
                                                       label_smoothing=self.label_smoothing)
            per_copy = losses.reshape(self._copies, -1).sum(axis=1)
            return per_copy / np.maximum(loss_cache.keep.reshape(self._copies, -1).sum(1), 1), \
                None
        loss, loss_cache = cross_entropy_forward(logits, targets,
                                                 label_smoothing=self.label_smoothing)
        return loss, ModelLossCache(model_cache, loss_cache, logits)

    def copy_losses(self, copies: int, *inputs, **kwargs) -> np.ndarray:
        """forward's loss of each of `copies` batches stacked along the batch axis: `inputs`
        and `kwargs` are forward's, every array among them `copies` batches of one size
        concatenated on axis 0; returns a (copies,) array, the k-th the mean loss of the k-th
        batch alone (its own positions and count). The model reads each row of a batch on its
        own, so one forward of the stack does the work of `copies` forwards: the full
        finite-difference check gives each copy a different perturbed parameter
        (numpy_tf.checking.finite_differences). An objective whose forward does not end in
        _loss (MixtralLoss, with its load-balancing term over the whole batch) returns its
        scalar unchanged, which tells the check that it cannot do this."""
        validate.positive_int("copies", copies)
        self._copies = copies
        try:
            return self.forward(*inputs, **kwargs)[0]
        finally:
            del self._copies

    def backward(self, dloss, cache: ModelLossCache):
        """The forward in exact reverse; returns what the model's backward returns. dlogits
        is handed on without a name here, so that the model's backward can let it go once its
        head has used it (the (B, T, V) array is often the step's largest)."""
        validate.cache_kind(cache, ModelLossCache)
        return self.model.backward(                                 # logits = model(inputs)
            cross_entropy_backward(dloss, cache.loss), cache.model)  # loss = CE(logits, targets)


class NextTokenLoss(_ModelLoss):
    """forward(ids, key_padding_mask=None) -> (mean next-token cross-entropy, cache) of a
    causal language model; backward(dloss, cache) runs the model's backward."""

    def forward(self, ids, key_padding_mask=None, **model_kwargs):
        targets = shifted_targets(ids, key_padding_mask)     # checks the mask before any work
        logits, model_cache = self.model.forward(ids, key_padding_mask=key_padding_mask,
                                                 **model_kwargs)
        return self._loss(logits, model_cache, targets)


class TargetLoss(_ModelLoss):
    """forward(inputs, targets, **model_kwargs) -> (mean cross-entropy of model(inputs)
    against targets, cache), targets already aligned with the logits (ignore_index where no
    target): the objective of next-token windows, whose targets come shifted."""

    def forward(self, inputs, targets, **model_kwargs):
        logits, model_cache = self.model.forward(inputs, **model_kwargs)
        return self._loss(logits, model_cache, targets)


class MaskedLMLoss(TargetLoss):
    """forward(inputs, labels, key_padding_mask=None, token_type_ids=None, rng=None) -> (mean
    cross-entropy of the logits at the positions whose label is not ignore_index, cache) of an
    encoder with a masked-language-model head (numpy_tf.bert.Bert): `inputs` (B, T) are the ids
    after masking, `labels` (B, T) the original ids at the chosen positions and -100 elsewhere,
    as numpy_tf.data.mask_tokens makes them (HF's `labels=` loss of BertForMaskedLM).
    backward(dloss, cache) runs the model's backward."""

    def forward(self, inputs, labels, **model_kwargs):
        validate.integer_array("labels", labels)
        if labels.shape != np.shape(inputs):
            raise ValueError(f"labels must have the shape of inputs {np.shape(inputs)} (one "
                             f"label per position, -100 where nothing is asked); got "
                             f"{labels.shape}")
        return super().forward(inputs, labels, **model_kwargs)


class Seq2SeqLoss(_ModelLoss):
    """forward(src_ids, decoder_input, target, src_key_padding_mask=None,
    tgt_key_padding_mask=None) -> (mean cross-entropy of `target`, cache) of a Seq2Seq model
    under teacher forcing: decoder_input = BOS + target (padded), target = target + EOS with
    ignore_index (-100) at padding, as numpy_tf.data.reverse_digits gives them
    (tgt_key_padding_mask is the decoder input's). `src_ids` (the name a case file's input
    has) is (B, S) ids, or (B, S, F) feature vectors for an encoder with src_features.
    backward(dloss, cache) -> None, or the features' gradient."""

    def forward(self, src_ids, decoder_input, target, src_key_padding_mask=None,
                tgt_key_padding_mask=None, rng=None):
        validate.integer_array("target", target)        # before the model runs, by its name
        if target.shape != np.shape(decoder_input):
            raise ValueError(f"target must have the shape of decoder_input "
                             f"{np.shape(decoder_input)} (one target per decoder position, -100 "
                             f"at padding); got {target.shape}")
        logits, model_cache = self.model.forward(src_ids, decoder_input, src_key_padding_mask,
                                                 tgt_key_padding_mask, rng)
        return self._loss(logits, model_cache, target)
