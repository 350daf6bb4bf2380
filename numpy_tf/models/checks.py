"""The checks a model makes at its edges (SPEC §8), shared by every model: the shape and dtype
its logits' gradient must have (a model cache's `output_spec`, read by
validate.backward_inputs) and the KV cache its forward is given.
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from ..layers.linear import LinearCache


def head_spec(head: LinearCache) -> tuple[tuple, np.dtype]:
    """The (shape, dtype) of the logits a head (a Linear whose cache is `head`) produced:
    what a model cache's `output_spec` gives, and so what `dlogits` must be exactly (a
    (T, B, V) or (B*T, V) array is refused by validate.backward_inputs, not reshaped)."""
    return head.x.shape[:-1] + (head.weight.shape[0],), head.x.dtype


def past_kv(past, layers: int, *, batch: int, heads: int, head_dim: int, dtype,
            legend: str = "B, H, P, d", name: str = "past_kv") -> int:
    """None (no earlier positions: P = 0), or one (k, v) per layer, each (B, heads, P, d) of
    the model's dtype with the same P in every layer. Returns P."""
    if past is None:
        return 0
    if not isinstance(past, (list, tuple)):
        raise TypeError(f"{name} must be a list with one (k, v) per layer (the `present` of "
                        f"an earlier call); got {type(past).__name__}")
    if len(past) != layers:
        raise ValueError(f"{name} must hold one (k, v) per layer ({layers}); got {len(past)}")
    length = None
    for index, pair in enumerate(past):
        length = validate.kv_cache(f"{name}[{index}]", pair, batch=batch, heads=heads,
                                   head_dim=head_dim, dtype=dtype, length=length,
                                   legend=legend)
    return 0 if length is None else length
