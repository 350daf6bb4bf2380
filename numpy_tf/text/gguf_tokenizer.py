"""The tokenizer of a GGUF file: GPT-2's byte-level BPE, as SmolLM2 uses it.

    config, state_dict, data = numpy_tf.pretrained.load_gguf(path)
    tokenizer = GGUFTokenizer.from_data(data)
    ids = tokenizer.encode(smollm2_chat([{"role": "user", "content": "Hi"}]))
    text = tokenizer.decode(ids)

The vocabulary (`tokens`, id = position) spells every byte as one printable character
(`byte_alphabet`: GPT-2's table, so the space 0x20 is "Ġ" and the newline 0x0A is "Ċ"); a merge
"Ġ t" joins two tokens into "Ġt". Encoding a string, in this order:

1. Special tokens (token_type CONTROL, e.g. <|im_start|>, and USER_DEFINED) are found WHOLE
   first, leftmost and then longest, and become their ids; merges never touch them.
2. Each plain piece is pre-tokenised, so that merges never cross a word boundary. `smollm`
   (SmolLM2's tokenizer.json: Digits(individual_digits=True), then ByteLevel's regex; llama.cpp
   "smollm"): every number character (\\p{N}) stands alone, and the text between is cut by GPT-2's
   pattern (`gpt2`, also available on its own)
       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
   Python's `re` has no \\p{L}, so `gpt2_split` is a scanner over the character classes of
   `char_class`: L letters and N numbers by `unicodedata.category`, S the Unicode White_Space
   characters (what Oniguruma's \\s matches; Python's str.isspace also counts U+001C..U+001F),
   P everything else. The contractions are lower case only: "'S" is "'" then "S".
3. Each piece's UTF-8 bytes become their alphabet characters' ids, and merges are applied by rank
   (numpy_tf.bpe.apply_merges), the lowest-ranked adjacent pair first.

Decoding joins the bytes of all ids (a special token: its UTF-8 text) and decodes UTF-8 once at
the end, so decode(encode(text)) == text for every text the vocabulary can spell.

SmolLM2's vocabulary has no token for 21 of the 256 bytes: 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D
(control characters), 0xF1, 0xF2 (the first byte of characters U+40000..U+BFFFF, unassigned) and
bytes that never occur in UTF-8. Hugging Face's BPE silently drops such bytes; encode raises a
ValueError naming the character instead, or drops them like HF with missing_bytes="skip".

Unicode versions: the classes come from the running Python's `unicodedata`; HF's tokenizers may
know characters assigned later (Python 3.11: Unicode 14). They agree on every character assigned
in both.
"""
from __future__ import annotations

import numbers
import unicodedata
from typing import Sequence

import numpy as np

