"""SGD with torch.optim.SGD's exact semantics: momentum, dampening, Nesterov, weight decay,
maximize. `sgd_update` is the formula, operation by operation in the order of torch's
single-tensor (foreach=False) code; `SGD` holds the groups and the state and calls it per
parameter. Parameters are updated in place and keep their dtype (every scalar is a Python float).

    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad(); ...backward...; optimizer.step()
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from .optimizer import Optimizer


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
