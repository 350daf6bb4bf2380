"""Soft-capping: y = c tanh(x / c), elementwise, for a cap c > 0 (Gemma2's attention logits,
cap 50, and final logits, cap 30).

    x (...) -> y (...), |y| < c

Near zero y = x - x^3 / (3 c^2) + ...: small values pass almost unchanged; large ones approach
+-c smoothly, so no logit runs away while every one keeps a gradient. The division by c comes
first, then tanh, then the product by c, in HF's order (Gemma2's eager attention and its
final_logit_softcapping), so a float32 model rounds as HF's does.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module


class SoftCapCache(NamedTuple):
    tanh: np.ndarray            # (...) t = tanh(x / c): the whole derivative is 1 - t^2

    @property
    def output_spec(self):      # the (shape, dtype) dout must have: y's, which are t's
        return self.tanh.shape, self.tanh.dtype


def softcap_forward(x: np.ndarray, cap: float):
    """y = cap * tanh(x / cap), elementwise; x (...) -> y (...), in x's dtype."""
    validate.float_array("x", x)
    cap = validate.positive_float("cap", cap)
    t = np.tanh(x / cap)                                         # (...)
    return t * cap, SoftCapCache(t)


def softcap_backward(dout: np.ndarray, cache: SoftCapCache) -> np.ndarray:
    """y = c tanh(u) with u = x / c. By the chain rule, with tanh'(u) = 1 - tanh(u)^2:

        dy/dx = c (1 - t^2) (1 / c) = 1 - t^2,        t = tanh(x / c),

    so dx = dout (1 - t^2): the cap cancels, and only t is cached (the forward computed it).
    """
    validate.backward_inputs(dout, cache, SoftCapCache)
    t = cache.tanh
    return dout * (1.0 - t * t)


class SoftCap(Module):
    """softcap_forward / softcap_backward as a Module (no parameters): Gemma2's
    final_logit_softcapping, y = cap tanh(x / cap)."""

    def __init__(self, cap: float, dtype=np.float64):
        super().__init__(dtype)
        self.cap = validate.positive_float("cap", cap)

    def forward(self, x):
        return softcap_forward(x, self.cap)

    def backward(self, dout, cache):
        return softcap_backward(dout, cache)
