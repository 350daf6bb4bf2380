"""Tokenizers: text to token ids and back, losslessly, at the level of UTF-8 bytes.

Id layout, shared by both tokenizers (S special tokens, M merges):

    0 .. 255               the 256 byte values: every string has an encoding, so no character
                           is ever unknown and encode never produces <unk>
    256 .. 256+S-1         the special tokens, in the order given
                           (default: <pad>=256 <bos>=257 <eos>=258 <mask>=259 <unk>=260)
    256+S .. 256+S+M-1     BPETokenizer only: merge r is id 256+S+r
    V .. V+A-1             special tokens added after training (`add_special_tokens`), after
                           the whole vocabulary V = 256+S+M, in the order added: every
                           earlier id and merge keeps its meaning, so a trained model's rows
                           stay valid and only grow (Llama.resize_token_embeddings(V + A))

Encoding a string, in this order:
1. Special tokens are found WHOLE first: the registered strings (longest first) cut the text
   into plain pieces and special ids, so the text "<mask>" is one id. (A naive regex tokenizer
   such as `\\w+|[^\\w\\s]` splits it into '<', 'mask', '>' and the registered id is never used.)
   `parse_special=False` turns this off and encodes specials' text as plain bytes: for untrusted
   text that must not be able to inject an <eos>.
2. BPETokenizer only: each plain piece is pre-tokenised (`pretokenize`) so that merges never
   cross a word boundary, then each word's bytes are merged by rank (numpy_tf.bpe).
3. ByteTokenizer: each plain piece becomes its UTF-8 bytes.

Decoding joins the bytes of all ids first and decodes UTF-8 once, at the end: a Chinese
character or an emoji is 3-4 bytes that BPE tokens may split, so decoding token by token would
corrupt it. A special id decodes to its string. errors="replace" only acts on id sequences that
no encode produced (a lone byte 0xE4): those give U+FFFD instead of an exception.

So decode(encode(text)) == text for every str: nothing is stripped, normalised or lost, spaces,
newlines and indentation included. The converse does not hold: the bytes of "<mask>" as six byte
ids decode to "<mask>", which encodes to the one special id (encoding is canonical).

Adding a special token matches it whole from then on, like the others: a text holding "<sep>"
encodes it as the new id (before, it was its bytes or merges), so decode(encode(text)) == text
still holds, and any text without the new strings encodes exactly as before.

Save/load: `to_dict()` is JSON-able data (kind, special tokens, merges, added tokens);
`to_arrays()` stores it as one 0-d string array under the key "tokenizer", so it can sit inside
a model's .npz; `save` and `load` write and read such a file without pickle. Data with added
tokens is format version 2 (an older reader refuses it instead of dropping them); without,
version 1, as before.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

import numpy as np

from ..core import validate
from ..core.npz import bad_file, from_json_array, json_array, load_npz, save_npz
from . import bpe

BYTE_VOCAB = 256
DEFAULT_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<mask>", "<unk>")
ARRAY_KEY = "tokenizer"
FORMAT, FORMAT_VERSION = "numpy_tf.tokenizer", 2
READ_VERSIONS = (1, 2)          # 1: no added tokens; 2: "added_tokens" after the vocabulary

# Pre-tokenisation: a run of letters, of digits, or of other symbols (each with at most one
# leading space, which belongs to the word after it), or a run of whitespace. `\s+(?!\S)` takes
# a whitespace run but the last space before a word, which then opens " word"; so "  x" is
# [" ", " x"] and "a\n\n  b" is ["a", "\n\n ", " b"]. Every character belongs to exactly one
# class (\w is letters, digits and "_"; the rest is whitespace or not), so the pieces always
# join back to the text.
PRETOKENIZE_PATTERN = re.compile(r" ?[^\W\d_]+| ?\d+| ?(?:[^\w\s]|_)+|\s+(?!\S)|\s+")


def pretokenize(text: str) -> list[str]:
    """`text` cut into words, numbers, symbol runs and whitespace runs; "".join gives `text`."""
    return PRETOKENIZE_PATTERN.findall(text)


def special_token_pattern(tokens) -> "re.Pattern | None":
    """A regex that finds any of `tokens` (None for none), longest first, so that "<mask>" wins
    over a registered "<m" at the same position: the leftmost, then longest, match."""
    ordered = sorted(tokens, key=lambda token: (-len(token), token))
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


def split_at_special(text: str, pattern, ids) -> list:
    """`text` cut at the matches of `pattern` (from special_token_pattern), in order: plain
    pieces (str, never empty) and the matched tokens' ids ({token: id}) (int)."""
    if pattern is None:
        return [text] if text else []
    pieces: list = []
    position = 0
    for match in pattern.finditer(text):
        if match.start() > position:
            pieces.append(text[position:match.start()])
        pieces.append(ids[match.group()])
        position = match.end()
    if position < len(text):
        pieces.append(text[position:])
    return pieces


