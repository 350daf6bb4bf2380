"""Dropout: zero each element with probability p and scale the survivors by 1 / (1 - p), so the
expected output equals the input. Identity in eval mode (and for p = 0).

The randomness is run state, not part of the layer: every call that drops needs an explicit
numpy Generator, and the mask it draws is kept in the cache so backward uses the very same one.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module


class DropoutCache(NamedTuple):
    mask: np.ndarray | None     # (...) 0 or 1 / (1 - p) in x's dtype; None when nothing dropped
    x_shape: tuple              # the output's shape
    dtype: np.dtype             # x's, the output's

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_shape, self.dtype


def dropout_mask(shape, p: float, rng: np.random.Generator, dtype) -> np.ndarray:
    """keep / (1 - p), keep ~ Bernoulli(1 - p), drawn from `rng` in `dtype`."""
    keep = rng.random(shape) >= p
    return keep.astype(dtype) * (1.0 / (1.0 - p))


def check_probability(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1); got {p!r}")
    return float(p)


def dropout_forward(x: np.ndarray, p: float, rng: np.random.Generator | None = None,
                    training: bool = True):
    validate.float_array("x", x)
    p = check_probability(p)
    if not training or p == 0.0:
        return x, DropoutCache(None, x.shape, x.dtype)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("dropout in training mode needs rng=numpy.random.Generator (explicit "
                        f"randomness, SPEC §1); got {type(rng).__name__}")
    mask = dropout_mask(x.shape, p, rng, x.dtype)
    return x * mask, DropoutCache(mask, x.shape, x.dtype)


def dropout_backward(dout: np.ndarray, cache: DropoutCache) -> np.ndarray:
    """y = x m with the mask m fixed by the forward, so dx = dout m (the same m)."""
    validate.backward_inputs(dout, cache, DropoutCache)
    return dout if cache.mask is None else dout * cache.mask


class Dropout(Module):
    """torch.nn.Dropout(p); forward(x, rng) draws from the Generator it is given."""

    def __init__(self, p: float = 0.5, dtype=np.float64):
        super().__init__(dtype)
        self.p = check_probability(p)

    def forward(self, x, rng: np.random.Generator | None = None):
        return dropout_forward(x, self.p, rng, self.training)

    def backward(self, dout, cache):
        return dropout_backward(dout, cache)
