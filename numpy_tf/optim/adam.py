"""Adam and AdamW with torch.optim's exact semantics (L2 or decoupled weight decay, amsgrad,
maximize). `adam_update` is the formula, operation by operation in the order of torch's
single-tensor (foreach=False) code, so float64 parameters agree with torch to a few ulps; the
classes hold the groups and the state and call it per parameter.

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

import numpy as np

from ..core import validate
from .optimizer import Optimizer


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
