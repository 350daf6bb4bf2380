"""Linear's forward and backward for inputs its class has already checked: the values of
layers.linear.linear_forward and linear_backward (the references), bit for bit.

Faster because the Linear class tests the usual input in one expression
(core.validate.is_plain_input: an ndarray of the weight's dtype with the right last axis) and
runs the full checks only otherwise, its own weight and bias needing none; the bias is added in
place; and the backward adds dW and db straight into the gradient arrays the Parameters hold,
as Linear.backward adds the reference's dweight and dbias, before dx is made (so the (OUT, IN)
temporary of dW is gone before the (N, IN) dx exists: 0.25 MB off the small float32 step's
peak in the feed-forward's first Linear). The products are the reference's: the leading axes
flattened into N rows, one matrix multiply each.
"""
from __future__ import annotations

import numpy as np


def linear_rows(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """y = x W^T + b: x (..., IN), W (OUT, IN), b (OUT,) or None -> y (..., OUT)."""
    out = x.reshape(-1, x.shape[-1]) @ weight.T                     # (N, OUT)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def linear_backward_into(dout: np.ndarray, x: np.ndarray, weight: np.ndarray,
                         weight_grad: np.ndarray, bias_grad: np.ndarray | None) -> np.ndarray:
    """dx = dout W, returned; dW = dout^T x added into weight_grad and db = sum_n dout_n into
    bias_grad (when not None)."""
    dout_rows = dout.reshape(-1, dout.shape[-1])                    # (N, OUT)
    weight_grad += dout_rows.T @ x.reshape(-1, x.shape[-1])         # (OUT, IN)
    if bias_grad is not None:
        bias_grad += dout_rows.sum(axis=0)                          # (OUT,)
    dx = dout_rows @ weight                                         # (N, IN)
    return dx.reshape(x.shape)
