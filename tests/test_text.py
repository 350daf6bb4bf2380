"""Tokenizers: bytes + special tokens, byte-level BPE, lossless round trips, save/load."""
import json
import re

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from numpy_tf import BPETokenizer, ByteTokenizer, default_corpus, pretokenize
from numpy_tf.core.npz import load_npz, save_npz
from numpy_tf.text.bpe import apply_merges, count_pairs, learn_merges, merge_pair, merge_ranks

A, B = ord("a"), ord("b")
AWKWARD = ["", " ", "   \n\t  ", "中文字符", "emoji 🙂👍🏽 mixed",
           "def f(x):\n    return x\n\n", "\r\n\r\n", "a<mask>b<pad><eos>", "<mask",
           "tabs\tand  double  spaces ", "é e\u0301"]


@pytest.fixture(scope="module")
def trained():
    """A BPE tokenizer with a few hundred merges, learned from the packaged corpus."""
    return BPETokenizer.train(default_corpus(), 400)


# --- bytes and special tokens -------------------------------------------------------------

def test_ids_are_the_utf8_bytes_then_the_special_tokens():
    tokenizer = ByteTokenizer()
    assert tokenizer.vocab_size == 261
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id,
            tokenizer.unk_id) == (256, 257, 258, 259, 260)
    text = "héllo 中🙂"
    np.testing.assert_array_equal(tokenizer.encode(text), list(text.encode("utf-8")))
    assert tokenizer.encode(text).dtype == np.int64
    np.testing.assert_array_equal(tokenizer.encode("hi", add_special=True),
                                  [257, ord("h"), ord("i"), 258])
    assert tokenizer.encode("").shape == (0,) and tokenizer.encode("").dtype == np.int64


@pytest.mark.parametrize("make", [ByteTokenizer, lambda: BPETokenizer.train("abab", 263)])
@pytest.mark.parametrize("text", AWKWARD)
def test_round_trip_awkward_text(make, text):
    tokenizer = make()
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode(text, parse_special=False)) == text
    assert tokenizer.decode(tokenizer.encode(text, add_special=True), skip_special=True) == \
        text.replace("<mask>", "").replace("<pad>", "").replace("<eos>", "")


@given(text=st.text())
def test_byte_round_trip_any_text(text):
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids.tolist()) == text


@given(text=st.text())
def test_unknown_characters_never_become_unk(text):
    """Bytes cover everything: without special tokens in the text every id is a byte."""
    for tokenizer in (ByteTokenizer(), BPETokenizer.train("hello world", 270)):
        ids = tokenizer.encode(text, parse_special=False)
        assert tokenizer.unk_id not in ids
        assert all(not tokenizer.is_special(i) for i in ids.tolist())


def test_mask_is_matched_whole_not_split_like_a_naive_regex():
    # the bug to avoid: a word/punctuation regex splits the registered token into three
    assert re.findall(r"\w+|[^\w\s]", "<mask>") == ["<", "mask", ">"]
    tokenizer = ByteTokenizer()
    np.testing.assert_array_equal(tokenizer.encode("<mask>"), [259])
    np.testing.assert_array_equal(tokenizer.encode("a<mask>b"), [A, 259, B])
    np.testing.assert_array_equal(tokenizer.encode("<mask>", parse_special=False),
                                  list(b"<mask>"))
    assert tokenizer.split_special("x<pad><pad>y") == ["x", 256, 256, "y"]


def test_longest_special_token_wins():
    tokenizer = ByteTokenizer(["<m", "<mask>"])
    np.testing.assert_array_equal(tokenizer.encode("<mask><m"), [257, 256])
    assert ByteTokenizer([]).split_special("<mask>") == ["<mask>"]


