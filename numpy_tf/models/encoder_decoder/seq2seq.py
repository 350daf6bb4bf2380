"""A sequence-to-sequence model: the encoder-decoder Transformer of "Attention Is All You Need"
with a token embedding for each side, sinusoidal positions and an output head (none tied).

    src_ids (B, S) -> src_embedding (B, S, C) [* sqrt(C)] + PE -> encoder -> memory (B, S, C)
    tgt_ids (B, T) -> tgt_embedding (B, T, C) [* sqrt(C)] + PE -> decoder(., memory) (B, T, C)
                   -> output (B, T, V) logits

Training is teacher forcing: the decoder reads BOS + target and is trained to predict target +
EOS, every position at once; the causal mask keeps position t from seeing t + 1 .., and the
source padding mask is also the memory's, so no position attends to source padding
(numpy_tf.data.reverse_digits makes exactly these arrays; numpy_tf.objectives.Seq2SeqLoss is the
loss).

`scale_embeddings`: "Attention Is All You Need" (section 3.4) multiplies the embeddings by
sqrt(d_model) before adding the positions. The default, False, adds the positions to the
unscaled embeddings; True gives the paper's.

Parameter names: src_embedding.weight, tgt_embedding.weight, transformer.* (torch.nn.Transformer's
keys), output.weight, output.bias. Generation: `encode` once, then `decode` step by step with
`past_kv` (the decoder's self-attention cache) and `static_kv` (the memory's keys and values),
both returned in the decode cache (`present`, `cross_kv`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ...core import validate
from ...core.module import Module
from ...layers.embedding import Embedding, EmbeddingCache
from ...layers.linear import Linear, LinearCache
from ...layers.positions import SinusoidalPositions
from ...text.datasets import DIGIT_VOCAB_SIZE
from .transformer import DecoderCache, StackCache, Transformer


@dataclass(frozen=True)
class Seq2SeqConfig:
    src_vocab_size: int = DIGIT_VOCAB_SIZE
    tgt_vocab_size: int = DIGIT_VOCAB_SIZE
    d_model: int = 32
    nhead: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    dim_feedforward: int = 64
    dropout: float = 0.0
    activation: str = "relu"            # "relu" or "gelu" (exact), as torch's strings
    layer_norm_eps: float = 1e-5
    norm_first: bool = False            # Post-LN (torch's default) or Pre-LN
    bias: bool = True
    scale_embeddings: bool = False      # multiply the embeddings by sqrt(d_model) (the paper)

    def transformer_kwargs(self) -> dict:
        """The torch.nn.Transformer(...) keyword arguments of the model's Transformer."""
        names = ("d_model", "nhead", "num_encoder_layers", "num_decoder_layers",
                 "dim_feedforward", "dropout", "activation", "layer_norm_eps", "norm_first",
                 "bias")
        return {name: getattr(self, name) for name in names} | {"batch_first": True}

    def to_dict(self) -> dict:
        return asdict(self)


class EmbedCache(NamedTuple):
    tokens: EmbeddingCache  # the ids (B, L) looked up
    positions: None         # the sinusoidal table is a constant


class EncodeCache(NamedTuple):
    embedding: EmbedCache   # src_ids -> x (B, S, C)
    encoder: StackCache     # x -> memory (B, S, C)


class DecodeCache(NamedTuple):
    embedding: EmbedCache   # tgt_ids -> y (B, T, C)
    decoder: DecoderCache   # y, memory -> h (B, T, C)
    output: LinearCache     # h -> logits (B, T, V)
    present: list           # per decoder layer, the self-attention KVCache: the next past_kv
    cross_kv: list          # per decoder layer, the memory's KVCache: the next static_kv


class Seq2SeqCache(NamedTuple):
    encode: EncodeCache     # src_ids -> memory
    decode: DecodeCache     # tgt_ids, memory -> logits


