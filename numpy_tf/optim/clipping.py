"""Gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_, and the finiteness
check a training step makes before it updates."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..core import validate
from ..core.module import Parameter
from .optimizer import as_parameter_list


def clip_grad_norm(parameters: Iterable[Parameter] | Parameter, max_norm: float,
                   norm_type: float = 2.0, error_if_nonfinite: bool = False) -> float:
    """Scale every gradient in place so their global norm is at most `max_norm`, as
    torch.nn.utils.clip_grad_norm_; returns the norm before clipping.

        total_norm = || (||g_1||_p, ||g_2||_p, ...) ||_p      (p = norm_type; inf: max |g|)
        clip_coef = min(max_norm / (total_norm + 1e-6), 1)
        g_k = g_k clip_coef                                    for every gradient

    computed in the gradients' dtype. A non-finite total norm raises with
    `error_if_nonfinite`; otherwise clip_coef is 0 and the gradients turn NaN where they were
    not finite (torch's behaviour)."""
    params = as_parameter_list(parameters, "parameters")
    max_norm = validate.number("max_norm", max_norm, low=0.0)
    norm_type = validate.number("norm_type", norm_type, low=0.0, low_open=True,
                                finite=False)                   # inf: the largest |g|
    if not params:
        return 0.0
    grads = [parameter.grad for parameter in params]
    dtype = grads[0].dtype
    for position, grad in enumerate(grads):
        if grad.dtype != dtype:
            raise TypeError(f"parameters[{position}].grad is {grad.dtype} but parameters[0]"
                            f".grad is {dtype}; clip gradients of one dtype at a time")
    with np.errstate(over="ignore", invalid="ignore"):
        norms = np.array([np.linalg.norm(grad.ravel(), norm_type) if grad.size else 0.0
                          for grad in grads], dtype=dtype)
        total_norm = np.linalg.norm(norms, norm_type)
        if error_if_nonfinite and not np.isfinite(total_norm):
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is "
                               f"{float(total_norm)}, so they cannot be clipped "
                               "(error_if_nonfinite=True)")
        clip_coef = min(dtype.type(max_norm) / (total_norm + dtype.type(1e-6)), dtype.type(1.0))
        for grad in grads:
            grad *= clip_coef
    return float(total_norm)


def grads_finite(parameters: Iterable[Parameter] | Parameter) -> bool:
    """True when no gradient holds an inf or NaN (check before a step)."""
    return all(bool(np.isfinite(parameter.grad).all())
               for parameter in as_parameter_list(parameters, "parameters"))
