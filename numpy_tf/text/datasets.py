"""Datasets for training: next-token windows of a token stream, held-out splits, mini-batches,
CBOW pairs, a digit-reversal task for the encoder-decoder, masked-language-model inputs for the
encoder (`mask_tokens`).

Next-token windows. With N token ids, context L and stride k > 0, window j starts at s = j*k and
holds

    inputs  = ids[s     : s + L]
    targets = ids[s + 1 : s + L + 1]        (the inputs shifted by one: the next token)

Both come from real text only when s + L <= N - 1, so there are

    max(0, floor((N - L - 1) / k) + 1)      windows      (N=10, L=4, k=2: 3; N=9: 3; N=L: 0)

`pad_last=True` adds one more window at the next stride position s when the full windows
leave tokens at the end that are never a target and s + 1 < N (so it has a real target): its
inputs run past the text and are filled with `pad_id`, and its targets past the text are
`ignore_index` (-100, the cross-entropy's default), so the loss never teaches the model to
predict padding. (The padded inputs come after every
real position, so a causal model's real positions never see them.) The targets here are
ALREADY shifted: give them straight to the loss with the logits, not to a model that shifts its
labels again.

Held-out text must be split off BEFORE windowing (`split_stream`, `split_documents`): windows
overlap, so windows drawn at random into a test set share their tokens with training windows.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np

from ..core import validate

IGNORE_INDEX = -100        # the cross-entropy's default ignore_index


def window_count(num_tokens: int, context: int, stride: int) -> int:
    """The number of windows whose inputs and targets are all real text."""
    num_tokens = validate.non_negative_int("num_tokens", num_tokens)
    context = validate.positive_int("context", context)
    stride = validate.positive_int("stride", stride)
    return max(0, (num_tokens - context - 1) // stride + 1)


def batch_indices(count: int, batch_size: int, rng: np.random.Generator | None = None,
                  drop_last: bool = False) -> Iterator[np.ndarray]:
    """Index arrays covering range(count) in batches of `batch_size`: in order without `rng`,
    in the order of rng.permutation(count) with one. The last batch is smaller unless
    `drop_last`. Arguments are checked here, before the first batch is asked for."""
    count = validate.integer("count", count)
    batch_size = validate.positive_int("batch_size", batch_size)
    rng = validate.generator("rng", rng, allow_none=True)
    order = np.arange(count) if rng is None else rng.permutation(count)
    stop = count - count % batch_size if drop_last else count
    return (order[start:start + batch_size] for start in range(0, stop, batch_size))


class SlidingWindowDataset:
    """Next-token windows of one token stream (see the module docstring).

    dataset[j] -> (inputs (L,), targets (L,)) int64; len(dataset) counts the windows.
    `stride` defaults to `context` (windows side by side: each token is a target once)."""

    def __init__(self, ids, context: int, stride: int | None = None, *, pad_last: bool = False,
                 pad_id: int = 0, ignore_index: int = IGNORE_INDEX):
        ids = validate.token_ids("ids", ids)
        context = validate.positive_int("context", context)
        stride = context if stride is None else validate.positive_int("stride", stride)
        pad_id = validate.integer("pad_id", pad_id)
        if pad_id < 0:
            raise ValueError(f"pad_id must be a non-negative token id; got {pad_id}")
        ignore_index = validate.integer("ignore_index", ignore_index)
        self.ids, self.context, self.stride = ids, context, stride
        self.pad_last, self.pad_id, self.ignore_index = bool(pad_last), pad_id, ignore_index

        num_tokens = len(ids)
        full = window_count(num_tokens, context, stride)
        starts = np.arange(full, dtype=np.int64) * stride
        last_target = (full - 1) * stride + context if full else 0   # last index used as target
        next_start = full * stride
        if pad_last and next_start <= num_tokens - 2 and last_target < num_tokens - 1:
            starts = np.append(starts, next_start)
        self.starts = starts                                          # (W,) window starts
        # Windows are slices of these two arrays; only the padded window reaches the fill.
        self._inputs = np.concatenate([ids, np.full(context, pad_id, dtype=np.int64)])
        self._targets = np.concatenate([ids[1:], np.full(context + 1, ignore_index,
                                                         dtype=np.int64)])

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Window `index` (negative counts from the end). Out of range is an IndexError, as for
        every Python sequence, so that `for` and `list()` stop where they should."""
        index = validate.integer("index", index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index must be in [-{len(self)}, {len(self)}) for "
                             f"{len(self)} windows; got {index}")
        inputs, targets = self.windows(np.array([index % len(self)]))
        return inputs[0], targets[0]

    def windows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows at `indices` stacked: (inputs (B, L), targets (B, L)) int64."""
        positions = self.starts[indices][:, None] + np.arange(self.context)   # (B, L)
        return self._inputs[positions], self._targets[positions]

    def check_nonempty(self) -> None:
        """A clear error instead of a training loop that silently does nothing."""
        if len(self) == 0:
            need = "at least 2 tokens with pad_last=True" if self.pad_last else \
                f"at least context + 1 = {self.context + 1} tokens (or pad_last=True)"
            raise ValueError(f"no training windows: {len(self.ids)} tokens with context "
                             f"{self.context}; next-token windows need {need}")

    def batches(self, batch_size: int, rng: np.random.Generator | None = None,
                drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(inputs (B, L), targets (B, L)) int64 batches over every window, shuffled only when
        an explicit Generator `rng` is given. An empty result is an error, raised here."""
        indices = batch_indices(len(self), batch_size, rng, drop_last)
        self.check_nonempty()
        if drop_last and len(self) < batch_size:
            raise ValueError(f"drop_last=True with batch_size {batch_size} leaves no batch "
                             f"from {len(self)} windows")
        return (self.windows(batch) for batch in indices)

    def __repr__(self) -> str:
        return (f"SlidingWindowDataset({len(self.ids)} tokens, context={self.context}, "
                f"stride={self.stride}, pad_last={self.pad_last}: {len(self)} windows)")


