"""Growing (or shrinking) a model's vocabulary: what every model's resize_token_embeddings does.

A vocabulary of V tokens is the rows of the token embedding (V, d) and of the output head's
weight (V, d) and bias (V,). Resizing to n tokens keeps rows 0 .. min(V, n) - 1 exactly (so
every existing id means what it meant: a tokenizer that added tokens after its vocabulary, as
BPETokenizer.add_special_tokens does, fits the grown model), drops the rows from n on, and
draws rows V .. n - 1 as the model draws a fresh table, from the Generator given (the
embedding's new rows first, then the head's). A head tied to the embedding is the same
Parameter: it is resized once and stays tied.

The resized weights are new Parameters (their gradients start at zero), so an optimizer built
before resizing holds the old ones: build it after. The model's config records the new size,
so a checkpoint saved afterwards rebuilds the resized model.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core import validate
from ..core.module import Parameter
from ..layers.embedding import Embedding, normal_init
from ..layers.linear import Linear, uniform_init

Draw = Callable[[tuple], np.ndarray]        # shape -> new values (any float dtype)


def check_new_size(new_num_tokens, pad_token_id: int | None = None) -> int:
    """A positive number of tokens that keeps the padding row (if any)."""
    new_num_tokens = validate.positive_int("new_num_tokens", new_num_tokens)
    if pad_token_id is not None and pad_token_id >= new_num_tokens:
        raise ValueError(f"new_num_tokens must be above pad_token_id = {pad_token_id} (the "
                         f"padding row is kept); got {new_num_tokens}")
    return new_num_tokens


def resized(array: np.ndarray, n: int, draw: Draw) -> np.ndarray:
    """The first min(V, n) rows of `array` (V, ...), then n - V rows from `draw`."""
    kept = array[:n].copy()
    if n <= len(array):
        return kept
    new = draw((n - len(array), *array.shape[1:])).astype(array.dtype)
    return np.concatenate([kept, new])


def resize_embedding(embedding: Embedding, n: int, draw: Draw) -> None:
    """The table (V, d) -> (n, d); its padding row (kept, below n) stays zero and untrained."""
    embedding.weight = Parameter(resized(embedding.weight.data, n, draw))


def resize_head(head: Linear, n: int, draw_weight: Draw, draw_bias: Draw | None = None,
                tied_to: Embedding | None = None) -> None:
    """The head's out_features V -> n: its weight's rows (or the tied embedding's Parameter,
    already resized) and its bias."""
    if tied_to is not None:
        head.weight = tied_to.weight
    else:
        head.weight = Parameter(resized(head.weight.data, n, draw_weight))
    if head.bias is not None:
        head.bias = Parameter(resized(head.bias.data, n, draw_bias))
    head.out_features = n


def normal(rng: np.random.Generator, std: float, dtype) -> Draw:
    """N(0, std^2) rows, as numpy_tf.layers.embedding.normal_init draws a table."""
    return lambda shape: normal_init(rng, shape, std, dtype)


def uniform(rng: np.random.Generator, fan_in: int, dtype) -> Draw:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) rows: torch.nn.Linear's default initialisation."""
    return lambda shape: uniform_init(rng, shape, fan_in, dtype)


def zeros(dtype) -> Draw:
    return lambda shape: np.zeros(shape, dtype)
