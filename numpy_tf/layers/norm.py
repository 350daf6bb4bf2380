"""LayerNorm and RMSNorm over the last axis, exactly torch.nn.LayerNorm and torch.nn.RMSNorm.

Shapes: x (..., C) -> out (..., C); weight and bias (C,). Every statistic is taken over the last
axis only, one row (one token's C features) at a time; the leading axes are batch and time.

    LayerNorm:  out = w * (x - mean) / sqrt(var + eps) + b,    var = mean((x - mean)^2)
    RMSNorm:    out = w * x / sqrt(mean(x^2) + eps)
                (unit_offset: out = (1 + w) * x / sqrt(mean(x^2) + eps), Gemma's, w starting at 0)

SPEC §5: LayerNorm uses the biased variance (divide by C, not C - 1) with eps INSIDE the square
root, default eps 1e-5. RMSNorm has no bias and no mean subtraction, and its eps must be given
explicitly: torch's nn.RMSNorm(eps=None) means finfo(dtype).eps, which would silently differ
between float32 and float64, and Llama checkpoints use 1e-6 or 1e-5, so numpy_tf has no default.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from ..core.paths import kernels_enabled
from ..kernels import linear as linear_kernels
from ..kernels.norm import (NormOutput, layernorm_rows, layernorm_rows_backward, rmsnorm_rows,
                            rmsnorm_rows_backward)


def _check_row_input(x, weight, bias, eps) -> float:
    """Validate x (..., C) and the optional (C,) weight and bias; return eps as a Python float."""
    validate.float_array("x", x, min_ndim=1, shape="(..., C)")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            validate.float_array(name, param, shape="(C,)")
    validate.same_dtype(weight=weight, bias=bias, x=x)
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and param.shape != x.shape[-1:]:
            raise ValueError(f"{name} must have shape ({x.shape[-1]},) to match x's last "
                             f"dimension; got {param.shape}")
    return validate.positive_float("eps", eps)


def _normalized_width(normalized_shape) -> int:
    if isinstance(normalized_shape, tuple) and len(normalized_shape) == 1:
        normalized_shape = normalized_shape[0]
    if isinstance(normalized_shape, bool) or \
            not isinstance(normalized_shape, (int, np.integer)) or normalized_shape <= 0:
        raise ValueError("normalized_shape must be a positive integer C (numpy_tf normalizes "
                         f"over the last axis only); got {normalized_shape!r}")
    return int(normalized_shape)


def _explicit_eps(eps):
    """RMSNorm's eps has no default (see the module text): None is refused by name."""
    if eps is None:
        raise ValueError("eps must be given explicitly for RMSNorm (Llama uses 1e-6 or 1e-5; "
                         "torch's eps=None means finfo(dtype).eps, which numpy_tf does not "
                         "guess); got None")
    return eps


def _leading_axes(array: np.ndarray) -> tuple[int, ...]:
    """Every axis but the last: the (batch, time) positions a (C,) parameter is shared over."""
    return tuple(range(array.ndim - 1))


# -- LayerNorm --------------------------------------------------------------------------------
class LayerNormCache(NamedTuple):
    x_hat: np.ndarray               # (..., C) (x - mean) * inv_std, for dx and dweight
    inv_std: np.ndarray             # (..., 1) 1 / sqrt(var + eps), for dx
    weight: np.ndarray | None       # (C,) or None, for dx: the scale gamma (1 + w with the offset)
    has_bias: bool

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_hat.shape, self.x_hat.dtype


class LayerNormKernelCache(LayerNormCache):
    """A LayerNormCache made by the kernel tier (numpy_tf.kernels.norm): the same fields; its
    type tells LayerNorm.backward to run the kernel's backward too."""
    __slots__ = ()


def layernorm_forward(x: np.ndarray, weight: np.ndarray | None = None,
                      bias: np.ndarray | None = None, eps: float = 1e-5):
    """out = weight * x_hat + bias, x_hat = (x - mean) / sqrt(var + eps), over the last axis,
    biased variance, as torch.nn.functional.layer_norm. x (..., C) -> out (..., C)."""
    eps = _check_row_input(x, weight, bias, eps)
    mean = x.mean(axis=-1, keepdims=True)                           # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)            # (..., 1) divides by C
    inv_std = 1.0 / np.sqrt(var + eps)                              # (..., 1)
    x_hat = (x - mean) * inv_std                                    # (..., C)
    out = x_hat * weight if weight is not None else x_hat.copy()    # (..., C) not the cache's
    if bias is not None:
        out = out + bias
    return out, LayerNormCache(x_hat, inv_std, weight, bias is not None)


