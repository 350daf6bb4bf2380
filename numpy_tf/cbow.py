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

import re
from typing import NamedTuple, Sequence

import numpy as np

from . import validate
from .core import Module
from .data import batch_indices, cbow_pairs
from .embedding import Embedding, EmbeddingCache, embedding_backward, embedding_forward
from .linear import Linear, LinearCache
from .loss import cross_entropy
from .npz import from_json_array, json_array, load_npz, save_npz
from .optim import Adam


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
    mean: CBOWMeanCache
    output: LinearCache         # its x is h (N, D)


class CBOW(Module):
    """`embeddings` (Embedding (V, D), N(0, 1) as torch) and `output` (Linear D -> V with bias):
    parameters `embeddings.weight`, `output.weight`, `output.bias`.
    forward(contexts (N, 2c) ids) -> (logits (N, V), cache); backward(dlogits, cache) -> None."""

    def __init__(self, vocab_size: int, dim: int, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        self.embeddings = Embedding(vocab_size, dim, rng=rng, dtype=dtype)
        self.output = Linear(dim, vocab_size, rng=rng, dtype=dtype)

    @property
    def vocab_size(self) -> int:
        return self.embeddings.weight.shape[0]

    def forward(self, contexts):
        mean, mean_cache = cbow_forward(contexts, self.embeddings.weight.data)     # (N, D)
        logits, output = self.output.forward(mean)                                 # (N, V)
        return logits, CBOWCache(mean_cache, output)

    def backward(self, dlogits, cache: CBOWCache):
        dmean = self.output.backward(dlogits, cache.output)                        # (N, D)
        self.embeddings.weight.grad += cbow_backward(dmean, cache.mean)
        return None


# -- the word vocabulary ----------------------------------------------------------------------
WORD_PATTERN = re.compile(r"\w+(?:'\w+)*")


def words(text: str) -> list[str]:
    """`text` lower-cased and cut into words (runs of letters, digits and "_", with inner
    apostrophes: "don't"); punctuation and whitespace are dropped. So "Football" and "football"
    are one word, and text without spaces between words (Chinese) is not split into words."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str; got {type(text).__name__}")
    return WORD_PATTERN.findall(text.lower())


class Vocabulary:
    """Distinct words and their ids: word i has id i. `Vocabulary.build(tokens)` numbers words
    in order of first occurrence, so the same text always gives the same ids. A word that is
    not in the vocabulary is an error (there is no <unk> row to fall back on)."""

    def __init__(self, tokens: Sequence[str]):
        if isinstance(tokens, str):
            raise TypeError(f"tokens must be a sequence of words, not one string; got "
                            f"{tokens[:80]!r}")
        self.tokens = tuple(tokens)
        if not all(isinstance(token, str) and token for token in self.tokens):
            raise TypeError("tokens must be non-empty strings; got "
                            f"{str(self.tokens)[:80]}")
        self._ids = {token: index for index, token in enumerate(self.tokens)}
        if len(self._ids) != len(self.tokens):
            repeated = next(t for t in self.tokens if self.tokens.count(t) > 1)
            raise ValueError(f"tokens must be distinct; {repeated!r} appears "
                             f"{self.tokens.count(repeated)} times")

    @classmethod
    def build(cls, tokens: Sequence[str]) -> "Vocabulary":
        return cls(list(dict.fromkeys(tokens)))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token) -> bool:
        return token in self._ids

    def id(self, token: str) -> int:
        if token not in self._ids:
            raise ValueError(f"word {token!r} is not in the vocabulary ({len(self)} words "
                             "built from the training text)")
        return self._ids[token]

    def encode(self, tokens: Sequence[str]) -> np.ndarray:
        """(len(tokens),) int64 ids; the first unknown word is an error naming it and where."""
        for position, token in enumerate(tokens):
            if token not in self._ids:
                raise ValueError(f"word {token!r} at position {position} is not in the "
                                 f"vocabulary ({len(self)} words)")
        return np.array([self._ids[token] for token in tokens], dtype=np.int64)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} words: {', '.join(self.tokens[:8])}" + \
            (", ...)" if len(self) > 8 else ")")


# -- training -----------------------------------------------------------------------------------
class CBOWTraining(NamedTuple):
    model: CBOW
    vocabulary: Vocabulary | None   # None when trained on ids without a vocabulary
    losses: np.ndarray              # (epochs,) float64, each the mean over every example


def train_cbow(data, window: int = 2, dim: int = 16, epochs: int = 50, batch_size: int = 16,
               lr: float = 0.01, rng: np.random.Generator | None = None, *,
               vocabulary: Vocabulary | None = None, dtype=np.float64) -> CBOWTraining:
    """Train a CBOW model with Adam on every (context, centre) pair of `data`.

    `data` is a text (its words give the vocabulary, unless `vocabulary` is given) or a 1-D
    sequence of ids (then V is len(vocabulary), or max id + 1 without one). Positions without
    `window` words on both sides are skipped; too short a text is an error, raised before any
    work. `rng`, an explicit Generator (required: None is an error), draws the initial weights
    and shuffles the pairs every epoch.

    The loss of an epoch is the mean over EVERY pair: each batch's mean is weighted by its
    number of pairs, so a smaller last batch counts for what it holds (the plain mean of the
    batch means would over-weight it). It is measured on the fly, with the weights before each
    step. A non-finite loss stops training with an error.
    """
    window = validate.positive_int("window", window)
    dim = validate.positive_int("dim", dim)
    epochs = validate.positive_int("epochs", epochs)
    batch_size = validate.positive_int("batch_size", batch_size)
    lr = validate.number("lr", lr, low=0.0)
    rng = validate.generator("rng", rng)
    if isinstance(data, str):
        tokens = words(data)
        vocabulary = Vocabulary.build(tokens) if vocabulary is None else vocabulary
        ids = vocabulary.encode(tokens)
    else:
        ids = validate.token_ids("data", data, size=None if vocabulary is None else
                                 len(vocabulary))
    pairs = cbow_pairs(ids, window)
    pairs.check_nonempty()
    vocab_size = len(vocabulary) if vocabulary is not None else int(ids.max()) + 1

    model = CBOW(vocab_size, dim, rng=rng, dtype=dtype)
    optimizer = Adam(model.parameters(), lr=lr)
    count = len(pairs.centres)
    losses = np.zeros(epochs)
    for epoch in range(epochs):
        total = 0.0
        for batch in batch_indices(count, batch_size, rng):
            logits, cache = model.forward(pairs.contexts[batch])               # (B, V)
            loss, dlogits = cross_entropy(logits, pairs.centres[batch])
            if not np.isfinite(loss):
                raise FloatingPointError(f"CBOW loss is {float(loss)} in epoch {epoch}; "
                                         f"training stopped (try a smaller lr than {lr})")
            optimizer.zero_grad()
            model.backward(dlogits, cache)
            optimizer.step()
            total += float(loss) * len(batch)
        losses[epoch] = total / count
    return CBOWTraining(model, vocabulary, losses)


def nearest(model: CBOW, vocabulary: Vocabulary, word: str, k: int = 5) -> list[tuple[str, float]]:
    """The k words whose embedding rows have the largest cosine similarity to `word`'s, best
    first, as (word, similarity); the word itself is left out (its similarity is always 1).
    Ties go to the smaller id. A zero row has similarity 0 to everything."""
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


# -- saving: the weights and the vocabulary in one file -------------------------------------
FORMAT = "numpy_tf cbow 1"


def save_cbow(path, model: CBOW, vocabulary: Vocabulary) -> None:
    """One .npz (no pickle, written atomically): `meta` (JSON: format, dtype, the words in id
    order) and `param/<name>` for every parameter."""
    if len(vocabulary) != model.vocab_size:
        raise ValueError(f"vocabulary has {len(vocabulary)} words but the model has "
                         f"{model.vocab_size} rows")
    meta = {"format": FORMAT, "dtype": model.dtype.name, "words": list(vocabulary.tokens)}
    save_npz(path, {"meta": json_array(meta),
                    **{f"param/{name}": value for name, value in model.state_dict().items()}})


def load_cbow(path) -> tuple[CBOW, Vocabulary]:
    """The model and vocabulary `save_cbow` wrote; names, shapes and dtypes checked strictly."""
    arrays = load_npz(path)
    meta = from_json_array(arrays.pop("meta")) if "meta" in arrays else {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a CBOW file written by save_cbow (format "
                         f"{meta.get('format')!r}, expected {FORMAT!r})")
    state = {key[len("param/"):]: value for key, value in arrays.items()
             if key.startswith("param/")}
    weight = state.get("embeddings.weight")
    if weight is None or weight.ndim != 2:
        raise ValueError(f"{path} holds no 2-D param/embeddings.weight")
    model = CBOW(weight.shape[0], weight.shape[1], dtype=weight.dtype)
    model.load_state_dict(state)
    vocabulary = Vocabulary(meta.get("words", []))
    if len(vocabulary) != model.vocab_size:
        raise ValueError(f"{path}: {len(vocabulary)} words for {model.vocab_size} rows")
    return model, vocabulary
