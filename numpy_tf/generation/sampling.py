"""Sampling the next token from a row of logits z (one row per sequence):

    temperature 0         greedy: argmax z
    temperature t > 0     p = softmax(z / t), computed as softmax((z - max z) / t): the same
                          numbers, and a tiny t tends to greedy (z / t would overflow to
                          inf - inf = NaN)
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
    """temperature a finite number >= 0 (0 is greedy), top_k None or an integer >= 1, top_p
    None or in (0, 1]; Python or NumPy numbers (np.float32(0.7) is a temperature)."""
    def real(value) -> bool:
        return not isinstance(value, (bool, np.bool_)) and \
            isinstance(value, (int, float, np.integer, np.floating)) and bool(np.isfinite(value))

    if not real(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 is greedy); got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None); got {top_k!r}")
    if top_p is not None and (not real(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (or None); got {top_p!r}")


def check_logits(name: str, logits: np.ndarray) -> None:
    """Scores a token can be drawn from: no NaN, no +inf, and in every row at least one
    finite logit. A -inf logit is a blocked token (masking), so it is allowed; a row of them
    blocks every token and is refused, as is any NaN or +inf (softmax of either is NaN, and
    the draw would silently return token 0)."""
    if logits.size and np.isfinite(logits).all():   # the usual case, in one pass
        return
    with np.errstate(invalid="ignore"):
        problems = [("NaN", np.isnan(logits)), ("+inf", logits == np.inf)]
    problems.append(("-inf in every entry of a row (no token left to draw)",
                     np.broadcast_to(np.all(logits == -np.inf, axis=-1, keepdims=True),
                                     logits.shape)))
    for what, bad in problems:
        if bad.any():
            position = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} must be finite (or -inf for a blocked token, with at "
                             f"least one finite logit per row); got {what} at position "
                             f"{position}")


def sampling_probabilities(logits: np.ndarray, temperature: float = 1.0,
                           top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """(B, V) float64 probabilities of the next token after temperature, top-k and top-p."""
    check_sampling(temperature, top_k, top_p)
    validate.float_array("logits", logits, ndim=2, shape="(B, V)")
    if logits.shape[1] == 0:
        raise ValueError(f"logits must hold at least one token per row (B, V); got shape "
                         f"{logits.shape}")
    check_logits("logits", logits)
    z = logits.astype(np.float64)
    if temperature == 0:
        probs = np.zeros_like(z)
        probs[np.arange(len(z)), z.argmax(axis=-1)] = 1.0
        return probs
    with np.errstate(over="ignore"):        # a tiny t: the best logit 0, the others -inf
        z = (z - z.max(axis=-1, keepdims=True)) / float(temperature)
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
