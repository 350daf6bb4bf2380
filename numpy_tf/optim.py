"""Optimizers with torch.optim's exact semantics (SGD, Adam, AdamW), and gradient clipping.

Each update is a function that changes its arrays in place (`sgd_update`, `adam_update`), its
docstring the formula, its operations in the order of torch's single-tensor (foreach=False)
code, so float64 parameters agree with torch to a few ulps. The classes hold the parameter
groups, the state and the checkpoints (numpy_tf.optimizer) and call the update per parameter:

    optimizer = AdamW(decay_groups(model, 0.1), lr=3e-4)
    optimizer.zero_grad(); ...backward...; clip_grad_norm(model.parameters(), 1.0)
    for group in optimizer.param_groups:
        group["lr"] = warmup_cosine(step, 3e-4, warmup_steps, total_steps)
    optimizer.step()

Parameters are updated in place (`-=`, `*=`): the arrays keep their identity and dtype, and every
scalar is a Python float so float32 parameters stay float32. Unlike torch, whose step skips a
parameter whose .grad is None, every parameter is stepped (a numpy_tf gradient is never None).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from . import validate
from .core import Module, Parameter
from .embedding import Embedding
from .optimizer import Optimizer, as_parameter_list


# -- the updates ---------------------------------------------------------------------------------
def sgd_update(param: np.ndarray, grad: np.ndarray, momentum_buffer: np.ndarray | None, *,
               lr: float, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False,
               maximize: bool = False) -> np.ndarray | None:
    """One torch.optim.SGD step of `param` (in place); returns the momentum buffer b.

        g = -grad if maximize else grad
        g = g + weight_decay p                     (L2: the decay enters the gradient)
        b = g (a copy)                             on the first step: no dampening
        b = momentum b + (1 - dampening) g         on later steps
        g = g + momentum b  if nesterov,  else g = b
        p = p - lr g

    The buffer is updated in place after the first step; None when momentum is 0.
    """
    g = -grad if maximize else grad
    if weight_decay != 0:
        g = g + weight_decay * param
    if momentum != 0:
        if momentum_buffer is None:
            momentum_buffer = g.copy()
        else:
            momentum_buffer *= momentum
            momentum_buffer += (1.0 - dampening) * g
        g = g + momentum * momentum_buffer if nesterov else momentum_buffer
    param -= lr * g
    return momentum_buffer


def adam_update(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray,
                exp_avg_sq: np.ndarray, max_exp_avg_sq: np.ndarray | None, step: int, *,
                lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False, maximize: bool = False) -> None:
    """One torch.optim.Adam / AdamW step of `param` and its moments m, v (all in place);
    `step` is t, counted from 1 (the step being taken).

        g = -grad if maximize else grad
        p = p (1 - lr weight_decay)        AdamW (decoupled): decay the parameter itself
        g = g + weight_decay p             Adam (L2): decay through the gradient
        m = m + (1 - beta1) (g - m)        = beta1 m + (1 - beta1) g, as torch's lerp
        v = beta2 v + (1 - beta2) g g
        v_max = max(v_max, v)              amsgrad only; then v_max replaces v below
        bias_correction1 = 1 - beta1^t,  bias_correction2 = 1 - beta2^t
        denom = sqrt(v) / sqrt(bias_correction2) + eps
        p = p - (lr / bias_correction1) m / denom

    With m_hat = m / bias_correction1 and v_hat = v / bias_correction2 the step is
    lr m_hat / (sqrt(v_hat) + eps): eps is added after the bias correction, as in Algorithm 1
    of Kingma & Ba and in torch, not to sqrt(v) before it (the paper's faster reformulation,
    where the same eps weighs 1 / sqrt(bias_correction2) times more in the first steps).
    """
    g = -grad if maximize else grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param *= 1.0 - lr * weight_decay
        else:
            g = g + weight_decay * param
    exp_avg += (1.0 - beta1) * (g - exp_avg)
    exp_avg_sq *= beta2
    exp_avg_sq += (1.0 - beta2) * g * g
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    step_size = lr / bias_correction1
    if max_exp_avg_sq is not None:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        denom = np.sqrt(max_exp_avg_sq) / bias_correction2 ** 0.5 + eps
    else:
        denom = np.sqrt(exp_avg_sq) / bias_correction2 ** 0.5 + eps
    param += -step_size * exp_avg / denom


# -- the optimizers ------------------------------------------------------------------------------
class SGD(Optimizer):
    """torch.optim.SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
    nesterov=False, maximize=False). State: "momentum_buffer", when momentum is not 0."""

    OPTIONAL_STATE = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov,
                                  "maximize": maximize})

    def _check(self, hyper: dict, where: str) -> dict:
        checked = {"lr": validate.number(f"{where}lr", hyper["lr"], low=0.0),
                   "momentum": validate.number(f"{where}momentum", hyper["momentum"], low=0.0),
                   "dampening": validate.number(f"{where}dampening", hyper["dampening"]),
                   "weight_decay": validate.number(f"{where}weight_decay", hyper["weight_decay"],
                                                   low=0.0),
                   "nesterov": validate.flag(f"{where}nesterov", hyper["nesterov"]),
                   "maximize": validate.flag(f"{where}maximize", hyper["maximize"])}
        if checked["nesterov"] and (checked["momentum"] <= 0 or checked["dampening"] != 0):
            raise ValueError(f"{where}nesterov=True needs momentum > 0 and dampening 0; got "
                             f"momentum {checked['momentum']}, dampening {checked['dampening']}")
        return checked

    def step(self) -> None:
        for index, parameter, hyper in self._prepared():
            buffer = sgd_update(parameter.data, parameter.grad,
                                self.state.get(index, {}).get("momentum_buffer"), **hyper)
            if buffer is not None:               # plain SGD keeps no state, as torch
                self.state[index] = {"momentum_buffer": buffer}


class Adam(Optimizer):
    """torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False, maximize=False); weight_decay is L2 (added to the gradient). State: "step",
    "exp_avg" (m), "exp_avg_sq" (v), and "max_exp_avg_sq" with amsgrad.

    eps must be > 0 here (torch accepts 0, where a parameter with a zero gradient turns NaN)."""

    REQUIRED_STATE = ("step", "exp_avg", "exp_avg_sq")
    OPTIONAL_STATE = ("max_exp_avg_sq",)
    DECOUPLED = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad,
                                  "maximize": maximize})

    def _check(self, hyper: dict, where: str) -> dict:
        betas = hyper["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{where}betas must be a pair (beta1, beta2); got {betas!r}")
        return {"lr": validate.number(f"{where}lr", hyper["lr"], low=0.0),
                "betas": tuple(validate.number(f"{where}betas[{i}]", beta, low=0.0, high=1.0,
                                               high_open=True) for i, beta in enumerate(betas)),
                "eps": validate.number(f"{where}eps", hyper["eps"], low=0.0, low_open=True),
                "weight_decay": validate.number(f"{where}weight_decay", hyper["weight_decay"],
                                                low=0.0),
                "amsgrad": validate.flag(f"{where}amsgrad", hyper["amsgrad"]),
                "maximize": validate.flag(f"{where}maximize", hyper["maximize"])}

    def _required_state(self, hyper: dict) -> tuple[str, ...]:
        return ("max_exp_avg_sq",) if hyper.get("amsgrad") else ()

    def step(self) -> None:
        for index, parameter, hyper in self._prepared():
            state = self.state.setdefault(index, {})
            if not state:
                state.update(step=0, exp_avg=np.zeros_like(parameter.data),
                             exp_avg_sq=np.zeros_like(parameter.data))
            if hyper["amsgrad"] and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = np.zeros_like(parameter.data)
            state["step"] += 1
            beta1, beta2 = hyper["betas"]
            adam_update(parameter.data, parameter.grad, state["exp_avg"], state["exp_avg_sq"],
                        state["max_exp_avg_sq"] if hyper["amsgrad"] else None, state["step"],
                        lr=hyper["lr"], beta1=beta1, beta2=beta2, eps=hyper["eps"],
                        weight_decay=hyper["weight_decay"],
                        decoupled_weight_decay=self.DECOUPLED, maximize=hyper["maximize"])


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2): each step first
    multiplies the parameter by (1 - lr weight_decay), then takes the Adam step."""

    DECOUPLED = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


