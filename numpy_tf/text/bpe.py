"""Byte-pair encoding on integer sequences: learning merges, and applying them by rank.

A "word" here is a tuple of token ids (at the start, the UTF-8 bytes of one pre-tokenised piece
of text, ids 0..255). A merge is a pair of ids (left, right) that is replaced everywhere by one
new id. The worked example, training on "abab" (bytes a=97, b=98):

    [a, b, a, b]   adjacent pairs: (a, b) twice, (b, a) once  -> merge 0 = (a, b) -> id X
    [X, X]         adjacent pairs: (X, X) once                -> merge 1 = (X, X) -> id Y
    [Y]            no pairs left: training stops

Learning (`learn_merges`): count every adjacent pair over all words (a word seen c times counts
c times), pick the most frequent pair, give it the next id, replace it in every word, repeat.
Ties are broken deterministically: the highest count wins, then the smallest pair of ids
((97, 98) before (97, 99) before (98, 0)), so training twice on the same text gives the same
merges. Pairs are counted at every position, so a run "aaa" counts (a, a) twice although only
one of them can be merged (the count of most byte-pair trainers, e.g. HF tokenizers).

Applying (`apply_merges`): the merges are applied in their TRAINING ORDER (rank 0 first), never
re-counted on the input: repeatedly find, among the adjacent pairs of the sequence, the one with
the lowest rank, and merge every non-overlapping occurrence left to right. This gives exactly
what replaying merge 0, then merge 1, ... over the sequence gives: a merged token is built from
ids older than itself, so a later merge can never create a pair that an earlier one wanted.

This file imports nothing of numpy_tf and knows nothing of text.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

Pair = tuple[int, int]
Word = tuple[int, ...]


def merge_pair(word: Word, pair: Pair, new_id: int) -> Word:
    """`word` with every non-overlapping occurrence of `pair`, scanned left to right, replaced
    by `new_id`: merging (a, a) in [a, a, a] gives [aa, a]."""
    left, right = pair
    merged: list[int] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            merged.append(new_id)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


def count_pairs(word_counts: Mapping[Word, int]) -> Counter:
    """{(left, right): how often the pair stands next to itself over all words}, each word
    weighted by how many times it occurs."""
    pairs: Counter = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def best_pair(pairs: Mapping[Pair, int]) -> tuple[Pair, int]:
    """The pair to merge next and its count: the highest count, then the smallest pair."""
    return min(pairs.items(), key=lambda item: (-item[1], item[0]))


def learn_merges(word_counts: Mapping[Word, int], num_merges: int, first_id: int,
                 min_count: int = 1) -> list[Pair]:
    """Up to `num_merges` merges learned from {word: count}; merge r creates id first_id + r.

    Stops early when no word has two tokens left, or when the best pair occurs fewer than
    `min_count` times (min_count=1: merge while any pair is left, as in the "abab" example,
    where the last merge (X, X) has count 1)."""
    words = Counter(word_counts)
    merges: list[Pair] = []
    for rank in range(num_merges):
        pairs = count_pairs(words)
        if not pairs:
            break
        pair, count = best_pair(pairs)
        if count < min_count:
            break
        merges.append(pair)
        new_id = first_id + rank
        merged: Counter = Counter()
        for word, word_count in words.items():
            merged[merge_pair(word, pair, new_id) if pair[0] in word else word] += word_count
        words = merged
    return merges


def merge_ranks(merges: Iterable[Pair]) -> dict[Pair, int]:
    """{pair: rank}, the lookup `apply_merges` needs."""
    return {tuple(pair): rank for rank, pair in enumerate(merges)}


def apply_merges(word: Word, ranks: Mapping[Pair, int], first_id: int = 0, *,
                 merged_ids: Mapping[Pair, int] | None = None) -> Word:
    """`word` encoded with learned merges, lowest rank first (see the module docstring);
    merge r's new id is first_id + r, or `merged_ids[pair]` when given (a vocabulary that
    numbers its tokens otherwise, as GPT-2's)."""
    while len(word) > 1:
        known = [pair for pair in zip(word, word[1:]) if pair in ranks]
        if not known:
            break
        pair = min(known, key=ranks.__getitem__)
        new_id = merged_ids[pair] if merged_ids is not None else first_id + ranks[pair]
        word = merge_pair(word, pair, new_id)
    return word