class Seq2Seq(Module):
    """forward(src_ids, tgt_ids, src_key_padding_mask=None, tgt_key_padding_mask=None, rng=None)
    -> (logits (B, T, V), cache); backward(dlogits, cache) -> None."""

    def __init__(self, config: Seq2SeqConfig = Seq2SeqConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        self.config = c = config
        self.src_embedding = Embedding(c.src_vocab_size, c.d_model, rng=rng, dtype=dtype)
        self.tgt_embedding = Embedding(c.tgt_vocab_size, c.d_model, rng=rng, dtype=dtype)
        self.positions = SinusoidalPositions(c.d_model, dtype)
        self.transformer = Transformer(**c.transformer_kwargs(), rng=rng, dtype=dtype)
        self.output = Linear(c.d_model, c.tgt_vocab_size, rng=rng, dtype=dtype)
        self.scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0

    def _embed(self, embedding: Embedding, ids, offset: int = 0):
        """x = scale E[ids] + PE[offset ..]: ids (B, L) -> x (B, L, C), for either side."""
        x, tokens = embedding.forward(ids)                          # (B, L, C)
        if self.scale != 1.0:
            x = x * self.scale
        x, positions = self.positions.forward(x, offset)            # (B, L, C)
        return x, EmbedCache(tokens, positions)

    def _embed_backward(self, embedding: Embedding, dx, cache: EmbedCache) -> None:
        """The table's rows get scale dx (PE is a constant)."""
        dx = self.positions.backward(dx, cache.positions)           # x = x + PE[offset ..]
        if self.scale != 1.0:
            dx = dx * self.scale                                    # x = x * scale
        embedding.backward(dx, cache.tokens)                        # x = E[ids]

    def encode(self, src_ids, src_key_padding_mask=None, rng=None):
        """src_ids (B, S) -> (memory (B, S, C), EncodeCache)."""
        validate.integer_array("src_ids", src_ids, ndim=2, shape="(B, S)")
        x, embedding = self._embed(self.src_embedding, src_ids)     # (B, S, C)
        memory, encoder = self.transformer.encoder.forward(x, None, src_key_padding_mask,
                                                           None, rng)  # (B, S, C)
        return memory, EncodeCache(embedding, encoder)

    def encode_backward(self, dmemory, cache: EncodeCache) -> None:
        """The encoder side in exact reverse; returns None (integer ids have no gradient)."""
        dx = self.transformer.encoder.backward(dmemory, cache.encoder)  # memory = encoder(x)
        self._embed_backward(self.src_embedding, dx, cache.embedding)  # x = embed(src_ids)

    def decode(self, tgt_ids, memory, src_key_padding_mask=None, tgt_key_padding_mask=None,
               rng=None, *, past_kv=None, static_kv=None):
        """tgt_ids (B, T) at positions P .. P + T - 1 (P = the past_kv length) -> (logits
        (B, T, V), DecodeCache). With static_kv, memory is None; tgt_key_padding_mask covers
        the P + T positions."""
        validate.integer_array("tgt_ids", tgt_ids, ndim=2, shape="(B, T)")
        offset = 0 if past_kv is None else past_kv[0][0].shape[2]
        y, embedding = self._embed(self.tgt_embedding, tgt_ids, offset)  # (B, T, C)
        h, decoder = self.transformer.decoder.forward(
            y, memory, None, None, tgt_key_padding_mask, src_key_padding_mask,
            tgt_is_causal=True, rng=rng, past_kv=past_kv, static_kv=static_kv)  # (B, T, C)
        logits, output = self.output.forward(h)                     # (B, T, V)
        return logits, DecodeCache(embedding, decoder, output, decoder.present,
                                   decoder.cross_kv)

    def decode_backward(self, dlogits, cache: DecodeCache):
        """Returns dmemory (None when static_kv stood for the memory)."""
        dh = self.output.backward(dlogits, cache.output)            # logits = output(h)
        dy, dmemory = self.transformer.decoder.backward(dh, cache.decoder)  # h = decoder(y, memory)
        self._embed_backward(self.tgt_embedding, dy, cache.embedding)  # y = embed(tgt_ids)
        return dmemory

    def forward(self, src_ids, tgt_ids, src_key_padding_mask=None, tgt_key_padding_mask=None,
                rng=None):
        validate.integer_array("src_ids", src_ids, ndim=2, shape="(B, S)")
        validate.integer_array("tgt_ids", tgt_ids, ndim=2, shape="(B, T)")
        if src_ids.shape[0] != tgt_ids.shape[0]:
            raise ValueError(f"src_ids and tgt_ids must have the same batch size; got "
                             f"{src_ids.shape[0]} and {tgt_ids.shape[0]}")
        validate.ids_in_range("src_ids", src_ids, self.config.src_vocab_size)
        validate.ids_in_range("tgt_ids", tgt_ids, self.config.tgt_vocab_size)
        validate.mask_array("src_key_padding_mask", src_key_padding_mask,
                            {"(B, S)": src_ids.shape}, self.dtype, "padding")
        validate.mask_array("tgt_key_padding_mask", tgt_key_padding_mask,
                            {"(B, T)": tgt_ids.shape}, self.dtype, "padding")
        memory, encode = self.encode(src_ids, src_key_padding_mask, rng)  # (B, S, C)
        logits, decode = self.decode(tgt_ids, memory, src_key_padding_mask,
                                     tgt_key_padding_mask, rng)     # (B, T, V)
        return logits, Seq2SeqCache(encode, decode)

    def backward(self, dlogits, cache: Seq2SeqCache):
        """The forward in exact reverse: the decoder side, then the encoder with the memory's
        gradient. Returns None (integer ids have no gradient)."""
        dmemory = self.decode_backward(dlogits, cache.decode)       # logits = decode(tgt, memory)
        self.encode_backward(dmemory, cache.encode)                 # memory = encode(src_ids)
        return None
