"""Counting parameters: exact counts from a model, and the seed material's rule of thumb.

Per block of width d with a 4d feed-forward, attention has four d x d projections (4 d^2) and the
feed-forward two d x 4d matrices (8 d^2): about 12 d^2 per block, the biases and norms adding
only O(d). The tiny GPT's block (no attention biases) has exactly 12 d^2 + 9 d: its FFN biases
(4d + d) and two LayerNorms (4d).
"""
from __future__ import annotations

from collections import OrderedDict

from .core import Module


def count_parameters(model: Module) -> int:
    """Trainable scalars, a tied Parameter counted once (as torch's sum over parameters())."""
    return model.num_parameters()


def parameter_breakdown(model: Module) -> "OrderedDict[str, int]":
    """Counts per top-level component (`tokens`, `blocks.0`, ..., `output`), in model order; a
    tied Parameter is counted under the first name that reaches it."""
    groups: OrderedDict[str, int] = OrderedDict()
    for name, parameter in model.named_parameters():
        parts = name.split(".")
        key = ".".join(parts[:2] if parts[1:2] and parts[1].isdigit() else parts[:1])
        groups[key] = groups.get(key, 0) + parameter.size
    return groups


def block_estimate(width: int) -> int:
    """The 12 d^2 per-block approximation."""
    return 12 * width * width
