"""Elementwise activations: ReLU, GELU (exact and tanh), SiLU.

Each maps x (...) to an array of the same shape and dtype. Each backward is the exact derivative
of its own forward, so a float64 finite-difference check against that forward passes to 1e-8.

    relu(x)        = max(x, 0)
    gelu(x)        = x Phi(x),  Phi(x) = erfc(-x / sqrt(2)) / 2          (approximate="none")
    gelu_tanh(x)   = x (1 + tanh(u)) / 2,  u = sqrt(2/pi) (x + 0.044715 x^3)   (approximate="tanh")
    silu(x)        = x sigma(x),  sigma(x) = 1 / (1 + exp(-x))
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.paths import kernels_enabled
from ..core.special import erfc
from ..kernels.gelu import gelu_backward_blocks, gelu_forward_blocks

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715
GELU_APPROXIMATIONS = ("none", "tanh")


# -- ReLU -------------------------------------------------------------------------------------
class ReLUCache(NamedTuple):
    positive: np.ndarray    # (...) bool, x > 0
    dtype: np.dtype         # x's, the output's

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.positive.shape, self.dtype


def relu_forward(x: np.ndarray):
    """max(x, 0), elementwise."""
    validate.float_array("x", x)
    return np.maximum(x, 0.0), ReLUCache(x > 0, x.dtype)


def relu_backward(dout: np.ndarray, cache: ReLUCache) -> np.ndarray:
    """y = max(x, 0), so dy/dx = 1 where x > 0 and 0 elsewhere (0 at the kink x = 0, as torch).

        dx = dout * [x > 0]
    """
    validate.backward_inputs(dout, cache, ReLUCache)
    return dout * cache.positive


# -- GELU -------------------------------------------------------------------------------------
class GELUCache(NamedTuple):
    x: np.ndarray               # (...) the input
    out: np.ndarray             # (...) the output y: the array the next layer keeps for its own
                                # backward anyway, so caching it here costs no memory. For the
                                # exact GELU it holds Phi(x) = y / x, the forward's expensive
                                # part, so backward needs no second erf.
    approximate: str

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.out.shape, self.out.dtype


class GELUKernelCache(GELUCache):
    """A GELUCache made by the kernel tier (numpy_tf.kernels.gelu): the same fields; its type
    tells GELU.backward to run the kernel's backward too."""
    __slots__ = ()


def gelu_forward(x: np.ndarray, approximate: str = "none"):
    """GELU, as torch.nn.functional.gelu(x, approximate=...)."""
    validate.float_array("x", x)
    validate.choice("approximate", approximate, GELU_APPROXIMATIONS)
    if approximate == "none":
        cdf = 0.5 * erfc(x * -_SQRT_HALF)                            # Phi(x)
        out = x * cdf
    else:
        t = np.tanh(_SQRT_2_OVER_PI * (x * x * x * _TANH_CUBIC + x))  # t = tanh(u)
        out = x * 0.5 * (1.0 + t)                                     # torch's order
    return out, GELUCache(x, out, approximate)


def gelu_backward(dout: np.ndarray, cache: GELUCache) -> np.ndarray:
    """The exact derivative of the variant that ran forward, times dout.

    approximate="none": y = x Phi(x) with Phi' = phi, the normal density
        phi(x) = exp(-x^2 / 2) / sqrt(2 pi), so by the product rule
        dy/dx = Phi(x) + x phi(x),
    and Phi(x) = y / x comes back from the cache (Phi(0) = 1/2 where y / x is 0 / 0): no
    second erf. y was rounded once and the division rounds once more, so this Phi(x) is
    within two roundings of the forward's own.

    approximate="tanh": y = x (1 + t) / 2 with t = tanh(u), u = sqrt(2/pi) (x + c x^3),
        c = 0.044715. With dt/du = 1 - t^2 and du/dx = sqrt(2/pi) (1 + 3 c x^2):
        dy/dx = (1 + t) / 2 + x (1 - t^2) du/dx / 2 = ((1 - t^2) du/dx x + t + 1) / 2.
    t is recomputed here, as torch does: taken from y / x instead, (1 + t) / 2 would carry
    the rounding of y into 1 - t^2, where t is near +-1, and lose a factor of 5 in float32
    accuracy at x ~ 5.

    Then dx = dout dy/dx, elementwise (the code's names: cdf Phi(x), pdf phi(x), slope
    dy/dx). Cached: x and y (which the next layer keeps anyway); no separate Phi(x) or t,
    which would cost an array the size of x.
    """
    validate.backward_inputs(dout, cache, GELUCache)
    x, out, approximate = cache
    if approximate == "none":
        with np.errstate(invalid="ignore"):                          # 0 / 0 where x = 0
            cdf = np.where(x == 0, 0.5, out / x)                     # Phi(x)
        pdf = np.exp(x * x * -0.5) * _INV_SQRT_2PI                   # phi(x)
        slope = pdf * x + cdf                                        # dy/dx
    else:
        t = np.tanh(_SQRT_2_OVER_PI * (x * x * x * _TANH_CUBIC + x))
        du_dx = _SQRT_2_OVER_PI * (x * x * (3.0 * _TANH_CUBIC) + 1.0)
        slope = ((1.0 - t * t) * du_dx * x + t + 1.0) * 0.5          # dy/dx
    return slope * dout