def _checked_special_tokens(special_tokens, name: str = "special_tokens") -> tuple[str, ...]:
    if isinstance(special_tokens, str) or not isinstance(special_tokens, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of strings (a single string "
                        f"would be read letter by letter); got {special_tokens!r}")
    for position, token in enumerate(special_tokens):
        if not isinstance(token, str) or not token:
            raise ValueError(f"{name}[{position}] must be a non-empty string; got {token!r}")
    repeated = [token for token, count in Counter(special_tokens).items() if count > 1]
    if repeated:
        raise ValueError(f"{name} must be distinct; {repeated[0]!r} is given "
                         f"{special_tokens.count(repeated[0])} times")
    return tuple(special_tokens)


def _checked_text(text) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str; got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"text must be valid Unicode; got a lone surrogate "
                         f"{text[error.start]!r} at position {error.start}") from None
    return text


class ByteTokenizer:
    """UTF-8 bytes (ids 0..255) plus special tokens (ids 256..). No training, no vocabulary
    file: the 256 bytes cover every string."""

    kind = "byte"

    def __init__(self, special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS, *,
                 added_tokens: Sequence[str] = ()):
        self.special_tokens = _checked_special_tokens(special_tokens)
        self.added_tokens: tuple[str, ...] = ()
        self._special_ids = {token: BYTE_VOCAB + i for i, token in enumerate(self.special_tokens)}
        self._special_pattern = special_token_pattern(self.special_tokens)
        # the bytes each id stands for (BPETokenizer appends one entry per merge)
        self._id_bytes = [bytes([value]) for value in range(BYTE_VOCAB)] + \
            [token.encode("utf-8") for token in self.special_tokens]
        if added_tokens:
            self.add_special_tokens(added_tokens, "added_tokens")

    def add_special_tokens(self, tokens: Sequence[str], argument: str = "tokens") -> list[int]:
        """Register special tokens after training: each gets the next id after the current
        vocabulary (V, V + 1, ...), so every existing id and merge is unchanged. From then on
        the strings are matched whole (see the module text). Returns their ids. A token that
        is already registered is refused."""
        tokens = _checked_special_tokens(tokens, argument)
        taken = [token for token in tokens if token in self._special_ids]
        if taken:
            raise ValueError(f"{argument}: special token {taken[0]!r} is already registered "
                             f"(id {self._special_ids[taken[0]]})")
        ids = []
        for token in tokens:
            ids.append(len(self._id_bytes))
            self._special_ids[token] = ids[-1]
            self._id_bytes.append(token.encode("utf-8"))
        self.added_tokens += tokens
        self._special_pattern = special_token_pattern(self.all_special_tokens)
        return ids

    @property
    def all_special_tokens(self) -> tuple[str, ...]:
        """The special tokens of the constructor, then those added after training."""
        return self.special_tokens + self.added_tokens

    @property
    def vocab_size(self) -> int:
        """The number of ids: 256 + specials (+ merges); the size of the model's embedding."""
        return len(self._id_bytes)

    def special_id(self, token: str) -> int:
        if token not in self._special_ids:
            raise ValueError(f"special token {token!r} is not registered in this tokenizer; "
                             f"registered: {', '.join(self.all_special_tokens) or 'none'}")
        return self._special_ids[token]

    pad_id = property(lambda self: self.special_id("<pad>"), doc="the id of <pad>")
    bos_id = property(lambda self: self.special_id("<bos>"), doc="the id of <bos>")
    eos_id = property(lambda self: self.special_id("<eos>"), doc="the id of <eos>")
    mask_id = property(lambda self: self.special_id("<mask>"), doc="the id of <mask>")
    unk_id = property(lambda self: self.special_id("<unk>"),
                      doc="the id of <unk> (kept for models that expect one; never encoded)")

    def is_special(self, token_id: int) -> bool:
        added = len(self._id_bytes) - len(self.added_tokens)        # the first added id
        return BYTE_VOCAB <= token_id < BYTE_VOCAB + len(self.special_tokens) or \
            added <= token_id < len(self._id_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes an id stands for (a special token: its UTF-8 string)."""
        token_id = validate.integer("token_id", token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token_id must be in [0, {self.vocab_size}); got {token_id}")
        return self._id_bytes[token_id]

    def split_special(self, text: str) -> list:
        """`text` cut at the registered special tokens, in order: plain pieces (str, never
        empty) and special ids (int). "a<mask>b" -> ["a", 259, "b"]."""
        return split_at_special(text, self._special_pattern, self._special_ids)

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True):
        """Token ids (N,) int64. `add_special` puts <bos> first and <eos> last (both must be
        registered); `parse_special=False` encodes special tokens' text as plain bytes."""
        text = _checked_text(text)
        ids = [self.bos_id] if add_special else []
        pieces = self.split_special(text) if parse_special else [text]
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids.extend(self._encode_plain(piece))
        if add_special:
            ids.append(self.eos_id)
        return np.array(ids, dtype=np.int64)

    def _encode_plain(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids` (an int array or list): all bytes joined, then decoded once.
        `skip_special` leaves the special tokens out."""
        ids = validate.token_ids("ids", ids, size=self.vocab_size)
        chunks = [self._id_bytes[token_id] for token_id in ids.tolist()
                  if not (skip_special and self.is_special(token_id))]
        return b"".join(chunks).decode("utf-8", errors="replace")

    # --- saving: JSON-able data, stored in an .npz without pickle ---------------------------

    def to_dict(self) -> dict:
        data = {"format": FORMAT, "version": 2 if self.added_tokens else 1, "kind": self.kind,
                "special_tokens": list(self.special_tokens)}
        if self.added_tokens:
            data["added_tokens"] = list(self.added_tokens)
        return data

    def to_arrays(self) -> dict[str, np.ndarray]:
        """{"tokenizer": 0-d string array}: merge it into a model's arrays to save both."""
        return {ARRAY_KEY: json_array(self.to_dict())}

    def save(self, path) -> None:
        save_npz(path, self.to_arrays())

    @classmethod
    def from_dict(cls, data) -> "ByteTokenizer":
        """The tokenizer `data` (from `to_dict`) describes, of the kind that was saved:
        ByteTokenizer.from_dict reads both kinds, BPETokenizer.from_dict only "bpe"."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"tokenizer data must be a dict with format {FORMAT!r}; got "
                             f"{str(data)[:80]}")
        if data.get("version") not in READ_VERSIONS:
            raise ValueError(f"tokenizer data version {data.get('version')!r} is not supported "
                             f"(this numpy_tf reads versions "
                             f"{', '.join(map(str, READ_VERSIONS))})")
        if data.get("version") == 1 and "added_tokens" in data:
            raise ValueError("tokenizer data version 1 has no added_tokens (version 2 does)")
        kinds = {"byte": ByteTokenizer, "bpe": BPETokenizer}
        kind = data.get("kind")
        if kind not in kinds or not issubclass(kinds[kind], cls):
            allowed = [name for name, klass in kinds.items() if issubclass(klass, cls)]
            raise ValueError(f"tokenizer data kind must be one of {allowed} for "
                             f"{cls.__name__}; got {kind!r}")
        return kinds[kind]._from_checked_dict(data)

    @classmethod
    def _from_checked_dict(cls, data: dict) -> "ByteTokenizer":
        return cls(data.get("special_tokens"), added_tokens=data.get("added_tokens", ()))

    @classmethod
    def from_arrays(cls, arrays, path=None) -> "ByteTokenizer":
        """The tokenizer stored under "tokenizer" in {name: array} (other keys are ignored).
        With `path` (the file the arrays came from), malformed tokenizer data is a
        FileFormatError naming the file."""
        if ARRAY_KEY not in arrays:
            message = f"no {ARRAY_KEY!r} array among {sorted(arrays)}: no tokenizer was saved here"
            raise ValueError(message) if path is None else bad_file(path, message)
        data = from_json_array(arrays[ARRAY_KEY], path, ARRAY_KEY, dict)
        if path is None:
            return cls.from_dict(data)
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise bad_file(path, f"entry {ARRAY_KEY!r} is not a tokenizer numpy_tf can "
                           f"rebuild ({error})") from None

    @classmethod
    def load(cls, path) -> "ByteTokenizer":
        """The tokenizer saved in `path` (by `save`, or inside a model's .npz); a file that is
        not one is a FileFormatError naming it."""
        return cls.from_arrays(load_npz(path), path)

    def __repr__(self) -> str:
        added = f", added_tokens={list(self.added_tokens)}" if self.added_tokens else ""
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, "
                f"special_tokens={list(self.special_tokens)}{added})")


def _checked_merges(merges, first_id: int) -> tuple[tuple[int, int], ...]:
    """Merge r must join two ids that exist before it: bytes or earlier merges, not specials."""
    if isinstance(merges, (str, bytes)) or not isinstance(merges, (list, tuple)):
        raise TypeError(f"merges must be a list of (left, right) id pairs; got "
                        f"{type(merges).__name__}")
    checked = []
    for rank, pair in enumerate(merges):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            not isinstance(i, bool) and isinstance(i, (int, np.integer))
            and (0 <= i < BYTE_VOCAB or first_id <= i < first_id + rank) for i in pair)
        if not ok:
            earlier = f", or an earlier merge ({first_id}..{first_id + rank - 1})" if rank else ""
            raise ValueError(f"merges[{rank}] must be a pair of ids, each a byte (0..255)"
                             f"{earlier}; got {pair!r}")
        checked.append((int(pair[0]), int(pair[1])))
    return tuple(checked)


class BPETokenizer(ByteTokenizer):
    """Byte-level BPE: bytes, then special tokens, then one id per learned merge.

    Build one with `BPETokenizer.train(text, vocab_size)`, or from saved merges. With
    `pretokenize=True` (the default) merges stay inside the pieces of `pretokenize` (a word
    with its leading space, a number, a symbol run, a whitespace run); with False a merge may
    join anything, e.g. the end of one word and the start of the next."""

    kind = "bpe"

    def __init__(self, merges=(), special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS, *,
                 pretokenize: bool = True, added_tokens: Sequence[str] = ()):
        super().__init__(special_tokens)
        if not isinstance(pretokenize, bool):
            raise TypeError(f"pretokenize must be True or False; got {pretokenize!r}")
        self.pretokenize = pretokenize
        self.merges = _checked_merges(merges, self.first_merge_id)
        self._ranks = bpe.merge_ranks(self.merges)
        for left, right in self.merges:
            self._id_bytes.append(self._id_bytes[left] + self._id_bytes[right])
        if added_tokens:                                # after the merges, as they were added
            self.add_special_tokens(added_tokens, "added_tokens")

    @property
    def first_merge_id(self) -> int:
        return BYTE_VOCAB + len(self.special_tokens)

    @classmethod
    def train(cls, text, vocab_size: int, special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
              *, pretokenize: bool = True, min_count: int = 1) -> "BPETokenizer":
        """Learn up to vocab_size - 256 - len(special_tokens) merges from `text` (a str, or a
        list of documents that merges never cross), as numpy_tf.bpe.learn_merges describes:
        highest pair count first, ties to the smallest pair of ids. Special tokens' text is
        cut out before counting. Training stops early when no pair (or none occurring at least
        `min_count` times) is left, so the vocabulary may come out smaller than asked."""
        documents = [text] if isinstance(text, str) else text
        if not isinstance(documents, (list, tuple)):
            raise TypeError(f"text must be a str or a list of str; got {type(text).__name__}")
        documents = [_checked_text(document) for document in documents]
        tokenizer = cls((), special_tokens, pretokenize=pretokenize)
        vocab_size = validate.integer("vocab_size", vocab_size)
        if vocab_size < tokenizer.vocab_size:
            raise ValueError(f"vocab_size must be at least {tokenizer.vocab_size} (256 bytes + "
                             f"{len(tokenizer.special_tokens)} special tokens); got {vocab_size}")
        min_count = validate.positive_int("min_count", min_count)
        word_counts: Counter = Counter()
        for document in documents:
            for piece in tokenizer.split_special(document):
                if isinstance(piece, str):
                    word_counts.update(tuple(word.encode("utf-8"))
                                       for word in tokenizer._words(piece))
        merges = bpe.learn_merges(word_counts, vocab_size - tokenizer.vocab_size,
                                  tokenizer.first_merge_id, min_count)
        return cls(merges, special_tokens, pretokenize=pretokenize)

    def _words(self, text: str) -> list[str]:
        return pretokenize(text) if self.pretokenize else [text]

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in self._words(text):
            ids.extend(bpe.apply_merges(tuple(word.encode("utf-8")), self._ranks,
                                        self.first_merge_id))
        return ids

    def to_dict(self) -> dict:
        return {**super().to_dict(), "merges": [list(pair) for pair in self.merges],
                "pretokenize": self.pretokenize}

    @classmethod
    def _from_checked_dict(cls, data: dict) -> "BPETokenizer":
        return cls(data.get("merges"), data.get("special_tokens"),
                   pretokenize=data.get("pretokenize"),
                   added_tokens=data.get("added_tokens", ()))

    def __repr__(self) -> str:
        added = f", added_tokens={list(self.added_tokens)}" if self.added_tokens else ""
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self.special_tokens)}, pretokenize={self.pretokenize}"
                f"{added})")