def layernorm_backward(dout: np.ndarray, cache: LayerNormCache):
    """The gradient of LayerNorm over one row x of C features (every row is independent).

    Definitions, as in the forward:
        mean    = (1/C) sum_j x_j
        var     = (1/C) sum_j (x_j - mean)^2          (biased)
        inv_std = (var + eps)^(-1/2)
        x_hat_i = (x_i - mean) inv_std
        out_i   = w_i x_hat_i + b_i

    Parameters: out_i depends on w_i and b_i only through w_i x_hat_i + b_i, so, summed over
    every row,
        dweight_i = sum_rows dout_i x_hat_i,        dbias_i = sum_rows dout_i.

    Input. Let g_i = dout_i w_i, the gradient reaching x_hat_i. The pieces:
        d mean / d x_j    = 1/C
        d var / d x_j     = (2/C) (x_j - mean)    (the terms from d mean/d x_j sum to zero,
                                                   because sum_i (x_i - mean) = 0)
        d inv_std / d x_j = -(1/2) (var + eps)^(-3/2) (2/C) (x_j - mean)
                          = -inv_std^3 (x_j - mean) / C = -inv_std^2 x_hat_j / C
                            ((var + eps)^(-3/2) = inv_std^3 and (x_j - mean) inv_std = x_hat_j;
                             the eps is inside every factor, no approximation)
        d x_hat_i / d x_j = inv_std ([i = j] - 1/C) + (x_i - mean) d inv_std / d x_j
                          = inv_std ([i = j] - 1/C) - (x_i - mean) inv_std^2 x_hat_j / C
                          = inv_std ([i = j] - 1/C - x_hat_i x_hat_j / C)
    so
        dx_j = sum_i g_i d x_hat_i / d x_j
             = inv_std (g_j - mean(g) - x_hat_j mean(g * x_hat)),

    the closed form the code uses (means over the row). When eps dominates (a row of nearly
    equal values, var << eps), inv_std stays at most eps^(-1/2) and x_hat stays small, so dx
    stays finite; it is still the exact derivative, since eps was never dropped.

    Cached: x_hat and inv_std (everything dx needs, instead of x, mean and var), and the weight
    for g. Returns (dx, dweight, dbias); dweight / dbias are None for an absent weight / bias.
    """
    validate.backward_inputs(dout, cache, LayerNormCache)
    x_hat, inv_std, weight, has_bias = cache
    g = dout * weight if weight is not None else dout                        # (..., C)
    mean_g = g.mean(axis=-1, keepdims=True)                                  # (..., 1)
    mean_g_x_hat = (g * x_hat).mean(axis=-1, keepdims=True)                  # (..., 1)
    dx = (g - mean_g - x_hat * mean_g_x_hat) * inv_std                       # (..., C)
    rows = _leading_axes(dout)
    dweight = (dout * x_hat).sum(axis=rows) if weight is not None else None  # (C,)
    dbias = dout.sum(axis=rows) if has_bias else None                        # (C,)
    return dx, dweight, dbias


# -- RMSNorm ----------------------------------------------------------------------------------
class RMSNormCache(NamedTuple):
    x_hat: np.ndarray               # (..., C) x * inv_rms, for dx and dweight
    inv_rms: np.ndarray             # (..., 1) 1 / sqrt(mean(x^2) + eps), for dx
    weight: np.ndarray | None       # (C,) or None, for dx: the scale gamma (1 + w with the offset)

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_hat.shape, self.x_hat.dtype


class RMSNormKernelCache(RMSNormCache):
    """An RMSNormCache made by the kernel tier (numpy_tf.kernels.norm): the same fields; its
    type tells RMSNorm.backward to run the kernel's backward too."""
    __slots__ = ()


def rmsnorm_forward(x: np.ndarray, weight: np.ndarray | None = None, eps: float | None = None,
                    unit_offset: bool = False):
    """out = weight * x / sqrt(mean(x^2) + eps) over the last axis, as torch.nn.RMSNorm;
    with unit_offset, out = (1 + weight) * x / sqrt(mean(x^2) + eps), as Gemma's RMSNorm.
    x (..., C) -> out (..., C). eps is required (there is no default; see the module text)."""
    eps = _check_row_input(x, weight, None, _explicit_eps(eps))
    if unit_offset and weight is not None:
        weight = 1.0 + weight                                       # gamma (C,)
    mean_square = (x * x).mean(axis=-1, keepdims=True)              # (..., 1)
    inv_rms = 1.0 / np.sqrt(mean_square + eps)                      # (..., 1)
    x_hat = x * inv_rms                                             # (..., C)
    out = x_hat * weight if weight is not None else x_hat.copy()    # (..., C) not the cache's
    return out, RMSNormCache(x_hat, inv_rms, weight)


