"""Training CBOW word vectors, and saving them with their vocabulary.

    model, vocabulary, losses = train_cbow(text, window=2, dim=16, rng=np.random.default_rng(0))
    save_cbow("cbow.npz", model, vocabulary)      # the words travel with the weights
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.npz import bad_file, from_json_array, json_array, load_npz, save_npz
from ..layers.cross_entropy_loss import cross_entropy
from ..models.cbow import CBOW
from ..optim import Adam
from ..text.datasets import batch_indices, cbow_pairs, is_sentences
from ..text.vocabulary import Vocabulary, words


class CBOWTraining(NamedTuple):
    model: CBOW
    vocabulary: Vocabulary | None   # None when trained on ids without a vocabulary
    losses: np.ndarray              # (epochs,) float64, each the mean over every example


def train_cbow(data, window: int = 2, dim: int = 16, epochs: int = 50, batch_size: int = 16,
               lr: float = 0.01, rng: np.random.Generator | None = None, *,
               vocabulary: Vocabulary | None = None, dtype=np.float64) -> CBOWTraining:
    """Train a CBOW model with Adam on every (context, centre) pair of `data`.

    `data` is a text (its words give the vocabulary, unless `vocabulary` is given) or a 1-D
    sequence of ids (then V is len(vocabulary), or max id + 1 without one), or a list of
    sentences, each a text or a sequence of ids: then every window stays inside its sentence
    (cbow_pairs), and the vocabulary is built from all of them, in order. Positions without
    `window` words on both sides (in their sentence) are skipped; too short a text is an
    error, raised before any work. `rng`, an explicit Generator (required: None is an error),
    draws the initial weights and shuffles the pairs every epoch.

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
    sentences = data if is_sentences(data) else [data]
    texts = [isinstance(sentence, str) for sentence in sentences]
    if any(texts) and not all(texts):
        raise TypeError("data sentences must be all texts or all id sequences; got a mix "
                        f"(sentence {texts.index(not texts[0])} differs from sentence 0)")
    if all(texts):
        tokens = [words(sentence) for sentence in sentences]
        if vocabulary is None:
            vocabulary = Vocabulary.build([token for sentence in tokens for token in sentence])
        sequences = [vocabulary.encode(sentence) for sentence in tokens]
    else:
        size = None if vocabulary is None else len(vocabulary)
        names = ["data"] if len(sentences) == 1 and sentences[0] is data else \
            [f"data[{index}]" for index in range(len(sentences))]
        sequences = [validate.token_ids(name, sentence, size=size)
                     for name, sentence in zip(names, sentences)]
    pairs = cbow_pairs(sequences, window)
    pairs.check_nonempty()
    vocab_size = len(vocabulary) if vocabulary is not None else \
        max(int(ids.max()) for ids in sequences if len(ids)) + 1

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
    """The model and vocabulary `save_cbow` wrote; names, shapes and dtypes checked strictly.
    A file that is not one is a FileFormatError naming it and what is wrong."""
    arrays = load_npz(path)
    meta = from_json_array(arrays.pop("meta"), path, "meta", dict) if "meta" in arrays else {}
    if meta.get("format") != FORMAT:
        raise bad_file(path, "not a CBOW file written by save_cbow", f"meta format {FORMAT!r}",
                       repr(meta.get("format")))
    state = {key[len("param/"):]: value for key, value in arrays.items()
             if key.startswith("param/")}
    weight = state.get("embeddings.weight")
    if weight is None or weight.ndim != 2 or weight.dtype not in (np.float32, np.float64):
        raise bad_file(path, "holds no usable param/embeddings.weight", "a float (V, D) array",
                       "none" if weight is None else f"shape {weight.shape} dtype {weight.dtype}")
    words = meta.get("words")
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise bad_file(path, "meta['words'] is not a list of words", "a list of strings",
                       type(words).__name__)
    try:
        model = CBOW(weight.shape[0], weight.shape[1], dtype=weight.dtype)
        model.load_state_dict(state)
        vocabulary = Vocabulary(words)
    except (ValueError, TypeError) as error:
        raise bad_file(path, f"does not hold a CBOW model ({error})") from None
    if len(vocabulary) != model.vocab_size:
        raise bad_file(path, "has a word list that does not fit the embedding rows",
                       f"{model.vocab_size} words", len(vocabulary))
    if not np.isfinite(weight).all():
        raise bad_file(path, "param/embeddings.weight holds NaN or infinite values",
                       "finite weights", f"{int((~np.isfinite(weight)).sum())} non-finite")
    return model, vocabulary