from ..core import validate
from . import bpe
from .tokenizers import _checked_text, special_token_pattern, split_at_special

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6   # GGUF token_type
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")     # after an apostrophe, lower case only
# The Unicode White_Space property: tab, LF, VT, FF, CR, space, NEL, NBSP, ogham space, the
# U+2000 spaces, line and paragraph separators, narrow NBSP, math space, ideographic space.
WHITESPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680,
                                 *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
                                 0x3000]))
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_alphabet() -> list[str]:
    """GPT-2's table: the character that spells byte b in the vocabulary. The 188 printable
    bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the others, in increasing
    order, get U+0100, U+0101, ... (so 0x00 is 'Ā', the space 0x20 'Ġ', the newline 0x0A 'Ċ')."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet, shifted = [""] * 256, 0
    for byte in range(256):
        if byte in printable:
            alphabet[byte] = chr(byte)
        else:
            alphabet[byte] = chr(256 + shifted)
            shifted += 1
    return alphabet


def char_class(char: str) -> str:
    """"L" letter, "N" number (\\p{L}, \\p{N}: general category L*, N*), "S" White_Space, or "P"
    anything else."""
    if char in WHITESPACE:
        return "S"
    category = unicodedata.category(char)[0]
    return category if category in "LN" else "P"


def gpt2_split(text: str) -> list[str]:
    """`text` cut as GPT-2's pattern (module docstring) cuts it; "".join gives `text`.

    At each position the first alternative that matches wins: a contraction after "'"; else a
    run of one class L, N or P, taking one leading " " when the run starts right after it;
    else whitespace: a run that reaches the end, or the run but its last character when a
    non-space follows (\\s+(?!\\S): that character may open " word"), or a single character."""
    classes = [char_class(char) for char in text]
    pieces, start, n = [], 0, len(text)
    while start < n:
        end = start + 1
        head = classes[start + 1] if text[start] == " " and start + 1 < n else classes[start]
        contraction = next((suffix for suffix in CONTRACTIONS
                            if text[start] == "'" and text.startswith(suffix, start + 1)), None)
        if contraction is not None:
            end = start + 1 + len(contraction)
        elif head != "S":                        # " ?" then a run of L, of N or of P
            end = start + (2 if text[start] == " " else 1)
            while end < n and classes[end] == head:
                end += 1
        else:
            while end < n and classes[end] == "S":
                end += 1
            if end < n and end - start > 1:      # a non-space follows: leave it its space
                end -= 1
        pieces.append(text[start:end])
        start = end
    return pieces


def smollm_split(text: str) -> list[str]:
    """Every number character alone (HF's Digits(individual_digits=True)), and gpt2_split on
    the text between: "a 12" -> ["a", " ", "1", "2"]."""
    pieces, start = [], 0
    for position, char in enumerate(text):
        if char_class(char) == "N":
            pieces.extend(gpt2_split(text[start:position]))
            pieces.append(char)
            start = position + 1
    pieces.extend(gpt2_split(text[start:]))
    return pieces


PRE_TOKENIZERS = {"smollm": smollm_split, "gpt2": gpt2_split}


class GGUFTokenizer:
    """Byte-level BPE from a vocabulary (`tokens`, id = position), ranked `merges` ("a b"
    strings) and GGUF token types; see the module docstring."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str],
                 token_types: Sequence[int] | None = None, *, pre: str = "smollm",
                 bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, chat_template: str | None = None):
        validate.choice("pre", pre, tuple(PRE_TOKENIZERS))
        self.tokens = tuple(tokens)
        self.token_types = tuple(token_types) if token_types is not None else \
            (NORMAL,) * len(self.tokens)
        if len(self.token_types) != len(self.tokens):
            raise ValueError(f"token_types must give one type per token ({len(self.tokens)}); "
                             f"got {len(self.token_types)}")
        self.pre, self.chat_template = pre, chat_template
        self._split = PRE_TOKENIZERS[pre]
        self.vocab = {token: index for index, token in enumerate(self.tokens)}
        if len(self.vocab) != len(self.tokens):
            raise ValueError("tokens must be distinct; the vocabulary repeats "
                             f"{len(self.tokens) - len(self.vocab)} of them")
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not 0 <= validate.integer(name, value) < len(self.tokens):
                raise ValueError(f"{name} must be an id in [0, {len(self.tokens)}); got {value}")
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        alphabet = byte_alphabet()
        to_byte = {char: byte for byte, char in enumerate(alphabet)}
        self.special_tokens = tuple(token for token, kind in zip(self.tokens, self.token_types)
                                    if kind in (CONTROL, USER_DEFINED))
        self._control = frozenset(self.vocab[token] for token, kind
                                  in zip(self.tokens, self.token_types) if kind == CONTROL)
        self._special_pattern = special_token_pattern(self.special_tokens)
        self._id_bytes = []
        for index, (token, kind) in enumerate(zip(self.tokens, self.token_types)):
            if kind in (CONTROL, USER_DEFINED):
                self._id_bytes.append(token.encode("utf-8"))
            elif kind == NORMAL and token and all(char in to_byte for char in token):
                self._id_bytes.append(bytes(to_byte[char] for char in token))
            else:
                raise ValueError(f"token {index} ({token!r}, type {kind}) must be a normal "
                                 "token spelled in the byte alphabet, or a control or "
                                 "user-defined token")
        self._byte_ids = [self.vocab.get(char) for char in alphabet]   # None: no such token
        self._ranks, self._merged_ids = self._checked_merges(merges)

    def _checked_merges(self, merges) -> tuple[dict, dict]:
        ranks, merged_ids = {}, {}
        for rank, merge in enumerate(merges):
            parts = merge.split(" ") if isinstance(merge, str) else ()
            if len(parts) != 2 or not all(part in self.vocab for part in parts) \
                    or "".join(parts) not in self.vocab:
                raise ValueError(f"merges[{rank}] must be two tokens of the vocabulary joined "
                                 f"by one space, whose concatenation is a token; got {merge!r}")
            pair = (self.vocab[parts[0]], self.vocab[parts[1]])
            if pair in ranks:
                raise ValueError(f"merges[{rank}] repeats merges[{ranks[pair]}] ({merge!r})")
            ranks[pair], merged_ids[pair] = rank, self.vocab["".join(parts)]
        return ranks, merged_ids

    @classmethod
    def from_data(cls, data: dict) -> "GGUFTokenizer":
        """The tokenizer described by load_gguf's tokenizer_data (GGUF `tokenizer.*` fields)."""
        if data.get("model") != "gpt2":
            raise ValueError(f"tokenizer model must be 'gpt2' (byte-level BPE); the file says "
                             f"{data.get('model')!r}")
        pre = data.get("pre", "gpt2")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"pre-tokenizer {pre!r} is not implemented; numpy_tf knows "
                             f"{sorted(PRE_TOKENIZERS)}")
        if data.get("add_bos_token") or data.get("add_eos_token"):
            raise ValueError("the file asks for BOS/EOS to be added to every text, which "
                             "numpy_tf's GGUFTokenizer does not do")
        for key, kind, name in (("tokens", str, "strings"), ("merges", str, "strings"),
                                ("token_type", numbers.Integral, "integers")):
            value = data.get(key, [] if key == "token_type" else None)
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(item, kind) and not isinstance(item, bool) for item in value):
                raise ValueError(f"tokenizer field {key!r} must be a list of {name}; got "
                                 f"{str(value)[:80]}")
        return cls(data["tokens"], data["merges"], data.get("token_type"), pre=pre,
                   bos_id=data.get("bos_token_id"), eos_id=data.get("eos_token_id"),
                   pad_id=data.get("padding_token_id"), chat_template=data.get("chat_template"))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def is_special(self, token_id: int) -> bool:
        """True for a CONTROL token (<|im_start|>, <|endoftext|>, ...)."""
        return token_id in self._control

    def token_bytes(self, token_id: int) -> bytes:
        token_id = validate.integer("token_id", token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token_id must be in [0, {self.vocab_size}); got {token_id}")
        return self._id_bytes[token_id]

    def pretokenize(self, text: str) -> list[str]:
        """The pieces merges stay inside (plain text, no special tokens)."""
        return self._split(_checked_text(text))

    def encode(self, text: str, parse_special: bool = True, missing_bytes: str = "error"):
        """Token ids (N,) int64. `parse_special=False` spells special tokens' text as plain text;
        `missing_bytes="skip"` drops bytes without a token, as HF does, instead of refusing."""
        text = _checked_text(text)
        validate.choice("missing_bytes", missing_bytes, ("error", "skip"))
        pieces = split_at_special(text, self._special_pattern, self.vocab) if parse_special \
            else [text]
        ids: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
                continue
            for word in self._split(piece):
                ids.extend(bpe.apply_merges(self._byte_ids_of(word, missing_bytes), self._ranks,
                                            merged_ids=self._merged_ids))
        return np.array(ids, dtype=np.int64)

    def _byte_ids_of(self, word: str, missing_bytes: str) -> tuple[int, ...]:
        ids = []
        for byte in word.encode("utf-8"):
            token_id = self._byte_ids[byte]
            if token_id is None and missing_bytes == "error":
                char = next(char for char in word if byte in char.encode("utf-8"))
                raise ValueError(f"text contains {char!r} (U+{ord(char):04X}), whose byte "
                                 f"0x{byte:02X} has no token in this vocabulary; pass "
                                 "missing_bytes='skip' to drop such bytes (as HF does)")
            if token_id is not None:
                ids.append(token_id)
        return tuple(ids)

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids`: all bytes joined, then decoded from UTF-8 once (bytes that are
        not UTF-8 become U+FFFD). `skip_special` leaves out CONTROL tokens."""
        ids = validate.token_ids("ids", ids, size=self.vocab_size)
        chunks = [self._id_bytes[token_id] for token_id in ids.tolist()
                  if not (skip_special and token_id in self._control)]
        return b"".join(chunks).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt this file's chat template renders (only SmolLM2's template is known)."""
        if self.chat_template != SMOLLM2_CHAT_TEMPLATE:
            raise ValueError("this tokenizer's chat template is not SmolLM2's, the only one "
                             "numpy_tf renders; render it with jinja2 instead")
        return smollm2_chat(messages, add_generation_prompt)

    def __repr__(self) -> str:
        return (f"GGUFTokenizer(vocab_size={self.vocab_size}, merges={len(self._ranks)}, "
                f"pre={self.pre!r}, special_tokens={len(self.special_tokens)})")


def smollm2_chat(messages, add_generation_prompt: bool = True) -> str:
    """SmolLM2-Instruct's chat template, by hand: the default system message first unless the
    first message is a system message, then `<|im_start|>{role}\\n{content}<|im_end|>\\n` per
    message, then `<|im_start|>assistant\\n` when `add_generation_prompt`."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role': str, 'content': str}} dicts; "
                        f"got {type(messages).__name__}")
    validate.flag("add_generation_prompt", add_generation_prompt)
    parts = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not all(
                isinstance(message.get(key), str) for key in ("role", "content")):
            raise ValueError(f"messages[{position}] must be a dict with str 'role' and "
                             f"'content'; got {message!r}")
        if position == 0 and message["role"] != "system":
            parts.append(f"<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n")
        parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)