def decay_groups(model: Module, weight_decay: float, *,
                 exclude_embeddings: bool = False) -> list[dict]:
    """Two parameter groups for `model`: `weight_decay` on the matrices, 0 on the parameters
    with fewer than 2 dimensions (biases, norm weights) and, with `exclude_embeddings`, on the
    weights of Embedding modules too. Each group carries "param_names" from
    model.named_parameters() (a tied weight once, under its first name); an empty group is
    left out.

        AdamW(decay_groups(model, 0.1), lr=3e-4)
    """
    weight_decay = validate.number("weight_decay", weight_decay, low=0.0)
    embedding_weights = {id(module.weight) for _, module in model.named_modules()
                         if isinstance(module, Embedding)} if exclude_embeddings else set()
    decay = {"params": [], "param_names": [], "weight_decay": weight_decay}
    no_decay = {"params": [], "param_names": [], "weight_decay": 0.0}
    for name, parameter in model.named_parameters():
        exempt = parameter.data.ndim < 2 or id(parameter) in embedding_weights
        group = no_decay if exempt else decay
        group["params"].append(parameter)
        group["param_names"].append(name)
    return [group for group in (decay, no_decay) if group["params"]]


# -- gradient clipping ---------------------------------------------------------------------------
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
    norm_type = validate.number("norm_type", norm_type, low=0.0, low_open=True)
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