def test_decode_joins_bytes_before_decoding():
    """"中" is three bytes; a merge (184, 173) splits it across two tokens. Decoding token by
    token gives three replacement characters (a lead byte alone, then two continuation bytes);
    decoding the joined bytes gives the character."""
    tokenizer = BPETokenizer([(184, 173)], [])
    ids = tokenizer.encode("中")
    np.testing.assert_array_equal(ids, [228, 256])
    assert "".join(tokenizer.decode([i]) for i in ids) == "\ufffd" * 3
    assert tokenizer.decode(ids) == "中"
    assert tokenizer.decode([228]) == "\ufffd"        # ids no encode produces: replaced


def test_skip_special_and_token_bytes():
    tokenizer = ByteTokenizer()
    assert tokenizer.decode([257, A, 259, 258]) == "<bos>a<mask><eos>"
    assert tokenizer.decode([257, A, 259, 258], skip_special=True) == "a"
    assert tokenizer.token_bytes(259) == b"<mask>" and tokenizer.token_bytes(A) == b"a"


def test_bad_input():
    tokenizer = ByteTokenizer()
    with pytest.raises(TypeError, match="text must be a str; got bytes"):
        tokenizer.encode(b"abc")
    with pytest.raises(ValueError, match="lone surrogate '\\\\ud800' at position 1"):
        tokenizer.encode("a\ud800")
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 261\); got 261 at "
                                         r"position \(2,\)"):
        tokenizer.decode([1, 2, 261])
    with pytest.raises(ValueError, match="got -1"):
        tokenizer.decode(np.array([-1]))
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        tokenizer.decode([1.0])
    with pytest.raises(ValueError, match="ids must have 1 dimensions"):
        tokenizer.decode(np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="ids must be a 1-D array or list"):
        tokenizer.decode("abc")
    with pytest.raises(ValueError, match="token_id must be in"):
        tokenizer.token_bytes(300)
    with pytest.raises(TypeError, match="a single string would be read letter by letter"):
        ByteTokenizer("<pad>")
    with pytest.raises(ValueError, match=r"special_tokens\[1\] must be a non-empty string"):
        ByteTokenizer(["<pad>", ""])
    with pytest.raises(ValueError, match="'<pad>' is given 2 times"):
        ByteTokenizer(["<pad>", "<pad>"])
    with pytest.raises(ValueError, match="special token '<bos>' is not registered"):
        ByteTokenizer(["<pad>"]).encode("x", add_special=True)


# --- BPE: the algorithm -------------------------------------------------------------------

def test_abab_worked_example():
    """(a, b) occurs twice and (b, a) once, so merge 0 is (a, b): [ab, ab]; then (ab, ab):
    [abab]. With 5 special tokens the merges get ids 261 and 262."""
    assert count_pairs({(A, B, A, B): 1}) == {(A, B): 2, (B, A): 1}
    one = BPETokenizer.train("abab", 262)
    assert one.merges == ((A, B),)
    np.testing.assert_array_equal(one.encode("abab"), [261, 261])
    assert [one.token_bytes(i) for i in one.encode("abab")] == [b"ab", b"ab"]
    two = BPETokenizer.train("abab", 263)
    assert two.merges == ((A, B), (261, 261))
    np.testing.assert_array_equal(two.encode("abab"), [262])
    assert two.token_bytes(262) == b"abab"
    assert BPETokenizer.train("abab", 1000).merges == two.merges     # nothing left to merge


def test_tie_breaking_highest_count_then_smallest_pair():
    # all pairs once: the smallest pair (a, b) wins
    assert learn_merges({(A, B, ord("c"), ord("d")): 1}, 1, 256) == [(A, B)]
    # a higher count beats a smaller pair: (x, y) twice beats (a, b) once
    x, y = ord("x"), ord("y")
    assert learn_merges({(x, y, x, y): 1, (A, B): 1}, 1, 256) == [(x, y)]
    # counts are weighted by how often a word occurs
    assert learn_merges({(x, y): 1, (A, B): 3}, 1, 256) == [(A, B)]
    assert learn_merges({(A, B): 1}, 5, 256, min_count=2) == []


