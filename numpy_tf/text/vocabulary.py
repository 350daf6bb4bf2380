"""A word vocabulary: words cut from a text and numbered in order of first occurrence.

Used by CBOW's word vectors, whose rows mean nothing without the words they belong to.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

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
