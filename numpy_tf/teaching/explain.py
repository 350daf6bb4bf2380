"""A layer's forward and backward, read in the terminal: `numpy-tf explain layernorm`.

Prints, from numpy_tf's own source (inspect.getsource): the family file's docstring (what the
layer computes, its shape legend), the cache NamedTuple (what forward keeps for backward), the
forward, and the backward, whose docstring is the derivation in the code's own symbols. With
side_by_side=True the cache and forward fill the left column and the backward the right one.
"""
from __future__ import annotations

import inspect
import shutil

from .layer_table import LayerSpec, layer


def _rule(title: str, width: int) -> str:
    title = f"-- {title} "
    return title + "-" * max(0, width - len(title))


def _wrapped(lines: list[str], width: int) -> list[str]:
    """Lines cut to `width`, a cut line continuing under a `  ` indent."""
    out = []
    for line in lines:
        while len(line) > width:
            out.append(line[:width])
            line = "  " + line[width:]
        out.append(line)
    return out


def _parts(spec: LayerSpec) -> tuple[list[str], list[str]]:
    """(forward column, backward column) as lines."""
    left = []
    if spec.cache is not None:
        left += ["# the cache: what forward keeps for backward"] + \
            inspect.getsource(spec.cache).rstrip().splitlines() + [""]
    left += ["# forward"] + inspect.getsource(spec.forward).rstrip().splitlines()
    right = ["# backward: its docstring is the derivation, in the code's symbols"] + \
        inspect.getsource(spec.backward).rstrip().splitlines()
    return left, right


def explain(name: str, side_by_side: bool = False, width: int | None = None) -> str:
    """The text `numpy-tf explain NAME` prints. Unknown name: ValueError listing the known."""
    spec = layer(name)
    width = width or shutil.get_terminal_size((100, 24)).columns
    path = "/".join(spec.module.__name__.split(".")) + ".py"       # numpy_tf/layers/norm.py
    header = [_rule(f"{name}: {path}", width)]
    header += (inspect.getdoc(spec.module) or "").splitlines() + [""]
    left, right = _parts(spec)
    if side_by_side:
        column = max(20, (width - 3) // 2)
        left, right = _wrapped(left, column), _wrapped(right, column)
        right += [""] * (len(left) - len(right))
        left += [""] * (len(right) - len(left))
        body = [f"{a.ljust(column)} | {b}".rstrip() for a, b in zip(left, right)]
    else:
        body = left + [""] + right
    footer = ["", f"check it: numpy-tf gradcheck {name}    practise it: numpy-tf assignment "
              f"{name} -o {name}_homework.py"]
    return "\n".join(header + body + footer)