def rmsnorm_backward(dout: np.ndarray, cache: RMSNormCache):
    """The gradient of RMSNorm over one row x of C features.

    Definitions, as in the forward:
        inv_rms = ((1/C) sum_j x_j^2 + eps)^(-1/2)
        x_hat_i = x_i inv_rms
        out_i   = w_i x_hat_i

    Weight: dweight_i = sum_rows dout_i x_hat_i.
    With the unit offset, out_i = gamma_i x_hat_i with gamma_i = 1 + w_i: d gamma_i / d w_i = 1,
    so dweight is the same sum, and everything below holds with gamma for w (the cache keeps
    gamma).

    Input. Let g_i = dout_i w_i. There is no mean to subtract, so
        d inv_rms / d x_j = -(1/2) inv_rms^3 (2/C) x_j = -inv_rms^3 x_j / C
                          = -inv_rms^2 x_hat_j / C
                            (x_j inv_rms = x_hat_j; inv_rms^2 = 1 / (mean(x^2) + eps): eps
                             stays inside)
        d x_hat_i / d x_j = inv_rms [i = j] + x_i d inv_rms / d x_j
                          = inv_rms [i = j] - x_i inv_rms^2 x_hat_j / C
                          = inv_rms ([i = j] - x_hat_i x_hat_j / C)
    so
        dx_j = inv_rms (g_j - x_hat_j mean(g * x_hat)),

    LayerNorm's formula without the mean(g) term (no mean was subtracted forward). A row of
    zeros gives inv_rms = eps^(-1/2), x_hat = 0 and dx = g eps^(-1/2): finite.

    Cached: x_hat and inv_rms, and the weight for g. Returns (dx, dweight); dweight is None
    without a weight.
    """
    validate.backward_inputs(dout, cache, RMSNormCache)
    x_hat, inv_rms, weight = cache
    g = dout * weight if weight is not None else dout                        # (..., C)
    mean_g_x_hat = (g * x_hat).mean(axis=-1, keepdims=True)                  # (..., 1)
    dx = (g - x_hat * mean_g_x_hat) * inv_rms                                # (..., C)
    rows = _leading_axes(dout)
    dweight = (dout * x_hat).sum(axis=rows) if weight is not None else None  # (C,)
    return dx, dweight


# -- thin classes -----------------------------------------------------------------------------
def _check_own_cache(layer, cache, kind) -> None:
    """A cache of the right kind must also come from a norm of this layer's width, dtype and
    parameters (the gradients are added into this layer's)."""
    if isinstance(cache, kind):
        validate.cache_fits("weight", cache.weight,
                            None if layer.weight is None else layer.weight.data)
        if kind is LayerNormCache:
            validate.cache_fits("bias flag", cache.has_bias, layer.bias is not None)


def _feeding(norm: Module, own_class: type, out, cache, kind: type, kernel_cache: type, bias):
    """norm.feeding's block: kernels.linear.fed_by_norm when `out` comes from norm's kernel
    forward (the class's own forward, not overridden, patched or wrapped on the instance, any
    of which could have replaced or written out; a kernel cache) and has at least
    FED_MIN_SIZE elements, else a block that does nothing. (The Linear then checks that out's
    first and last rows are what the cache rebuilds: kernels.linear.input_to_keep.) With this
    class's forward, a cache of another kind or an out that is no array is a mistake in the
    caller and is refused."""
    if not norm.runs_forward(_OWN_FORWARDS[own_class]):
        return nullcontext()
    validate.cache_kind(cache, kind)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be the array this norm's forward returned; got "
                        f"{validate.kind_of(out)}")
    if type(out) is not np.ndarray or out.size < linear_kernels.FED_MIN_SIZE or \
            type(cache) is not kernel_cache:
        return nullcontext()
    return linear_kernels.fed_by_norm(out, NormOutput(cache.x_hat, cache.weight, bias))