def test_merge_pair_is_left_to_right_and_non_overlapping():
    assert merge_pair((A, A, A), (A, A), 300) == (300, A)
    assert merge_pair((A, A, A, A), (A, A), 300) == (300, 300)
    assert merge_pair((B, A, B), (A, B), 300) == (B, 300)
    assert count_pairs({(A, A, A): 1}) == {(A, A): 2}   # counted at every position


def test_encode_applies_merges_by_rank_not_by_input_frequency():
    """Merges (b, c) rank 0, (a, b) rank 1. In "ababc" the most frequent pair is (a, b), but
    the rank decides: (b, c) first, giving [a, b, a, bc], then (a, b): [ab, a, bc]."""
    c = ord("c")
    tokenizer = BPETokenizer([(B, c), (A, B)], [])
    bc, ab = 256, 257
    np.testing.assert_array_equal(tokenizer.encode("ababc"), [ab, A, bc])


@given(word=st.lists(st.integers(0, 3), max_size=24),
       training=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1,
                         max_size=6), num_merges=st.integers(0, 12))
def test_lowest_rank_first_equals_replaying_the_merges_in_order(word, training, num_merges):
    merges = learn_merges({tuple(w): 1 for w in training}, num_merges, 256)
    replayed = tuple(word)
    for rank, pair in enumerate(merges):
        replayed = merge_pair(replayed, pair, 256 + rank)
    assert apply_merges(tuple(word), merge_ranks(merges), 256) == replayed


def test_training_is_deterministic(trained):
    again = BPETokenizer.train(default_corpus(), 400)
    assert again.merges == trained.merges and len(trained.merges) == 400 - 261


# --- BPE: text ------------------------------------------------------------------------------

@given(text=st.text())
def test_bpe_round_trip_any_text(trained, text):
    assert trained.decode(trained.encode(text)) == text


@given(text=st.text(alphabet=" \t\n\rab.,", max_size=40))
def test_bpe_without_pretokenize_round_trip_whitespace(text):
    tokenizer = BPETokenizer.train("a b\n\n  a  b\t.\n" * 3, 290, pretokenize=False)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_whitespace_and_indentation_preserved_exactly(trained):
    code = "def f(x):\n    if x:\n\t\treturn  x  \n\n\n    return None\r\n   "
    ids = trained.encode(code)
    assert trained.decode(ids) == code
    assert len(ids) < len(code.encode())             # merges were used


def test_pretokenize_pieces():
    assert pretokenize("Hello, world!\n  x") == ["Hello", ",", " world", "!", "\n ", " x"]
    assert pretokenize("a\n\n  b") == ["a", "\n\n ", " b"]
    assert pretokenize("in 2024 it's") == ["in", " 2024", " it", "'", "s"]


@given(text=st.text())
def test_pretokenize_loses_nothing(text):
    assert "".join(pretokenize(text)) == text


def test_merges_stay_inside_pretokenized_pieces(trained):
    for token_id in range(trained.first_merge_id, trained.vocab_size):
        assert len(pretokenize(trained.token_bytes(token_id).decode("utf-8"))) == 1


def test_special_token_in_bpe_is_one_id_and_never_merged():
    tokenizer = BPETokenizer.train("x<mask>y " * 20, 300)
    np.testing.assert_array_equal(tokenizer.encode("<mask>"), [tokenizer.mask_id])
    assert all(b"<" not in tokenizer.token_bytes(i)
               for i in range(tokenizer.first_merge_id, tokenizer.vocab_size))


def test_merges_never_cross_documents():
    c, d = ord("c"), ord("d")
    assert BPETokenizer.train(["ab", "cd"], 300, [], pretokenize=False).merges == \
        ((A, B), (c, d))
    # as one text, [ab, cd] is merged across the boundary (ab=256, cd=257)
    assert BPETokenizer.train("abcd", 300, [], pretokenize=False).merges == \
        ((A, B), (c, d), (256, 257))


