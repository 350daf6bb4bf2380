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

A Linear fed a norm's output keeps, for dW, the arrays that rebuild it (norm.NormOutput)
instead of the output itself, when the code feeding it says so: within
`with fed_by_norm(out, norm_output):` a Linear whose forward is given that very array `out`
keeps `norm_output`. LayerNorm.feeding and RMSNorm.feeding open the block around the consumer
their block calls next, which never writes into its input; a Linear keeps x as given when its
forward is wrapped, patched or overridden, or when x's first or last row is no longer the
norm's (what could have written into x first). The backward rebuilds it: the same bits, one
(..., C) pass, and one (..., C) array fewer alive from the forward to the backward. An output
of fewer than FED_MIN_SIZE elements is kept as it is: it costs less memory (256 KB of float64
at most) than the checks cost time (about 6 us a norm, 3 % of the tiny GPT's step and 5 % of a
decoded token's forward at the small one).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from .norm import NormOutput

FED_MIN_SIZE = 32768     # elements of a norm's output below which a Linear keeps the output
_FED: ContextVar[tuple | None] = ContextVar("numpy_tf_fed_by_norm", default=None)


@contextmanager
def fed_by_norm(out: np.ndarray, norm_output: NormOutput):
    """Within the block, a Linear given the array `out` keeps `norm_output` for its backward.
    Each thread has its own (a context variable); the block restores what it found."""
    token = _FED.set((out, norm_output))
    try:
        yield
    finally:
        _FED.reset(token)


def input_to_keep(x: np.ndarray) -> np.ndarray | NormOutput:
    """What a Linear's kernel cache keeps of its input x: a NormOutput when x is the array a
    fed_by_norm block names and its first and last rows are still the norm's, else x."""
    fed = _FED.get()
    if fed is None or fed[0] is not x or not fed[1].matches(x):
        return x
    return fed[1]


def linear_rows(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """y = x W^T + b: x (..., IN), W (OUT, IN), b (OUT,) or None -> y (..., OUT)."""
    out = x.reshape(-1, x.shape[-1]) @ weight.T                     # (N, OUT)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def linear_backward_into(dout: np.ndarray, x: np.ndarray | NormOutput, weight: np.ndarray,
                         weight_grad: np.ndarray, bias_grad: np.ndarray | None) -> np.ndarray:
    """dx = dout W, returned; dW = dout^T x added into weight_grad and db = sum_n dout_n into
    bias_grad (when not None). x may be kept as a NormOutput: rebuilt for dW, then let go."""
    dout_rows = dout.reshape(-1, dout.shape[-1])                    # (N, OUT)
    x_rows = (x.rebuild() if type(x) is NormOutput else x).reshape(-1, x.shape[-1])  # (N, IN)
    weight_grad += dout_rows.T @ x_rows                             # (OUT, IN)
    del x_rows
    if bias_grad is not None:
        bias_grad += dout_rows.sum(axis=0)                          # (OUT,)
    dx = dout_rows @ weight                                         # (N, IN)
    return dx.reshape(x.shape)