# -- SiLU -------------------------------------------------------------------------------------
class SiLUCache(NamedTuple):
    x: np.ndarray           # (...)
    sigmoid: np.ndarray     # (...) sigma(x)

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x.shape, self.x.dtype


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); exp overflows to inf for very negative x, giving exactly 0."""
    with np.errstate(over="ignore"):
        return 1.0 / (np.exp(-x) + 1.0)


def silu_forward(x: np.ndarray):
    """x sigma(x), as torch.nn.functional.silu."""
    validate.float_array("x", x)
    s = sigmoid(x)
    return x * s, SiLUCache(x, s)


def silu_backward(dout: np.ndarray, cache: SiLUCache) -> np.ndarray:
    """y = x s with s = sigma(x) and ds/dx = s (1 - s), so
        dy/dx = s + x s (1 - s) = s (1 + x (1 - s)).
    """
    validate.backward_inputs(dout, cache, SiLUCache)
    x, s = cache
    slope = ((1.0 - s) * x + 1.0) * s                                # dy/dx
    return slope * dout


# -- thin classes -----------------------------------------------------------------------------
class ReLU(Module):
    """torch.nn.ReLU. No parameters."""

    def forward(self, x):
        return relu_forward(x)

    def backward(self, dout, cache):
        return relu_backward(dout, cache)


class GELU(Module):
    """torch.nn.GELU(approximate=...). No parameters. Runs kernels.gelu unless inside
    numpy_tf.reference_path()."""

    def __init__(self, approximate: str = "none", dtype=np.float64):
        super().__init__(dtype)
        validate.choice("approximate", approximate, GELU_APPROXIMATIONS)
        self.approximate = approximate

    def forward(self, x):
        if not kernels_enabled():
            return gelu_forward(x, self.approximate)
        validate.float_array("x", x)
        out = gelu_forward_blocks(x, self.approximate)
        return out, GELUKernelCache(x, out, self.approximate)

    def backward(self, dout, cache, *, overwrite_dout: bool = False):
        """gelu_backward's dx (by the kernel tier for a GELUKernelCache). overwrite_dout=True
        is for a caller that made dout itself and holds it alone (layers.mlp.MLP): the
        kernel then writes dx into dout's array, the same bits; the reference ignores it."""
        if type(cache) is GELUKernelCache:
            validate.backward_inputs(dout, cache, GELUCache)
            return gelu_backward_blocks(dout, cache.x, cache.out, cache.approximate,
                                        overwrite_dout=overwrite_dout)
        return gelu_backward(dout, cache)


class SiLU(Module):
    """torch.nn.SiLU. No parameters."""

    def forward(self, x):
        return silu_forward(x)

    def backward(self, dout, cache):
        return silu_backward(dout, cache)


ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "gelu_tanh": lambda dtype=np.float64:
               GELU("tanh", dtype), "silu": SiLU}


def activation(name: str, dtype=np.float64) -> Module:
    """The activation Module for a name: "relu", "gelu" (exact), "gelu_tanh", "silu"."""
    validate.choice("activation", name, tuple(ACTIVATIONS))
    return ACTIVATIONS[name](dtype=dtype)
