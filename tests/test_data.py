"""Datasets: next-token windows, batches, held-out splits, CBOW pairs, digit reversal, corpus."""
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (DIGIT_BOS, DIGIT_EOS, DIGIT_PAD, DIGIT_VOCAB_SIZE, IGNORE_INDEX, BPETokenizer,
                      SlidingWindowDataset, batch_indices, cbow_pairs, cross_entropy,
                      default_corpus, reverse_digits, split_documents, split_stream, window_count)
from numpy_tf.text.corpus import build_corpus

# --- next-token windows -------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens, context, stride, expected",
                         [(10, 4, 2, 3), (9, 4, 2, 3), (4, 4, 1, 0), (4, 4, 3, 0),
                          (5, 4, 1, 1), (0, 1, 1, 0), (100, 1, 1, 99)])
def test_window_count_worked_numbers(num_tokens, context, stride, expected):
    assert window_count(num_tokens, context, stride) == expected
    dataset = SlidingWindowDataset(np.arange(num_tokens), context, stride)
    assert len(dataset) == expected


@given(num_tokens=st.integers(0, 40), context=st.integers(1, 8), stride=st.integers(1, 8))
def test_every_window_is_real_text_shifted_by_one(num_tokens, context, stride):
    ids = np.arange(1000, 1000 + num_tokens)
    dataset = SlidingWindowDataset(ids, context, stride)
    starts = [s for s in range(0, num_tokens, stride) if s + context <= num_tokens - 1]
    assert len(dataset) == len(starts) == window_count(num_tokens, context, stride)
    for j, s in enumerate(starts):
        inputs, targets = dataset[j]
        assert inputs.dtype == targets.dtype == np.int64
        np.testing.assert_array_equal(inputs, ids[s:s + context])
        np.testing.assert_array_equal(targets, ids[s + 1:s + context + 1])


def test_seed_example_upstream_fourth_window_is_padded_and_ignored():
    """N=10, L=4, k=2 over ids 101..110: three full windows. The fourth (upstream: input
    [107, 108, 109, 110], target [108, 109, 110, 0]) exists only with pad_last, and its padded
    target is -100, so the loss never learns to predict padding."""
    ids = np.arange(101, 111)
    assert len(SlidingWindowDataset(ids, 4, 2)) == 3
    padded = SlidingWindowDataset(ids, 4, 2, pad_last=True, pad_id=0)
    assert len(padded) == 4
    inputs, targets = padded[3]
    np.testing.assert_array_equal(inputs, [107, 108, 109, 110])
    np.testing.assert_array_equal(targets, [108, 109, 110, IGNORE_INDEX])
    # the ignored position contributes nothing: the same loss as the three real targets alone
    logits = np.random.default_rng(0).standard_normal((4, 120))
    loss, dlogits = cross_entropy(logits, targets)
    real_loss, _ = cross_entropy(logits[:3], targets[:3])
    assert loss == pytest.approx(real_loss, rel=1e-12)
    np.testing.assert_array_equal(dlogits[3], 0.0)


def test_pad_last_only_when_a_tail_is_left():
    assert len(SlidingWindowDataset(np.arange(9), 4, 2, pad_last=True)) == 3   # covered
    inputs, targets = SlidingWindowDataset(np.arange(4), 4, 1, pad_last=True)[0]  # N = L
    np.testing.assert_array_equal(inputs, [0, 1, 2, 3])
    np.testing.assert_array_equal(targets, [1, 2, 3, IGNORE_INDEX])
    dataset = SlidingWindowDataset(np.arange(10, 17), 4, 4, pad_last=True, pad_id=99)
    inputs, targets = dataset[-1]
    np.testing.assert_array_equal(inputs, [14, 15, 16, 99])
    np.testing.assert_array_equal(targets, [15, 16, IGNORE_INDEX, IGNORE_INDEX])
    assert len(SlidingWindowDataset(np.arange(1), 4, 1, pad_last=True)) == 0


