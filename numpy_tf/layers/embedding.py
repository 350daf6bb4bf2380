"""Embedding: a table lookup, exactly torch.nn.Embedding.

Shapes: ids (...) integers in [0, V), W (V, D) -> out (...) + (D,), out[n] = W[ids[n]].
Looking up row j is multiplying the one-hot vector e_j by W, so the gradient of row j is the sum
of the upstream gradients of every position that looked it up.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from ..core.paths import kernels_enabled
from ..kernels.embedding import embedding_backward_into


class EmbeddingCache(NamedTuple):
    ids: np.ndarray             # (...) the looked-up rows
    num_embeddings: int         # V
    padding_idx: int | None
    embedding_dim: int          # D
    dtype: np.dtype             # the weight's, the output's

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return (*self.ids.shape, self.embedding_dim), self.dtype


class EmbeddingKernelCache(EmbeddingCache):
    """An EmbeddingCache whose backward is the kernel's (numpy_tf.kernels.embedding): the same
    fields; Embedding makes it when its forward runs outside reference_path()."""
    __slots__ = ()


def embedding_forward(ids: np.ndarray, weight: np.ndarray, padding_idx: int | None = None):
    validate.integer_array("ids", ids)
    validate.float_array("weight", weight, ndim=2, shape="(V, D)")
    validate.ids_in_range("ids", ids, weight.shape[0])
    out = np.take(weight, ids, axis=0)                              # (..., D)
    return out, EmbeddingCache(ids, weight.shape[0], padding_idx, weight.shape[1], weight.dtype)


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """out[n] = W[ids[n]], so dW[j] = sum over the positions n with ids[n] = j of dout[n].

    A row looked up twice receives both gradients: np.add.at accumulates repeated indices,
    where `dW[ids] += dout` would keep only one of them. The padding row (if any) gets no
    gradient, as in torch. Returns dweight (V, D); integer ids have no gradient.
    """
    validate.backward_inputs(dout, cache, EmbeddingCache)
    ids, num_embeddings, padding_idx, embedding_dim, dtype = cache
    dweight = np.zeros((num_embeddings, embedding_dim), dtype=dtype)          # (V, D)
    np.add.at(dweight, ids.reshape(-1), dout.reshape(-1, dout.shape[-1]))
    if padding_idx is not None:
        dweight[padding_idx] = 0.0
    return dweight


def normal_init(rng: np.random.Generator, shape, std: float, dtype) -> np.ndarray:
    """N(0, std^2) drawn in float64 from `rng`, then cast (so a seed gives the same values in
    every dtype, up to rounding)."""
    return (rng.standard_normal(size=shape) * std).astype(dtype)


class Embedding(Module):
    """torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx). Parameter `weight`
    (V, D), initialised N(0, 1) as torch does (the padding row zeroed). Its backward runs
    kernels.embedding unless the forward ran inside numpy_tf.reference_path()."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 *, rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        num_embeddings = validate.positive_int("num_embeddings", num_embeddings)
        embedding_dim = validate.positive_int("embedding_dim", embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx must be in [-{num_embeddings}, {num_embeddings})"
                                 f"; got {padding_idx}")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.weight = Parameter(normal_init(np.random.default_rng(rng),
                                            (num_embeddings, embedding_dim), 1.0, self.dtype))
        if padding_idx is not None:
            self.weight.data[padding_idx] = 0.0

    def _own_constant_elements(self):
        if self.padding_idx is None:
            return {}
        mask = np.zeros(self.weight.shape, dtype=bool)
        mask[self.padding_idx] = True
        return {"weight": mask}

    def forward(self, ids):
        out, cache = embedding_forward(ids, self.weight.data, self.padding_idx)
        return out, (EmbeddingKernelCache(*cache) if kernels_enabled() else cache)

    def backward(self, dout, cache):
        """Adds into weight.grad; returns None (integer ids have no gradient)."""
        if isinstance(cache, EmbeddingCache):
            validate.cache_fits("weight", ((cache.num_embeddings, cache.embedding_dim),
                                           cache.dtype), self.weight.data)
        if type(cache) is EmbeddingKernelCache:
            validate.backward_inputs(dout, cache, EmbeddingCache)
            embedding_backward_into(self.weight.grad, dout, cache.ids, cache.padding_idx)
        else:
            self.weight.grad += embedding_backward(dout, cache)
        return None