def test_bad_training_input():
    with pytest.raises(ValueError, match=r"vocab_size must be at least 261 \(256 bytes \+ 5 "
                                         r"special tokens\); got 260"):
        BPETokenizer.train("abab", 260)
    with pytest.raises(TypeError, match="vocab_size must be an integer; got 300.0"):
        BPETokenizer.train("abab", 300.0)
    with pytest.raises(TypeError, match="text must be a str or a list of str"):
        BPETokenizer.train(b"abab", 300)
    with pytest.raises(ValueError, match="min_count must be a positive integer"):
        BPETokenizer.train("abab", 300, min_count=0)
    with pytest.raises(TypeError, match="pretokenize must be True or False"):
        BPETokenizer.train("abab", 300, pretokenize="yes")


# --- saving ---------------------------------------------------------------------------------

def test_save_and_load_without_pickle(trained, tmp_path):
    text = "In the evening, Anna<mask> went home.\n  中"
    data = json.loads(json.dumps(trained.to_dict()))
    assert BPETokenizer.from_dict(data).merges == trained.merges
    trained.save(tmp_path / "tok.npz")
    with np.load(tmp_path / "tok.npz", allow_pickle=False) as raw:
        assert raw.files == ["tokenizer"]
    loaded = BPETokenizer.load(tmp_path / "tok.npz")
    assert isinstance(loaded, BPETokenizer) and loaded.pretokenize
    np.testing.assert_array_equal(loaded.encode(text), trained.encode(text))
    # next to a model's arrays in one .npz
    save_npz(tmp_path / "model.npz", {"param/w": np.ones(3), **trained.to_arrays()})
    assert ByteTokenizer.load(tmp_path / "model.npz").merges == trained.merges
    assert ByteTokenizer.from_arrays(load_npz(tmp_path / "model.npz")).vocab_size == 400


def test_byte_tokenizer_saves_its_kind(tmp_path):
    tokenizer = ByteTokenizer(["<pad>", "<sep>"])
    tokenizer.save(tmp_path / "byte.npz")
    loaded = ByteTokenizer.load(tmp_path / "byte.npz")
    assert type(loaded) is ByteTokenizer and loaded.special_tokens == ("<pad>", "<sep>")
    with pytest.raises(ValueError, match=r"kind must be one of \['bpe'\] for BPETokenizer; "
                                         r"got 'byte'"):
        BPETokenizer.load(tmp_path / "byte.npz")


def test_bad_saved_data(tmp_path):
    good = BPETokenizer([(A, B)], ["<pad>"]).to_dict()
    with pytest.raises(ValueError, match="format 'numpy_tf.tokenizer'"):
        ByteTokenizer.from_dict({"merges": []})
    with pytest.raises(ValueError, match=r"version 3 is not supported \(this numpy_tf reads "
                                         r"versions 1, 2\)"):
        ByteTokenizer.from_dict({**good, "version": 3})
    with pytest.raises(ValueError, match=r"merges\[0\] must be a pair of ids, each a byte "
                                         r"\(0..255\); got \[256, 98\]"):
        ByteTokenizer.from_dict({**good, "merges": [[256, B]]})          # 256 is <pad>
    with pytest.raises(ValueError, match=r"merges\[1\] .* or an earlier merge \(257..257\); "
                                         r"got \[258, 98\]"):
        ByteTokenizer.from_dict({**good, "merges": [[A, B], [258, B]]})   # not yet defined
    save_npz(tmp_path / "weights.npz", {"param/w": np.ones(2)})
    with pytest.raises(ValueError, match="no 'tokenizer' array among"):
        ByteTokenizer.load(tmp_path / "weights.npz")


# --- special tokens added after training --------------------------------------------------
def _copy(tokenizer):
    return type(tokenizer).from_dict(tokenizer.to_dict())