def _held_out_count(total: int, val_fraction, what: str) -> int:
    val_fraction = validate.fraction("val_fraction", val_fraction)
    count = round(total * val_fraction)
    if not 1 <= count <= total - 1:
        raise ValueError(f"val_fraction {val_fraction} of {total} {what} leaves "
                         f"{'no' if count < 1 else 'nothing but'} held-out {what}; both parts "
                         "need at least one")
    return count


def split_stream(ids, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(train_ids, val_ids): the token stream cut once, the last `val_fraction` held out. Window
    each part separately: no window of one part then contains a token of the other."""
    ids = validate.token_ids("ids", ids)
    cut = len(ids) - _held_out_count(len(ids), val_fraction, "tokens")
    return ids[:cut], ids[cut:]


def split_documents(documents: Sequence, val_fraction: float = 0.1,
                    rng: np.random.Generator | None = None) -> tuple[list, list]:
    """(train_documents, val_documents): whole documents held out, the last ones without
    `rng`, a random choice with one; each part keeps the documents' order."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, (list, tuple)):
        raise TypeError(f"documents must be a list or tuple of documents; got "
                        f"{type(documents).__name__}")
    count = _held_out_count(len(documents), val_fraction, "documents")
    rng = validate.generator("rng", rng, allow_none=True)
    held_out = np.arange(len(documents) - count, len(documents)) if rng is None else \
        rng.choice(len(documents), size=count, replace=False)
    is_val = np.zeros(len(documents), dtype=bool)
    is_val[held_out] = True
    return ([d for d, v in zip(documents, is_val) if not v],
            [d for d, v in zip(documents, is_val) if v])


class CBOWPairs(NamedTuple):
    """Continuous bag-of-words examples: predict each centre token from its 2c neighbours."""
    contexts: np.ndarray        # (N, 2c) the c tokens before the centre, then the c after
    centres: np.ndarray         # (N,)

    def check_nonempty(self) -> None:
        if len(self.centres) == 0:
            window = self.contexts.shape[1] // 2
            raise ValueError(f"no CBOW pairs: window {window} needs at least 2 * {window} + 1 "
                             f"= {2 * window + 1} tokens for one centre with a full context")


def cbow_pairs(ids, window: int) -> CBOWPairs:
    """Every position i with `window` tokens on both sides gives contexts
    ids[i-c:i] + ids[i+1:i+c+1] and centre ids[i]; the c positions at each edge are skipped.
    N = max(0, len(ids) - 2c) pairs; an empty result is returned as such: call
    `check_nonempty()` before training on it.

    `ids` is one sequence (a 1-D array or list of ids), or a list of sentences (each one such
    sequence): then every window stays inside its sentence, and the pairs of the sentences
    follow one another. Five 5-word sentences with c = 2 give 5 pairs, one per sentence; the
    same 25 words as one stream would give 21, 16 of them windows across a sentence boundary."""
    window = validate.positive_int("window", window)
    if is_sentences(ids):
        parts = [_sequence_pairs(validate.token_ids(f"ids[{index}]", sentence), window)
                 for index, sentence in enumerate(ids)]
        return CBOWPairs(np.concatenate([p.contexts for p in parts]),
                         np.concatenate([p.centres for p in parts]))
    return _sequence_pairs(validate.token_ids("ids", ids), window)


def is_sentences(data) -> bool:
    """A non-empty list or tuple whose items are sequences (lists, tuples, arrays or texts),
    not single ids: the sentences of cbow_pairs and train_cbow."""
    return isinstance(data, (list, tuple)) and len(data) > 0 and all(
        isinstance(item, (list, tuple, np.ndarray, str)) for item in data)


def _sequence_pairs(ids: np.ndarray, window: int) -> CBOWPairs:
    offsets = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])   # (2c,)
    centres = np.arange(window, len(ids) - window)                                # (N,)
    return CBOWPairs(ids[centres[:, None] + offsets].reshape(-1, 2 * window), ids[centres])


