"""Linear's forward for an input its class has already checked: the values of
layers.linear.linear_forward (the reference), bit for bit.

Faster at small sizes because the Linear class tests the usual input in one expression
(core.validate.is_plain_input: an ndarray of the weight's dtype with the right last axis) and
runs the full checks only otherwise, its own weight and bias needing none; the bias is added in
place. The product is the reference's: the leading axes flattened into N rows, one matrix
multiply.
"""
from __future__ import annotations

import numpy as np


def linear_rows(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """y = x W^T + b: x (..., IN), W (OUT, IN), b (OUT,) or None -> y (..., OUT)."""
    out = x.reshape(-1, x.shape[-1]) @ weight.T                     # (N, OUT)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])