def test_added_special_tokens_come_after_the_vocabulary_and_change_nothing_else(trained):
    tokenizer = _copy(trained)
    texts = AWKWARD + [default_corpus()[:2000]]
    before = [tokenizer.encode(text) for text in texts]
    assert tokenizer.add_special_tokens(["<sep>", "<cls>"]) == [400, 401]
    assert tokenizer.vocab_size == 402 and tokenizer.merges == trained.merges
    assert tokenizer.special_tokens == trained.special_tokens
    assert tokenizer.added_tokens == ("<sep>", "<cls>")
    for text, ids in zip(texts, before):                      # existing ids unchanged
        np.testing.assert_array_equal(tokenizer.encode(text), ids)
    for token_id in range(400):
        assert tokenizer.token_bytes(token_id) == trained.token_bytes(token_id)
    ids = tokenizer.encode("question<sep> answer<cls><eos>")
    assert list(ids[-2:]) == [401, tokenizer.eos_id] and 400 in ids
    assert tokenizer.special_id("<cls>") == 401
    assert tokenizer.decode(ids) == "question<sep> answer<cls><eos>"
    assert tokenizer.decode(ids, skip_special=True) == "question answer"
    assert tokenizer.is_special(400) and not tokenizer.is_special(399)
    # before registering, "<sep>" was plain text: several ids, none of them special
    plain = trained.encode("<sep>")
    assert len(plain) > 1 and not any(trained.is_special(int(i)) for i in plain)
    np.testing.assert_array_equal(tokenizer.encode("<sep>", parse_special=False), plain)


@given(text=st.text(alphabet=st.sampled_from(list("ab <sep>c中\n")), max_size=40))
def test_round_trips_stay_exact_after_adding(trained, text):
    tokenizer = _copy(trained)
    tokenizer.add_special_tokens(["<sep>", "<s"])
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode(text, parse_special=False)) == text


def test_added_tokens_are_saved_and_loaded(trained, tmp_path):
    tokenizer = _copy(trained)
    tokenizer.add_special_tokens(["<sep>"])
    tokenizer.save(tmp_path / "t.npz")
    loaded = BPETokenizer.load(tmp_path / "t.npz")
    assert loaded.added_tokens == ("<sep>",) and loaded.vocab_size == 401
    np.testing.assert_array_equal(loaded.encode("a<sep>b"), tokenizer.encode("a<sep>b"))
    assert tokenizer.to_dict()["version"] == 2 and trained.to_dict()["version"] == 1
    assert "added_tokens" not in trained.to_dict()     # without additions: as before
    byte = ByteTokenizer(["<pad>"])
    assert byte.add_special_tokens(["<sep>"]) == [257]
    again = ByteTokenizer.from_dict(byte.to_dict())
    assert again.encode("x<sep>").tolist() == [120, 257] and "added_tokens=['<sep>']" in \
        repr(again)


def test_adding_bad_special_tokens(trained):
    tokenizer = _copy(trained)
    with pytest.raises(ValueError, match=r"tokens: special token '<eos>' is already registered "
                                         r"\(id 258\)"):
        tokenizer.add_special_tokens(["<sep>", "<eos>"])
    assert tokenizer.vocab_size == 400                      # nothing was added
    tokenizer.add_special_tokens(["<sep>"])
    with pytest.raises(ValueError, match="'<sep>' is already registered .id 400"):
        tokenizer.add_special_tokens(["<sep>"])
    with pytest.raises(TypeError, match="tokens must be a list or tuple of strings"):
        tokenizer.add_special_tokens("<x>")
    with pytest.raises(ValueError, match=r"tokens\[0\] must be a non-empty string; got ''"):
        tokenizer.add_special_tokens([""])
    with pytest.raises(ValueError, match="version 1 has no added_tokens"):
        BPETokenizer.from_dict({**trained.to_dict(), "added_tokens": ["<x>"]})
    with pytest.raises(ValueError, match=r"added_tokens: special token '<pad>' is already"):
        BPETokenizer.from_dict({**trained.to_dict(), "version": 2, "added_tokens": ["<pad>"]})