# --- the digit-reversal task ----------------------------------------------------------------
# Vocabulary: the digits 0-9 are ids 0-9; then padding, begin and end of sequence.
DIGIT_PAD, DIGIT_BOS, DIGIT_EOS = 10, 11, 12
DIGIT_VOCAB_SIZE = 13


class ReverseDigits(NamedTuple):
    """A batch of the digit-reversal task; True in a mask = padding (SPEC §4)."""
    source: np.ndarray               # (count, S) digits, then DIGIT_PAD; S = max_length
    source_padding_mask: np.ndarray  # (count, S) bool
    decoder_input: np.ndarray        # (count, S + 1) DIGIT_BOS, the reversed digits, DIGIT_PAD
    target: np.ndarray               # (count, S + 1) the reversed digits, DIGIT_EOS, IGNORE_INDEX
    target_padding_mask: np.ndarray  # (count, S + 1) bool, for decoder_input and target alike
    lengths: np.ndarray              # (count,) the number of digits in each source


def reverse_digits(count: int, rng: np.random.Generator, min_length: int = 1,
                   max_length: int = 8) -> ReverseDigits:
    """`count` random digit strings of lengths in [min_length, max_length] and their reversals,
    for an encoder-decoder: the encoder reads `source`, the decoder reads `decoder_input` and is
    trained to predict `target` (padded with IGNORE_INDEX so the loss skips it)."""
    count = validate.positive_int("count", count)
    rng = validate.generator("rng", rng)
    min_length = validate.positive_int("min_length", min_length)
    max_length = validate.positive_int("max_length", max_length)
    if min_length > max_length:
        raise ValueError(f"min_length must be at most max_length ({max_length}); got "
                         f"{min_length}")
    lengths = rng.integers(min_length, max_length + 1, size=count)            # (count,)
    digits = rng.integers(0, 10, size=(count, max_length))                    # (count, S)
    positions = np.arange(max_length)                                         # (S,)
    source_padding_mask = positions >= lengths[:, None]                       # (count, S)
    source = np.where(source_padding_mask, DIGIT_PAD, digits)
    # reversed[i, j] = digits[i, lengths[i] - 1 - j] for j < lengths[i]
    backwards = np.clip(lengths[:, None] - 1 - positions, 0, None)            # (count, S)
    reversed_digits = np.take_along_axis(digits, backwards, axis=1)
    target_padding_mask = np.arange(max_length + 1) > lengths[:, None]        # (count, S + 1)
    decoder_input = np.full((count, max_length + 1), DIGIT_PAD, dtype=np.int64)
    decoder_input[:, 0] = DIGIT_BOS
    decoder_input[:, 1:] = np.where(source_padding_mask, DIGIT_PAD, reversed_digits)
    target = np.full((count, max_length + 1), IGNORE_INDEX, dtype=np.int64)
    target[:, :-1] = np.where(source_padding_mask, IGNORE_INDEX, reversed_digits)
    target[np.arange(count), lengths] = DIGIT_EOS
    return ReverseDigits(source.astype(np.int64), source_padding_mask, decoder_input, target,
                         target_padding_mask, lengths.astype(np.int64))


