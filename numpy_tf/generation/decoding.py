"""Decoding with a KV cache.

The KV cache is run state, passed in and returned, never stored on a layer: a model's forward
takes `past_kv` (one (k, v) per block, the keys and values of every earlier position) and its
cache returns `present`, the same grown by the new positions. So after the prompt, each new
token costs one position's worth of work instead of a forward over the whole prefix. Each new
token is drawn by `sample_next` (generation/sampling.py).
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from ..core.module import Module
from .sampling import check_sampling, sample_next


def _max_context(model: Module) -> int | None:
    return getattr(getattr(model, "config", None), "max_context", None)


def _check_token(name: str, value, vocab_size: int | None) -> int | None:
    """None, or a token id: an integer in [0, vocab_size) when the model's config says V."""
    if vocab_size is None:
        return validate.optional(validate.non_negative_int)(name, value)
    return validate.optional_index(name, value, vocab_size, "a token of the model's vocabulary")


def generate(model: Module, prompt: np.ndarray, max_new_tokens: int, *,
             rng: np.random.Generator | None = None, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             use_cache: bool = True, slide: bool = False) -> np.ndarray:
    """Continue `prompt` (B, T0) by up to `max_new_tokens` tokens; returns (B, T0 + n).

    With use_cache (the default) the prompt runs once and each new token is one position
    through the model with `past_kv`; without, every step recomputes the whole prefix (the
    slow way, kept to check the fast one against). Generation stops early once every sequence
    has produced `eos_id`; a sequence that finished keeps receiving eos_id.

    A model with learned positions sees at most max_context tokens: a longer request is an
    error, unless `slide`, which, once the context is full, recomputes each step over the
    last max_context tokens (without a cache: their positions have all moved)."""
    if not isinstance(model, Module):
        raise TypeError(f"model must be a numpy_tf model (a Module whose forward gives logits); "
                        f"got {type(model).__name__}")
    validate.integer_array("prompt", prompt, ndim=2, shape="(B, T)")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab_size is not None:          # the model would name the ids it was given "ids"
        validate.ids_in_range("prompt", prompt, vocab_size)
    max_new_tokens = validate.non_negative_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    eos_id = _check_token("eos_id", eos_id, vocab_size)
    validate.flag("use_cache", use_cache)
    validate.flag("slide", slide)
    if temperature > 0:
        validate.generator("rng", rng)
    if prompt.shape[1] == 0:
        raise ValueError("prompt must hold at least one token per sequence; got shape "
                         f"{prompt.shape}")
    limit = _max_context(model)
    if limit is not None and prompt.shape[1] > limit:
        raise ValueError(f"prompt has {prompt.shape[1]} tokens, more than the model's "
                         f"max_context = {limit} learned positions")
    if limit is not None and prompt.shape[1] + max_new_tokens > limit and not slide:
        raise ValueError(f"prompt has {prompt.shape[1]} tokens and {max_new_tokens} more were "
                         f"asked for, beyond the model's max_context = {limit} learned "
                         f"positions; ask for at most {max(0, limit - prompt.shape[1])} tokens")
    tokens = prompt.astype(np.int64)
    finished = np.zeros(len(tokens), dtype=bool)
    past, step_input = None, tokens
    for _ in range(max_new_tokens):
        if limit is not None and tokens.shape[1] >= limit:      # slide: a full window each step
            logits, _ = model.forward(tokens[:, -limit:])
        elif use_cache:
            logits, cache = model.forward(step_input, past_kv=past)
            past = cache.present
        else:
            logits, _ = model.forward(tokens)
        next_ids = sample_next(logits[:, -1], rng, temperature, top_k, top_p)
        if eos_id is not None:
            next_ids = np.where(finished, eos_id, next_ids)
            finished |= next_ids == eos_id
        tokens = np.concatenate([tokens, next_ids[:, None]], axis=1)
        step_input = next_ids[:, None]
        if eos_id is not None and finished.all():
            break
    return tokens


def generate_seq2seq(model: Module, src: np.ndarray, max_new_tokens: int, bos_id: int,
                     eos_id: int | None = None, *, src_key_padding_mask=None,
                     rng: np.random.Generator | None = None, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None,
                     use_cache: bool = True) -> np.ndarray:
    """Decode a target for each source with an encoder-decoder (numpy_tf.Seq2Seq): the source
    is encoded once; the cross-attention keys and values of that memory are computed at the
    first step and passed as `static_kv` after; the decoder's self-attention grows a KV cache.
    `src` is what the model's encoder reads: (B, S) ids, or (B, S, F) feature vectors for a
    Seq2Seq with src_features. Returns (B, 1 + n) ids starting with bos_id (greedy by
    default)."""
    if not isinstance(model, Module) or not callable(getattr(model, "check_source", None)):
        raise TypeError("model must be an encoder-decoder (numpy_tf.Seq2Seq); got "
                        f"{type(model).__name__}")
    model.check_source(src)
    max_new_tokens = validate.non_negative_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    vocab_size = getattr(getattr(model, "config", None), "tgt_vocab_size", None)
    bos_id = _check_token("bos_id", bos_id, vocab_size)
    if bos_id is None:
        raise ValueError("bos_id must be the token id every target starts with; got None")
    eos_id = _check_token("eos_id", eos_id, vocab_size)
    validate.flag("use_cache", use_cache)
    if temperature > 0:
        validate.generator("rng", rng)
    memory, _ = model.encode(src, src_key_padding_mask)
    tokens = np.full((len(src), 1), bos_id, dtype=np.int64)
    finished = np.zeros(len(src), dtype=bool)
    past = static = None
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = model.decode(tokens[:, -1:], None if static else memory,
                                         src_key_padding_mask, past_kv=past, static_kv=static)
            past, static = cache.present, cache.cross_kv
        else:
            logits, _ = model.decode(tokens, memory, src_key_padding_mask)
        next_ids = sample_next(logits[:, -1], rng, temperature, top_k, top_p)
        if eos_id is not None:
            next_ids = np.where(finished, eos_id, next_ids)
            finished |= next_ids == eos_id
        tokens = np.concatenate([tokens, next_ids[:, None]], axis=1)
        if eos_id is not None and finished.all():
            break
    return tokens
