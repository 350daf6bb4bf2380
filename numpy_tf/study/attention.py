"""Looking inside a forward pass: the attention probabilities every layer computed.

Every attention layer keeps its probabilities P (B, H, Tq, Tk) in its cache (they are what its
backward needs), so a model's cache already holds every layer's attention map:

    logits, cache = model.forward(ids)
    maps = attention_maps(cache)             # one (B, H, Tq, Tk) array per attention layer
    maps[3][0, 5]                            # layer 3, head 5: row i is where query i looked
"""
from __future__ import annotations

import numpy as np

from ..layers.attention import AttentionCache


def attention_maps(cache) -> list[np.ndarray]:
    """Every attention layer's probabilities, in forward order (a decoder layer's self-
    attention before its cross-attention), found by walking the nested cache."""
    found: list[np.ndarray] = []

    def walk(node) -> None:
        if isinstance(node, AttentionCache):
            found.append(node.probs)
        elif isinstance(node, (tuple, list)):
            for item in node:
                walk(item)

    walk(cache)
    return found


def format_attention(probs: np.ndarray, tokens: list[str], top: int = 3) -> str:
    """A (Tq, Tk) map as text: for each query token, its `top` most attended keys."""
    lines = []
    for i, row in enumerate(probs):
        best = np.argsort(-row, kind="stable")[:top]
        keys = ", ".join(f"{tokens[j]!r} {row[j]:.2f}" for j in best if row[j] > 0)
        lines.append(f"{i:>3} {tokens[i]!r:>16} -> {keys}")
    return "\n".join(lines)