# --- masked-language-model inputs (BERT) ---------------------------------------------------
MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1      # of the chosen tokens; the remaining 0.1 stay


def mask_tokens(ids, rng: np.random.Generator, mask_id: int, vocab_size: int,
                special_ids=(), padding_mask=None, probability: float = 0.15, *,
                ignore_index: int = IGNORE_INDEX) -> tuple[np.ndarray, np.ndarray]:
    """BERT's corruption of token ids for the masked-language-model objective: (inputs, labels),
    both int64 of ids' shape.

    Choosing: every REAL token (not padding, where `padding_mask` is True, and not one of
    `special_ids`) is chosen on its own with probability `probability` -- a Bernoulli draw per
    token, as HF's DataCollatorForLanguageModeling does -- so the number chosen is not fixed:
    it is Binomial(real tokens, probability), about 15 % of them, and a short sequence may get
    none (its loss is then 0 with a zero gradient).
    Corrupting, per chosen token: with probability 0.8 the input becomes `mask_id`, with 0.1 a
    token drawn uniformly from [0, vocab_size) (as in BERT and HF, it may be a special token or
    the original itself), and with 0.1 it is left as it is.
    labels: the original id at every chosen position (also where the input was left as it
    is: the model cannot tell which those are), `ignore_index` (-100) everywhere else.

    The draws, each of ids' shape and in this order -- uniform (chosen?), uniform (which of the
    three), integers (the random tokens) -- all come from `rng`: one seed, one result."""
    ids = validate.integer_array("ids", ids)
    rng = validate.generator("rng", rng)
    vocab_size = validate.positive_int("vocab_size", vocab_size)
    validate.ids_in_range("ids", ids, vocab_size)
    mask_id = validate.integer("mask_id", mask_id)
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id must be a token id in [0, {vocab_size}); got {mask_id}")
    if isinstance(special_ids, (set, frozenset)):
        special_ids = sorted(special_ids)
    special = validate.token_ids("special_ids", special_ids, size=vocab_size)
    if padding_mask is not None:
        if not isinstance(padding_mask, np.ndarray) or padding_mask.dtype != bool:
            raise TypeError("padding_mask must be a bool numpy array (True at padding); got "
                            f"{getattr(padding_mask, 'dtype', type(padding_mask).__name__)}")
        if padding_mask.shape != ids.shape:
            raise ValueError(f"padding_mask must have the shape of ids {ids.shape}; got "
                             f"{padding_mask.shape}")
    probability = validate.number("probability", probability, low=0.0, high=1.0,
                                  low_open=True)
    ignore_index = validate.integer("ignore_index", ignore_index)

    eligible = ~np.isin(ids, special)
    if padding_mask is not None:
        eligible &= ~padding_mask
    chosen = (rng.random(ids.shape) < probability) & eligible
    which = rng.random(ids.shape)                  # [0, 0.8) mask, [0.8, 0.9) random, rest keep
    random_ids = rng.integers(0, vocab_size, size=ids.shape)
    masked = chosen & (which < MASK_FRACTION)
    randomized = chosen & (which >= MASK_FRACTION) & (which < MASK_FRACTION + RANDOM_FRACTION)
    inputs = np.where(masked, mask_id, np.where(randomized, random_ids, ids)).astype(np.int64)
    labels = np.where(chosen, ids, ignore_index).astype(np.int64)
    return inputs, labels