@given(num_tokens=st.integers(2, 40), context=st.integers(1, 8), data=st.data())
def test_pad_last_makes_every_token_a_target_once_covered(num_tokens, context, data):
    stride = data.draw(st.integers(1, context))       # stride <= context leaves no gaps
    ids = np.arange(500, 500 + num_tokens)
    dataset = SlidingWindowDataset(ids, context, stride, pad_last=True, pad_id=7)
    covered = set()
    for j, start in enumerate(dataset.starts):
        inputs, targets = dataset[j]
        real = targets != IGNORE_INDEX
        positions = start + 1 + np.arange(context)
        np.testing.assert_array_equal(targets[real], ids[positions[real]])
        assert (positions[~real] >= num_tokens).all()
        np.testing.assert_array_equal(inputs[start + np.arange(context) >= num_tokens], 7)
        covered.update(positions[real].tolist())
    assert covered == set(range(1, num_tokens))


def test_indexing_and_iteration():
    dataset = SlidingWindowDataset(np.arange(20), 5, 3)
    assert len(dataset) == 5
    np.testing.assert_array_equal(dataset[-1][0], dataset[4][0])
    np.testing.assert_array_equal(dataset[-5][1], dataset[0][1])
    assert len(list(dataset)) == 5
    with pytest.raises(IndexError, match=r"index must be in \[-5, 5\) for 5 windows; got 5"):
        dataset[5]
    with pytest.raises(IndexError, match="got -6"):
        dataset[-6]
    with pytest.raises(TypeError, match="index must be an integer; got 1.0"):
        dataset[1.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="context must be a positive integer; got 0"):
        SlidingWindowDataset(np.arange(10), 0)
    with pytest.raises(ValueError, match="context must be a positive integer; got -2"):
        SlidingWindowDataset(np.arange(10), -2)
    with pytest.raises(ValueError, match="stride must be a positive integer; got 0"):
        SlidingWindowDataset(np.arange(10), 4, 0)
    with pytest.raises(ValueError, match="stride must be a positive integer; got 1.5"):
        SlidingWindowDataset(np.arange(10), 4, 1.5)
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        SlidingWindowDataset(np.zeros(10), 4)
    with pytest.raises(ValueError, match="ids must have 1 dimensions"):
        SlidingWindowDataset(np.zeros((2, 5), dtype=np.int64), 4)
    with pytest.raises(ValueError, match="pad_id must be a non-negative token id; got -100"):
        SlidingWindowDataset(np.arange(10), 4, pad_id=-100)
    assert SlidingWindowDataset([3, 4, 5], 1).stride == 1           # a list of ints is fine


def test_batches_in_order_shuffled_and_dropped():
    dataset = SlidingWindowDataset(np.arange(30), 4, 2)             # 13 windows
    all_inputs, all_targets = dataset.windows(np.arange(len(dataset)))
    batches = list(dataset.batches(5))
    assert [b[0].shape for b in batches] == [(5, 4), (5, 4), (3, 4)]
    assert all(b[0].dtype == b[1].dtype == np.int64 for b in batches)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), all_inputs)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), all_targets)

    shuffled = list(dataset.batches(5, np.random.default_rng(3)))
    inputs = np.concatenate([b[0] for b in shuffled])
    assert not np.array_equal(inputs, all_inputs)
    assert sorted(map(tuple, inputs.tolist())) == sorted(map(tuple, all_inputs.tolist()))
    again = list(dataset.batches(5, np.random.default_rng(3)))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in again]),
                                  np.concatenate([b[1] for b in shuffled]))
    assert [b[0].shape[0] for b in dataset.batches(5, drop_last=True)] == [5, 5]