class LayerNorm(Module):
    """torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias) over the last axis.
    Parameters `weight` (C,) initialised to ones and `bias` (C,) to zeros, as torch; both are
    None without elementwise_affine, the bias is None with bias=False. Runs kernels.norm
    unless inside numpy_tf.reference_path()."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype=np.float64):
        super().__init__(dtype)
        self.normalized_shape = _normalized_width(normalized_shape)
        self.eps = validate.positive_float("eps", eps)
        width = self.normalized_shape
        self.weight = Parameter(np.ones(width, self.dtype)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(width, self.dtype)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        weight = None if self.weight is None else self.weight.data
        bias = None if self.bias is None else self.bias.data
        if not kernels_enabled():
            return layernorm_forward(x, weight, bias, self.eps)
        if not validate.is_plain_input(x, self.dtype if weight is None else weight.dtype,
                                       self.normalized_shape):
            validate.float_array("x", x, min_ndim=1, shape="(..., C)")
            validate.last_dim("x", x, self.normalized_shape, "normalized_shape")
            validate.same_dtype(weight=weight, x=x)     # the bias has the weight's dtype
        out, x_hat, inv_std = layernorm_rows(x, weight, bias, self.eps)
        return out, LayerNormKernelCache(x_hat, inv_std, weight, bias is not None)

    def feeding(self, out, cache):
        """`with norm.feeding(out, cache): consumer.forward(out)`, where (out, cache) is what
        this norm's forward has just returned and the consumer uses out as given (never
        writes into it): a Linear in the consumer given out keeps the arrays that rebuild it
        (cache's x_hat, the weight and bias) instead of out, and rebuilds it, the same bits,
        in its backward: one (..., C) array fewer alive from the forward to the backward
        (kernels.linear). Does nothing for a reference-path cache, a forward wrapped, patched
        or overridden, or an output under kernels.linear.FED_MIN_SIZE elements."""
        return _feeding(self, LayerNorm, out, cache, LayerNormCache, LayerNormKernelCache,
                        None if self.bias is None else self.bias.data)

    def backward(self, dout, cache):
        _check_own_cache(self, cache, LayerNormCache)
        if type(cache) is LayerNormKernelCache:
            validate.backward_inputs(dout, cache, LayerNormCache)
            dx, dweight, dbias = layernorm_rows_backward(dout, *cache)
        else:
            dx, dweight, dbias = layernorm_backward(dout, cache)
        if self.weight is not None:
            self.weight.grad += dweight
        if self.bias is not None:
            self.bias.grad += dbias
        return dx


class RMSNorm(Module):
    """torch.nn.RMSNorm(normalized_shape, eps, elementwise_affine) over the last axis, with eps
    REQUIRED: torch's eps=None (finfo(dtype).eps) has no counterpart here, pass the model's
    value (1e-6 or 1e-5 for Llama). Parameter `weight` (C,) initialised to ones, as torch; None
    without elementwise_affine. There is no bias. unit_offset=True is Gemma's RMSNorm: the
    scale is 1 + weight, and the weight starts at zeros (HF's GemmaRMSNorm). Runs kernels.norm
    unless inside numpy_tf.reference_path()."""

    def __init__(self, normalized_shape: int, eps: float, elementwise_affine: bool = True,
                 dtype=np.float64, *, unit_offset: bool = False):
        super().__init__(dtype)
        self.normalized_shape = _normalized_width(normalized_shape)
        self.eps = validate.positive_float("eps", _explicit_eps(eps))
        self.unit_offset = validate.flag("unit_offset", unit_offset)
        start = np.zeros if unit_offset else np.ones                # gamma = 1 either way
        self.weight = Parameter(start(self.normalized_shape, self.dtype)) \
            if elementwise_affine else None

    def forward(self, x):
        weight = None if self.weight is None else self.weight.data
        validate.float_array("x", x, min_ndim=1, shape="(..., C)")
        validate.last_dim("x", x, self.normalized_shape, "normalized_shape")
        if not kernels_enabled():
            return rmsnorm_forward(x, weight, self.eps, self.unit_offset)
        validate.same_dtype(weight=weight, x=x)
        if self.unit_offset and weight is not None:
            weight = 1.0 + weight                                   # gamma
        out, x_hat, inv_rms = rmsnorm_rows(x, weight, self.eps)
        return out, RMSNormKernelCache(x_hat, inv_rms, weight)

    def feeding(self, out, cache):
        """As LayerNorm.feeding (no bias)."""
        return _feeding(self, RMSNorm, out, cache, RMSNormCache, RMSNormKernelCache, None)

    def backward(self, dout, cache):
        _check_own_cache(self, cache, RMSNormCache)
        if type(cache) is RMSNormKernelCache:
            validate.backward_inputs(dout, cache, RMSNormCache)
            dx, dweight = rmsnorm_rows_backward(dout, *cache)
        else:
            dx, dweight = rmsnorm_backward(dout, cache)
        if self.weight is not None:
            self.weight.grad += dweight
        return dx


# the forwards _feeding trusts: each class's own, as defined here (a patch of the class's
# attribute, as mock.patch.object makes, is another function)
_OWN_FORWARDS = {LayerNorm: LayerNorm.forward, RMSNorm: RMSNorm.forward}
