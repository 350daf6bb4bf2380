"""A picture of the activations and their derivatives, GELU (exact and tanh) and SiLU with ReLU
for reference, each computed by numpy_tf's own forward and backward.

For an elementwise function y = f(x), backward(dout, cache) returns dout f'(x), so an upstream
gradient of ones gives the derivative itself at every x.

    plot_activations(path="activations.png")
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from ..layers.activations import (gelu_backward, gelu_forward, relu_backward, relu_forward,
                                  silu_backward, silu_forward)
from .figure import check_path, finish, new_figure


def activation_curves(x: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name: (f(x), f'(x))} for each activation, from its forward and its backward."""
    layers = {
        "GELU": (lambda x: gelu_forward(x), gelu_backward),
        "GELU (tanh)": (lambda x: gelu_forward(x, approximate="tanh"), gelu_backward),
        "SiLU": (silu_forward, silu_backward),
        "ReLU": (relu_forward, relu_backward),
    }
    curves = {}
    for name, (forward, backward) in layers.items():
        out, cache = forward(x)
        curves[name] = (out, backward(np.ones_like(x), cache))       # dout = 1: f'(x) itself
    return curves


def plot_activations(low: float = -4.0, high: float = 4.0, *, path=None):
    """Left: GELU, its tanh approximation, SiLU and ReLU on [low, high]. Right: their
    derivatives, from each backward. Returns the Figure (two axes); saves it to `path` if
    given (.png or .svg)."""
    path = check_path(path)
    low, high = validate.number("low", low), validate.number("high", high)
    if not low < high:
        raise ValueError(f"low must be below high; got low={low}, high={high}")
    x = np.linspace(low, high, 801)
    curves = activation_curves(x)
    styles = {"GELU": ("tab:blue", "-"), "GELU (tanh)": ("tab:cyan", ":"),
              "SiLU": ("tab:orange", "-"), "ReLU": ("0.55", "--")}
    gap = float(np.abs(curves["GELU"][0] - curves["GELU (tanh)"][0]).max())
    labels = {"GELU (tanh)": f"GELU (tanh), within {gap:.1e} of GELU"}
    figure = new_figure(10.0, 4.0)
    left, right = figure.subplots(1, 2)
    for name, (value, slope) in curves.items():
        color, line = styles[name]
        left.plot(x, value, color=color, linestyle=line, linewidth=1.6,
                  label=labels.get(name, name))
        right.plot(x, slope, color=color, linestyle=line, linewidth=1.6, label=name)
    for axes, title in ((left, "f(x), from the forward"),
                        (right, "f'(x), from the backward (dout = 1)")):
        axes.axhline(0.0, color="0.8", linewidth=0.8, zorder=0)
        axes.axvline(0.0, color="0.8", linewidth=0.8, zorder=0)
        axes.set_xlabel("x")
        axes.set_title(title)
        axes.grid(alpha=0.3)
    left.set_ylabel("f(x)")
    right.set_ylabel("f'(x)")
    left.legend()
    return finish(figure, path)
