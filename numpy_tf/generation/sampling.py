"""Sampling the next token from a row of logits z (one row per sequence):

    temperature 0         greedy: argmax z
    temperature t > 0     p = softmax(z / t)
    top_k = k             only the k largest logits keep their probability
    top_p = p             only the smallest set of most probable tokens whose probability
                          reaches p (never empty: the most probable token always stays)

then one draw from the renormalised p with an explicit numpy Generator, so a seed reproduces
the text.
"""
from __future__ import annotations

import numpy as np

from ..core import validate


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 is greedy); got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None); got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (or None); got {top_p!r}")


def sampling_probabilities(logits: np.ndarray, temperature: float = 1.0,
                           top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """(B, V) float64 probabilities of the next token after temperature, top-k and top-p."""
    check_sampling(temperature, top_k, top_p)
    validate.float_array("logits", logits, ndim=2, shape="(B, V)")
    z = logits.astype(np.float64)
    if temperature == 0:
        probs = np.zeros_like(z)
        probs[np.arange(len(z)), z.argmax(axis=-1)] = 1.0
        return probs
    z = z / float(temperature)
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]   # the k-th largest
        z = np.where(z >= kth, z, -np.inf)
    probs = np.exp(z - z.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(sorted_probs, axis=-1) - sorted_probs      # mass ranked above each
        keep_sorted = before < top_p                                    # first one always kept
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_next(logits: np.ndarray, rng: np.random.Generator | None = None,
                temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None) -> np.ndarray:
    """(B,) int64 next tokens for logits (B, V); greedy when temperature is 0."""
    probs = sampling_probabilities(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(axis=-1).astype(np.int64)
    rng = validate.generator("rng", rng)
    cumulative = np.cumsum(probs, axis=-1)
    draws = rng.random(len(probs))[:, None] * cumulative[:, -1:]
    return (cumulative <= draws).sum(axis=-1).clip(max=probs.shape[-1] - 1).astype(np.int64)
