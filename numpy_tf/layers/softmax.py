"""softmax and log_softmax over one axis, max-subtracted so no exponent overflows.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),     m = max_j x_j
    log_softmax(x)_i = x_i - m - log sum_j exp(x_j - m)

Subtracting m changes nothing mathematically (it cancels) and keeps every exponent <= 0.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module


class SoftmaxCache(NamedTuple):
    probs: np.ndarray       # (...) the softmax output
    axis: int

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.probs.shape, self.probs.dtype


def softmax_forward(x: np.ndarray, axis: int = -1):
    validate.float_array("x", x, min_ndim=1)
    exp = np.exp(x - x.max(axis=axis, keepdims=True))                  # exp(x_i - m)
    probs = exp / exp.sum(axis=axis, keepdims=True)
    return probs, SoftmaxCache(probs, axis)


def softmax_backward(dout: np.ndarray, cache: SoftmaxCache) -> np.ndarray:
    """p_i = exp(x_i) / sum_j exp(x_j) has the Jacobian dp_i/dx_k = p_i ([i = k] - p_k), so

        dx_k = sum_i dout_i p_i ([i = k] - p_k) = p_k (dout_k - sum_i dout_i p_i).

    Only p is needed: it is cached.
    """
    validate.backward_inputs(dout, cache, SoftmaxCache)
    probs, axis = cache
    dx = dout - (dout * probs).sum(axis=axis, keepdims=True)
    dx *= probs
    return dx


class LogSoftmaxCache(NamedTuple):
    probs: np.ndarray       # (...) softmax(x) = exp(log_softmax(x))
    axis: int

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.probs.shape, self.probs.dtype


def log_softmax_forward(x: np.ndarray, axis: int = -1):
    validate.float_array("x", x, min_ndim=1)
    shifted = x - x.max(axis=axis, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    out = shifted - log_norm
    return out, LogSoftmaxCache(np.exp(out), axis)


def log_softmax_backward(dout: np.ndarray, cache: LogSoftmaxCache) -> np.ndarray:
    """y_i = x_i - log sum_j exp(x_j) has dy_i/dx_k = [i = k] - p_k, so

        dx_k = dout_k - p_k sum_i dout_i.
    """
    validate.backward_inputs(dout, cache, LogSoftmaxCache)
    probs, axis = cache
    return dout - probs * dout.sum(axis=axis, keepdims=True)


class Softmax(Module):
    """torch.nn.Softmax(dim). No parameters."""

    def __init__(self, dim: int = -1, dtype=np.float64):
        super().__init__(dtype)
        self.dim = dim

    def forward(self, x):
        return softmax_forward(x, self.dim)

    def backward(self, dout, cache):
        return softmax_backward(dout, cache)


class LogSoftmax(Softmax):
    """torch.nn.LogSoftmax(dim). No parameters."""

    def forward(self, x):
        return log_softmax_forward(x, self.dim)

    def backward(self, dout, cache):
        return log_softmax_backward(dout, cache)
