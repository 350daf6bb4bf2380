"""LayerNorm and RMSNorm with one-pass row statistics: the values of layers.norm's
layernorm_forward / layernorm_backward and rmsnorm_forward / rmsnorm_backward (the references,
whose docstrings are the derivations), up to the order of each row's sums.

Faster because every mean over a row of a product (the variance, the mean square,
mean(g * x_hat)) and every sum over the positions of a product (dweight) is one pass of einsum,
which forms no (..., C) temporary for the product; plain means are np.add.reduce divided by C,
without ndarray.mean's Python-level wrapper (it counts at the tiny sizes); x - mean is
normalised in place. The classes call these after checking their input once. einsum adds a
row in another order than NumPy's pairwise sum, so the statistics may differ from the
reference's in their last bits (the measured bound is stated in tests/test_kernels.py).

NormOutput is a norm's output kept as the arrays that make it, for a Linear fed that output
(kernels.linear.fed_by_norm): the Linear needs its input only for dW in its backward, and the
norm's cache holds x_hat anyway, so the step keeps one (..., C) array fewer per norm from the
forward to the backward. rebuild() repeats the forward's operations (scale_and_shift, which the
forwards call too), so the rebuilt array is the forward's output bit for bit.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _row_mean(a: np.ndarray) -> np.ndarray:
    """mean over the last axis, (..., C) -> (..., 1)."""
    return np.add.reduce(a, axis=-1, keepdims=True) / a.shape[-1]


def _row_mean_of_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mean over the last axis of a * b, (..., C) -> (..., 1), in one pass."""
    return np.einsum("...i,...i->...", a, b)[..., None] / a.shape[-1]


def _sum_over_positions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum over every leading (batch, time) position of a * b, (..., C) -> (C,), in one pass."""
    return np.einsum("ni,ni->i", a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]))


def scale_and_shift(x_hat: np.ndarray, weight: np.ndarray | None,
                    bias: np.ndarray | None) -> np.ndarray:
    """out = weight * x_hat + bias, a new array (x_hat is the cache's)."""
    out = x_hat * weight if weight is not None else x_hat.copy()    # (..., C)
    if bias is not None:
        out += bias
    return out


class NormOutput(NamedTuple):
    """out = weight * x_hat + bias of a LayerNorm or RMSNorm (bias None), kept in place of out."""
    x_hat: np.ndarray               # (..., C) the norm cache's own
    weight: np.ndarray | None       # (C,) the scale gamma the forward used, or None
    bias: np.ndarray | None         # (C,) or None

    @property
    def shape(self) -> tuple:
        return self.x_hat.shape

    @property
    def dtype(self) -> np.dtype:
        return self.x_hat.dtype

    def matches(self, out: np.ndarray) -> bool:
        """Whether out's first and last rows are the bytes this rebuilds there: a check, in
        O(C), that out is what the norm returned and has not been written since."""
        if out.shape != self.shape or out.dtype != self.dtype or out.size == 0:
            return False
        x_hat, out = self.x_hat.reshape(-1, out.shape[-1]), out.reshape(-1, out.shape[-1])
        return all(NormOutput(x_hat[row], self.weight, self.bias).rebuild().tobytes() ==
                   out[row].tobytes() for row in (0, -1))

    def rebuild(self) -> np.ndarray:
        """The forward's out, the same bits (x_hat itself when there is nothing to apply: the
        caller only reads it)."""
        if self.weight is None and self.bias is None:
            return self.x_hat
        return scale_and_shift(self.x_hat, self.weight, self.bias)


def layernorm_rows(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None,
                   eps: float):
    """(out, x_hat, inv_std) of LayerNorm over the last axis of a checked x (..., C)."""
    mean = _row_mean(x)                                             # (..., 1)
    x_hat = x - mean                                                # (..., C) centered
    inv_std = 1.0 / np.sqrt(_row_mean_of_product(x_hat, x_hat) + eps)   # (..., 1)
    x_hat *= inv_std                                                # in place
    return scale_and_shift(x_hat, weight, bias), x_hat, inv_std


def layernorm_rows_backward(dout: np.ndarray, x_hat: np.ndarray, inv_std: np.ndarray,
                            weight: np.ndarray | None, has_bias: bool):
    """(dx, dweight, dbias) = inv_std (g - mean(g) - x_hat mean(g x_hat)), g = dout w, ..."""
    g = dout * weight if weight is not None else dout                        # (..., C)
    dx = g - _row_mean(g)                                                    # (..., C)
    dx -= x_hat * _row_mean_of_product(g, x_hat)
    dx *= inv_std
    dweight = _sum_over_positions(dout, x_hat) if weight is not None else None  # (C,)
    dbias = dout.sum(axis=tuple(range(dout.ndim - 1))) if has_bias else None    # (C,)
    return dx, dweight, dbias


def rmsnorm_rows(x: np.ndarray, weight: np.ndarray | None, eps: float):
    """(out, x_hat, inv_rms) of RMSNorm over the last axis of a checked x (..., C)."""
    inv_rms = 1.0 / np.sqrt(_row_mean_of_product(x, x) + eps)       # (..., 1)
    x_hat = x * inv_rms                                             # (..., C)
    return scale_and_shift(x_hat, weight, None), x_hat, inv_rms


def rmsnorm_rows_backward(dout: np.ndarray, x_hat: np.ndarray, inv_rms: np.ndarray,
                          weight: np.ndarray | None):
    """(dx, dweight) = inv_rms (g - x_hat mean(g x_hat)), g = dout w, ..."""
    g = dout * weight if weight is not None else dout                        # (..., C)
    dx = g - x_hat * _row_mean_of_product(g, x_hat)                          # (..., C)
    dx *= inv_rms
    dweight = _sum_over_positions(dout, x_hat) if weight is not None else None  # (C,)
    return dx, dweight
