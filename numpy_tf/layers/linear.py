"""Linear: y = x W^T + b, exactly torch.nn.Linear.

Shapes: x (..., IN), W (OUT, IN), b (OUT,) -> y (..., OUT). The leading axes (batch, time) are
flattened into one, N = the product of their sizes, so each product is a single matrix multiply.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from ..core.paths import kernels_enabled
from ..kernels.linear import input_to_keep, linear_backward_into, linear_rows


class LinearCache(NamedTuple):
    x: np.ndarray           # (..., IN) the input, needed for dW
    weight: np.ndarray      # (OUT, IN), needed for dx
    has_bias: bool

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return (*self.x.shape[:-1], self.weight.shape[0]), self.x.dtype


class LinearKernelCache(LinearCache):
    """A LinearCache made by the kernel tier (numpy_tf.kernels.linear): the same fields; its
    type tells Linear.backward to run the kernel's backward. Its x is a kernels.norm.NormOutput
    (shape and dtype as x's) when a norm's `feeding` block handed the Linear its output."""
    __slots__ = ()


def _check_linear(x, weight, bias) -> None:
    validate.float_array("x", x, min_ndim=1, shape="(..., IN)")
    validate.float_array("weight", weight, ndim=2, shape="(OUT, IN)")
    validate.same_dtype(weight=weight, x=x, bias=bias)
    validate.last_dim("x", x, weight.shape[1], "the weight's IN")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},); got {bias.shape}")


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None):
    """y = x W^T + b, the leading axes flattened into N rows for one matrix multiply."""
    _check_linear(x, weight, bias)
    out = x.reshape(-1, x.shape[-1]) @ weight.T                     # (N, OUT)
    if bias is not None:
        out = out + bias
    out = out.reshape(*x.shape[:-1], weight.shape[0])               # (..., OUT)
    return out, LinearCache(x, weight, bias is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """y_nk = sum_i x_ni W_ki + b_k for every row n, so

        dx_ni = sum_k dout_nk W_ki            dx = dout W
        dW_ki = sum_n dout_nk x_ni            dW = dout^T x
        db_k  = sum_n dout_nk

    Returns (dx, dweight, dbias); dbias is None without a bias.
    """
    validate.backward_inputs(dout, cache, LinearCache)
    x, weight, has_bias = cache
    dout_rows = dout.reshape(-1, dout.shape[-1])                     # (N, OUT)
    dx = (dout_rows @ weight).reshape(x.shape)                       # (..., IN)
    dweight = dout_rows.T @ x.reshape(-1, x.shape[-1])               # (OUT, IN)
    dbias = dout_rows.sum(axis=0) if has_bias else None              # (OUT,)
    return dx, dweight, dbias


def uniform_init(rng: np.random.Generator, shape, fan_in: int, dtype) -> np.ndarray:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch.nn.Linear's default for weight and bias."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


class Linear(Module):
    """torch.nn.Linear(in_features, out_features, bias). Parameters `weight` (OUT, IN) and
    `bias` (OUT,), initialised as torch does unless a model re-initialises them. Runs
    kernels.linear unless inside numpy_tf.reference_path()."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        in_features = validate.positive_int("in_features", in_features)
        out_features = validate.positive_int("out_features", out_features)
        rng = np.random.default_rng(rng)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(uniform_init(rng, (out_features, in_features), in_features,
                                             self.dtype))
        self.bias = Parameter(uniform_init(rng, (out_features,), in_features, self.dtype)) \
            if bias else None

    def forward(self, x):
        weight = self.weight.data
        bias = None if self.bias is None else self.bias.data
        if not kernels_enabled():
            return linear_forward(x, weight, bias)
        if not validate.is_plain_input(x, weight.dtype, self.in_features):
            validate.float_array("x", x, min_ndim=1, shape="(..., IN)")
            validate.same_dtype(weight=weight, x=x)           # the bias has the weight's dtype
            validate.last_dim("x", x, self.in_features, "in_features")
        # a wrapped, patched or overridden forward may have written into x since its norm
        kept = input_to_keep(x) if self.runs_forward(_OWN_FORWARD) else x
        return linear_rows(x, weight, bias), LinearKernelCache(kept, weight, bias is not None)

    def check_cache(self, cache) -> None:
        """A LinearCache must come from a Linear of this one's shape, dtype and bias: its
        gradients are added into this layer's."""
        if isinstance(cache, LinearCache):
            validate.cache_fits("weight", cache.weight, self.weight.data)
            validate.cache_fits("bias flag", cache.has_bias, self.bias is not None)

    def backward(self, dout, cache):
        self.check_cache(cache)
        if type(cache) is LinearKernelCache:
            validate.backward_inputs(dout, cache, LinearCache)
            return linear_backward_into(dout, cache.x, cache.weight, self.weight.grad,
                                        None if self.bias is None else self.bias.grad)
        dx, dweight, dbias = linear_backward(dout, cache)
        self.weight.grad += dweight
        if self.bias is not None:
            self.bias.grad += dbias
        return dx


_OWN_FORWARD = Linear.forward   # the forward that may keep a norm's output as what rebuilds it
