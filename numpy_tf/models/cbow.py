"""CBOW, the continuous bag of words of word2vec: predict a centre word from its 2c neighbours.

Shapes: N examples, 2c context words each, vocabulary V, embedding width D.

    contexts (N, 2c) ids -> E[contexts] (N, 2c, D) -> mean over the context axis h (N, D)
        -> Linear h W^T + b (N, V) logits -> cross-entropy against the centres (N,)

The mean forgets the order of the context: swapping two context words leaves h, and so the
prediction, unchanged. That is the model's known limit (it is not a language model; it does not
predict the next word), and also why the learned rows of E are word vectors: words that occur
among the same neighbours are pushed towards the same place.

The vocabulary is built from the training text, one id per distinct word in order of first
occurrence, so ids depend only on the text; it is saved with the weights (`save_cbow`), because
a model's rows mean nothing without it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..layers.embedding import Embedding, EmbeddingCache, embedding_backward, embedding_forward
from ..layers.linear import Linear, LinearCache
from ..text.vocabulary import Vocabulary
from . import checks
from .resize import check_new_size, normal, resize_embedding, resize_head, uniform


# -- the averaging step -----------------------------------------------------------------------
class CBOWMeanCache(NamedTuple):
    embedding: EmbeddingCache   # the (N, 2c) context ids looked up
    context_size: int           # 2c, the divisor of the mean


def cbow_forward(contexts: np.ndarray, weight: np.ndarray):
    """h_n = (1 / 2c) sum_j E[contexts[n, j]]: contexts (N, 2c) ids, E (V, D) -> h (N, D)."""
    validate.integer_array("contexts", contexts, ndim=2, shape="(N, 2c)")
    if contexts.shape[1] == 0:
        raise ValueError(f"contexts must hold at least one context word per row (N, 2c); got "
                         f"shape {contexts.shape}")
    looked_up, embedding = embedding_forward(contexts, weight)      # (N, 2c, D)
    mean = looked_up.mean(axis=1)                                    # (N, D)
    return mean, CBOWMeanCache(embedding, contexts.shape[1])


def cbow_backward(dmean: np.ndarray, cache: CBOWMeanCache) -> np.ndarray:
    """With e_nj = E[contexts[n, j]] and h_n = (1 / 2c) sum_j e_nj, every context word of row n
    receives the same share of the gradient:

        dL/de_nj = dL/dh_n / 2c                      for j = 1 .. 2c

    and the lookup's backward sums those shares into the rows they came from,
    dE[v] = sum over (n, j) with contexts[n, j] = v of dL/de_nj; a word repeated in a context
    (or in several rows) gets one share per occurrence (np.add.at in embedding_backward).
    Returns dweight (V, D); integer ids have no gradient.
    """
    embedding, context_size = cache
    dshare = dmean / context_size                                        # (N, D)
    dlooked_up = np.broadcast_to(dshare[:, None, :],                     # (N, 2c, D)
                                 (dshare.shape[0], context_size, dshare.shape[1]))
    return embedding_backward(dlooked_up, embedding)


class CBOWCache(NamedTuple):
    mean: CBOWMeanCache         # the context ids looked up and averaged
    output: LinearCache         # its x is h (N, D)

    @property
    def output_spec(self):      # the (shape, dtype) of the logits (N, V): dlogits's
        return checks.head_spec(self.output)


class CBOW(Module):
    """`embeddings` (Embedding (V, D), N(0, 1) as torch) and `output` (Linear D -> V with bias):
    parameters `embeddings.weight`, `output.weight`, `output.bias`.
    forward(contexts (N, 2c) ids) -> (logits (N, V), cache); backward(dlogits, cache) -> None."""

    def __init__(self, vocab_size: int, dim: int, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        vocab_size = validate.positive_int("vocab_size", vocab_size)
        dim = validate.positive_int("dim", dim)
        rng = np.random.default_rng(rng)
        self.embeddings = Embedding(vocab_size, dim, rng=rng, dtype=dtype)
        self.output = Linear(dim, vocab_size, rng=rng, dtype=dtype)

    @property
    def vocab_size(self) -> int:
        return self.embeddings.weight.shape[0]

    def resize_token_embeddings(self, new_num_tokens: int, *,
                                rng: np.random.Generator) -> None:
        """The vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): the new
        rows of `embeddings` N(0, 1), of `output` (weight and bias) U(+-1/sqrt(D)), from
        `rng`, as torch's Embedding and Linear draw them."""
        n = check_new_size(new_num_tokens)
        rng = validate.generator("rng", rng)
        resize_embedding(self.embeddings, n, normal(rng, 1.0, self.dtype))
        head = uniform(rng, self.embeddings.weight.shape[1], self.dtype)
        resize_head(self.output, n, head, head)

    def forward(self, contexts):
        """contexts (N, 2c) ids -> logits (N, V): the mean of the context rows, then the head."""
        mean, mean_cache = cbow_forward(contexts, self.embeddings.weight.data)     # (N, D)
        logits, output = self.output.forward(mean)                                 # (N, V)
        return logits, CBOWCache(mean_cache, output)

    def backward(self, dlogits, cache: CBOWCache):
        """The forward in exact reverse; returns None (integer ids have no gradient).
        dlogits must have exactly the logits' shape (N, V) and dtype."""
        validate.backward_inputs(dlogits, cache, CBOWCache, "dlogits")
        dmean = self.output.backward(dlogits, cache.output)             # logits = output(mean)
        dweight = cbow_backward(dmean, cache.mean)          # mean = cbow_forward(contexts, E)
        self.embeddings.weight.grad += dweight
        return None


# -- what the trained rows say ------------------------------------------------------------
def nearest(model: CBOW, vocabulary: Vocabulary, word: str, k: int = 5) -> list[tuple[str, float]]:
    """The k words whose embedding rows have the largest cosine similarity to `word`'s, best
    first, as (word, similarity); the word itself is left out (its similarity is always 1).
    Ties go to the smaller id. A zero row has similarity 0 to everything."""
    validate.module("model", model, CBOW, "a numpy_tf CBOW")
    validate.module("vocabulary", vocabulary, Vocabulary, "a numpy_tf Vocabulary")
    if not isinstance(word, str):
        raise TypeError(f"word must be a str; got {type(word).__name__}")
    if len(vocabulary) != model.vocab_size:
        raise ValueError(f"vocabulary has {len(vocabulary)} words but the model's embeddings "
                         f"have {model.vocab_size} rows; they do not belong together")
    k = validate.positive_int("k", k)
    if k > len(vocabulary) - 1:
        raise ValueError(f"k must be at most {len(vocabulary) - 1} (the other words of the "
                         f"vocabulary); got {k}")
    index = vocabulary.id(word)
    vectors = model.embeddings.weight.data.astype(np.float64)                   # (V, D)
    norms = np.linalg.norm(vectors, axis=1)                                     # (V,)
    safe = np.where(norms > 0, norms, 1.0)
    similarity = vectors @ vectors[index] / (safe * safe[index])               # (V,)
    similarity[index] = -np.inf                                                 # never itself
    order = np.argsort(-similarity, kind="stable")[:k]
    return [(vocabulary.tokens[i], float(similarity[i])) for i in order]