def test_batches_refuse_bad_arguments_and_empty_data_at_call_time():
    dataset = SlidingWindowDataset(np.arange(30), 4, 2)
    with pytest.raises(TypeError, match=r"rng must be None or a numpy.random.Generator "
                                        r"\(e.g. np.random.default_rng\(0\)\); got int"):
        dataset.batches(4, rng=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got 0"):
        dataset.batches(0)
    with pytest.raises(ValueError, match="leaves no batch from 13 windows"):
        dataset.batches(20, drop_last=True)
    empty = SlidingWindowDataset(np.arange(4), 4)
    with pytest.raises(ValueError, match=r"no training windows: 4 tokens with context 4; "
                                         r"next-token windows need at least context \+ 1 = 5"):
        empty.batches(2)
    with pytest.raises(ValueError, match="no training windows"):
        empty.check_nonempty()


@given(count=st.integers(0, 30), batch_size=st.integers(1, 8), drop_last=st.booleans(),
       seed=st.integers(0, 100))
def test_batch_indices_cover_each_index_once(count, batch_size, drop_last, seed):
    batches = list(batch_indices(count, batch_size, np.random.default_rng(seed), drop_last))
    seen = np.concatenate(batches) if batches else np.zeros(0, dtype=int)
    assert len(set(seen.tolist())) == len(seen)
    assert len(seen) == (count - count % batch_size if drop_last else count)
    assert all(len(b) == batch_size for b in batches[:-1])


# --- held-out splits --------------------------------------------------------------------------

def test_split_stream_cuts_before_windowing():
    ids = np.arange(100)
    train, val = split_stream(ids, 0.2)
    np.testing.assert_array_equal(train, np.arange(80))
    np.testing.assert_array_equal(val, np.arange(80, 100))
    # no training window (inputs or targets) holds a held-out token
    for inputs, targets in SlidingWindowDataset(train, 8, 1, pad_last=True):
        assert set(inputs.tolist()) | set(targets.tolist()) <= set(range(80)) | {IGNORE_INDEX}
    with pytest.raises(ValueError, match="val_fraction must be a number strictly between 0 "
                                         "and 1; got 1.0"):
        split_stream(ids, 1.0)
    with pytest.raises(ValueError, match="val_fraction 0.1 of 4 tokens leaves no held-out"):
        split_stream(np.arange(4), 0.1)
    with pytest.raises(ValueError, match="leaves nothing but held-out tokens"):
        split_stream(np.arange(4), 0.9)


def test_split_documents():
    documents = [f"doc {i}" for i in range(10)]
    train, val = split_documents(documents, 0.3)
    assert train == documents[:7] and val == documents[7:]
    train, val = split_documents(documents, 0.3, np.random.default_rng(1))
    assert len(val) == 3 and sorted(train + val) == sorted(documents)
    assert train == [d for d in documents if d in train]               # order kept
    with pytest.raises(TypeError, match="documents must be a list or tuple"):
        split_documents("one long text", 0.5)
    with pytest.raises(TypeError, match="rng must be None or a numpy.random.Generator"):
        split_documents(documents, 0.3, rng=1)


# --- CBOW pairs --------------------------------------------------------------------------------

def test_cbow_worked_example():
    """c=2: the context of the centre 喜欢 is 我, 很, 这, 本书."""
    words = ["我", "很", "喜欢", "这", "本书"]
    contexts, centres = cbow_pairs(np.arange(5), 2)
    assert [[words[i] for i in row] for row in contexts] == [["我", "很", "这", "本书"]]
    assert [words[i] for i in centres] == ["喜欢"]
    # five five-word sentences with c=2: only five training pairs in all
    assert sum(len(cbow_pairs(np.arange(5), 2).centres) for _ in range(5)) == 5


@given(ids=st.lists(st.integers(0, 50), max_size=30), window=st.integers(1, 4))
def test_cbow_pairs_match_a_loop(ids, window):
    contexts, centres = cbow_pairs(ids, window)
    expected = [(ids[i - window:i] + ids[i + 1:i + window + 1], ids[i])
                for i in range(window, len(ids) - window)]
    assert contexts.shape == (len(expected), 2 * window) and centres.shape == (len(expected),)
    assert contexts.tolist() == [e[0] for e in expected]
    assert centres.tolist() == [e[1] for e in expected]


def test_cbow_empty_is_an_error_when_checked():
    pairs = cbow_pairs([1, 2, 3, 4], 2)
    assert pairs.contexts.shape == (0, 4)
    with pytest.raises(ValueError, match=r"no CBOW pairs: window 2 needs at least 2 \* 2 \+ 1 "
                                         r"= 5 tokens"):
        pairs.check_nonempty()
    cbow_pairs([1, 2, 3, 4, 5], 2).check_nonempty()
    with pytest.raises(ValueError, match="window must be a positive integer; got 0"):
        cbow_pairs([1, 2, 3], 0)


# --- digit reversal ------------------------------------------------------------------------

@given(count=st.integers(1, 12), min_length=st.integers(1, 5), extra=st.integers(0, 5),
       seed=st.integers(0, 1000))
def test_reverse_digits_target_is_the_reversed_source(count, min_length, extra, seed):
    max_length = min_length + extra
    batch = reverse_digits(count, np.random.default_rng(seed), min_length, max_length)
    assert batch.source.shape == batch.source_padding_mask.shape == (count, max_length)
    for name in ("decoder_input", "target", "target_padding_mask"):
        assert getattr(batch, name).shape == (count, max_length + 1)
    for row in range(count):
        length = int(batch.lengths[row])
        assert min_length <= length <= max_length
        source = "".join(map(str, batch.source[row, :length]))
        target = batch.target[row].tolist()
        assert "".join(map(str, target[:length])) == source[::-1]
        assert target[length] == DIGIT_EOS and target[length + 1:] == \
            [IGNORE_INDEX] * (max_length - length)
        assert batch.decoder_input[row].tolist() == \
            [DIGIT_BOS] + target[:length] + [DIGIT_PAD] * (max_length - length)
        # the masks mark exactly the padding
        assert batch.source_padding_mask[row].tolist() == \
            [False] * length + [True] * (max_length - length)
        assert batch.target_padding_mask[row].tolist() == \
            [False] * (length + 1) + [True] * (max_length - length)
    np.testing.assert_array_equal(batch.source_padding_mask, batch.source == DIGIT_PAD)
    np.testing.assert_array_equal(batch.target_padding_mask, batch.target == IGNORE_INDEX)
    assert batch.source.max() < DIGIT_VOCAB_SIZE and batch.decoder_input.max() < DIGIT_VOCAB_SIZE
    assert batch.source.dtype == batch.target.dtype == np.int64


def test_reverse_digits_is_seeded_and_checks_arguments():
    first = reverse_digits(5, np.random.default_rng(9))
    second = reverse_digits(5, np.random.default_rng(9))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        reverse_digits(5, 9)
    with pytest.raises(ValueError, match="min_length must be at most max_length \\(3\\); got 4"):
        reverse_digits(5, np.random.default_rng(0), 4, 3)
    with pytest.raises(ValueError, match="count must be a positive integer; got 0"):
        reverse_digits(0, np.random.default_rng(0))


# --- the packaged corpus -------------------------------------------------------------------

def test_default_corpus_is_the_generated_text():
    corpus = default_corpus()
    assert 20_000 <= len(corpus.encode("utf-8")) <= 60_000
    assert build_corpus() == corpus                   # the shipped file is reproducible


def test_default_corpus_is_learnable_but_not_trivial():
    corpus = default_corpus()
    words = Counter(re.findall(r"[A-Za-z]+", corpus))
    assert 150 <= len(words) <= 600                   # a small vocabulary, repeated ...
    paragraphs = corpus.split("\n\n")
    assert len(set(paragraphs)) >= 0.9 * len(paragraphs)   # ... in paragraphs that differ
    # the counting adds up: "Now X had a ... and Y had b" after "carried n", with a + b = n
    numbers = {w: i for i, w in enumerate("zero one two three four five six seven eight nine "
                                          "ten eleven twelve".split())}
    stories = re.findall(r"carried (\w+) \w+\. .*? Now \w+ had (\w+) \w+ and \w+ had (\w+)",
                         corpus.replace("\n", " "))
    assert len(stories) > 20
    assert all(numbers[n] == numbers[a] + numbers[b] for n, a, b in stories)
    tokenizer = BPETokenizer.train(corpus, 300)
    assert tokenizer.decode(tokenizer.encode(corpus)) == corpus


def test_corpus_is_declared_as_package_data():
    setup = (Path(__file__).resolve().parent.parent / "setup.cfg").read_text()
    assert re.search(r"\[options.package_data\][^[]*\nnumpy_tf.text = texts/\*\.txt", setup)
