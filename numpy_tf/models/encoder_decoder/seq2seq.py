"""A sequence-to-sequence model: the encoder-decoder Transformer of "Attention Is All You Need"
with a token embedding for each side, sinusoidal positions and an output head (none tied).

    src_ids (B, S) -> src_embedding (B, S, C) [* sqrt(C)] + PE -> encoder -> memory (B, S, C)
    tgt_ids (B, T) -> tgt_embedding (B, T, C) [* sqrt(C)] + PE -> decoder(., memory) (B, T, C)
                   -> output (B, T, V) logits

Feature inputs (`src_features=F`, as speech models read filter-bank frames): the source is
(B, S, F) float vectors, and a Linear front end `src_projection` (F -> C, with bias) takes the
place of the source token embedding (there is then no src_embedding, and src_vocab_size must
be None):

    src (B, S, F) -> src_projection (B, S, C) + PE -> encoder -> memory (B, S, C)

(`scale_embeddings` scales the token embeddings only; the projection is not scaled.)
`final_norms=False` leaves out the final LayerNorms of both stacks (transformer.encoder.norm,
transformer.decoder.norm), which torch.nn.Transformer always has: a Post-LN stack already ends
in its last layer's LayerNorm, and many encoder-decoder codebases build it so.

Training is teacher forcing: the decoder reads BOS + target and is trained to predict target +
EOS, every position at once; the causal mask keeps position t from seeing t + 1 .., and the
source padding mask is also the memory's, so no position attends to source padding
(numpy_tf.data.reverse_digits makes exactly these arrays; numpy_tf.objectives.Seq2SeqLoss is the
loss).

`scale_embeddings`: "Attention Is All You Need" (section 3.4) multiplies the embeddings by
sqrt(d_model) before adding the positions. The default, False, adds the positions to the
unscaled embeddings; True gives the paper's.

Parameter names: src_embedding.weight (or src_projection.weight, src_projection.bias),
tgt_embedding.weight, transformer.* (torch.nn.Transformer's keys), output.weight, output.bias. Generation: `encode` once, then `decode` step by step with
`past_kv` (the decoder's self-attention cache) and `static_kv` (the memory's keys and values),
both returned in the decode cache (`present`, `cross_kv`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from ...core import validate
from ...core.module import Module
from ...layers.embedding import Embedding, EmbeddingCache
from ...layers.linear import Linear, LinearCache
from ...layers.positions import SinusoidalPositions
from ...text.datasets import DIGIT_VOCAB_SIZE
from .. import checks
from ..resize import check_new_size, normal, resize_embedding, resize_head, uniform
from .layers import ACTIVATIONS
from .transformer import DecoderCache, StackCache, Transformer


@dataclass(frozen=True)
class Seq2SeqConfig:
    src_vocab_size: int | None = DIGIT_VOCAB_SIZE   # None with src_features: no source ids
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
    src_features: int | None = None     # F: the source is (B, S, F) vectors, read by a Linear
    final_norms: bool = True            # the stacks' final LayerNorms (torch always has them)

    def __post_init__(self):
        integer, flag = validate.positive_int, validate.flag
        validate.config_fields(self, {
            "final_norms": flag, "tgt_vocab_size": integer,
            "src_vocab_size": validate.optional(integer),
            "src_features": validate.optional(integer), "d_model": integer, "nhead": integer,
            "num_encoder_layers": integer, "num_decoder_layers": integer,
            "dim_feedforward": integer, "dropout": validate.bounded(0.0, 1.0, high_open=True),
            "activation": validate.one_of(*ACTIVATIONS),
            "layer_norm_eps": validate.positive_float, "norm_first": flag, "bias": flag,
            "scale_embeddings": flag})
        if self.d_model % self.nhead:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by nhead "
                             f"({self.nhead})")
        if self.src_features is None:
            if self.src_vocab_size is None:
                raise ValueError("Seq2SeqConfig needs src_vocab_size (the source is token ids) "
                                 "or src_features (the source is feature vectors); got neither")
        else:
            if self.src_vocab_size is not None:
                raise ValueError(f"Seq2SeqConfig with src_features={self.src_features} reads "
                                 "feature vectors, so the source has no vocabulary: give "
                                 f"src_vocab_size=None; got src_vocab_size={self.src_vocab_size}")

    def transformer_kwargs(self) -> dict:
        """The torch.nn.Transformer(...) keyword arguments of the model's Transformer."""
        names = ("d_model", "nhead", "num_encoder_layers", "num_decoder_layers",
                 "dim_feedforward", "dropout", "activation", "layer_norm_eps", "norm_first",
                 "bias")
        return {name: getattr(self, name) for name in names} | {"batch_first": True}

    def to_dict(self) -> dict:
        return asdict(self)


class EmbedCache(NamedTuple):
    tokens: EmbeddingCache | LinearCache  # the ids (B, L) looked up, or the features projected
    positions: None         # the sinusoidal table is a constant


class EncodeCache(NamedTuple):
    embedding: EmbedCache   # src -> x (B, S, C)
    encoder: StackCache     # x -> memory (B, S, C)
    memory: np.ndarray      # (B, S, C) the encoder's output (the array returned, not a copy)

    @property
    def output_spec(self):  # the (shape, dtype) of the memory: dmemory's
        return self.memory.shape, self.memory.dtype


class DecodeCache(NamedTuple):
    embedding: EmbedCache   # tgt_ids -> y (B, T, C)
    decoder: DecoderCache   # y, memory -> h (B, T, C)
    output: LinearCache     # h -> logits (B, T, V)
    present: list           # per decoder layer, the self-attention KVCache: the next past_kv
    cross_kv: list          # per decoder layer, the memory's KVCache: the next static_kv

    @property
    def output_spec(self):  # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.output)


class Seq2SeqCache(NamedTuple):
    encode: EncodeCache     # src -> memory
    decode: DecodeCache     # tgt_ids, memory -> logits

    @property
    def output_spec(self):  # the (shape, dtype) of the logits: dlogits's
        return self.decode.output_spec


class Seq2Seq(Module):
    """forward(src, tgt_ids, src_key_padding_mask=None, tgt_key_padding_mask=None, rng=None)
    -> (logits (B, T, V), cache); backward(dlogits, cache) -> None. `src` is (B, S) ids, or
    (B, S, F) feature vectors with `src_features=F` (backward then returns dsrc)."""

    def __init__(self, config: Seq2SeqConfig = Seq2SeqConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"config must be a Seq2SeqConfig; got {type(config).__name__}")
        rng = np.random.default_rng(rng)
        self.config = c = config
        if c.src_features is None:
            self.src_embedding = Embedding(c.src_vocab_size, c.d_model, rng=rng, dtype=dtype)
        else:
            self.src_projection = Linear(c.src_features, c.d_model, rng=rng, dtype=dtype)
        self.tgt_embedding = Embedding(c.tgt_vocab_size, c.d_model, rng=rng, dtype=dtype)
        self.positions = SinusoidalPositions(c.d_model, dtype)
        self.transformer = Transformer(**c.transformer_kwargs(), final_norms=c.final_norms,
                                       rng=rng, dtype=dtype)
        self.output = Linear(c.d_model, c.tgt_vocab_size, rng=rng, dtype=dtype)
        self.scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0

    def resize_token_embeddings(self, new_num_tokens: int, *, rng: np.random.Generator,
                                side: str = "both") -> None:
        """A vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): `side`
        "tgt" resizes tgt_embedding and the output head (weight and bias), "src" the
        src_embedding, "both" (a vocabulary both sides share, the default) all three; the new
        rows as the model draws them, from `rng`: embeddings N(0, 1) (torch's Embedding), the
        head U(+-1/sqrt(d_model)) (torch's Linear). The config's vocabulary sizes follow. A
        source of feature vectors has no vocabulary: "both" is then the target's."""
        n = check_new_size(new_num_tokens)
        validate.choice("side", side, ("both", "src", "tgt"))
        rng = validate.generator("rng", rng)
        c = self.config
        if side == "src" and c.src_features is not None:
            raise ValueError(f"side 'src': the source is feature vectors (src_features="
                             f"{c.src_features}), it has no vocabulary to resize")
        changes = {}
        if side in ("both", "src") and c.src_features is None:
            resize_embedding(self.src_embedding, n, normal(rng, 1.0, self.dtype))
            changes["src_vocab_size"] = n
        if side in ("both", "tgt"):
            resize_embedding(self.tgt_embedding, n, normal(rng, 1.0, self.dtype))
            head = uniform(rng, c.d_model, self.dtype)
            resize_head(self.output, n, head, head)
            changes["tgt_vocab_size"] = n
        self.config = replace(c, **changes)

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

    def _project(self, features):
        """x = src_projection(features) + PE: (B, S, F) -> (B, S, C)."""
        x, projection = self.src_projection.forward(features)       # (B, S, C)
        x, positions = self.positions.forward(x)                    # (B, S, C)
        return x, EmbedCache(projection, positions)

    def _project_backward(self, dx, cache: EmbedCache):
        """Returns dfeatures (B, S, F)."""
        dx = self.positions.backward(dx, cache.positions)           # x = x + PE
        return self.src_projection.backward(dx, cache.tokens)       # x = src_projection(features)

    def check_source(self, src) -> None:
        """src (B, S) ids in range, or (B, S, F) float features of the model's dtype."""
        c = self.config
        if c.src_features is None:
            validate.integer_array("src", src, ndim=2, shape="(B, S) ids")
            validate.ids_in_range("src", src, c.src_vocab_size)
            return
        validate.float_array("src", src, ndim=3, shape="(B, S, F) features")
        validate.last_dim("src", src, c.src_features, "src_features")
        if src.dtype != self.dtype:
            raise TypeError(f"src has dtype {src.dtype} but the model's parameters are "
                            f"{self.dtype}; numpy_tf never casts silently")

    def encode(self, src, src_key_padding_mask=None, rng=None):
        """src (B, S) ids or (B, S, F) features -> (memory (B, S, C), EncodeCache)."""
        self.check_source(src)
        if self.config.src_features is None:
            x, embedding = self._embed(self.src_embedding, src)     # (B, S, C)
        else:
            x, embedding = self._project(src)                       # (B, S, C)
        memory, encoder = self.transformer.encoder.forward(x, None, src_key_padding_mask,
                                                           None, rng)  # (B, S, C)
        return memory, EncodeCache(embedding, encoder, memory)

    def encode_backward(self, dmemory, cache: EncodeCache):
        """The encoder side in exact reverse; returns dsrc (B, S, F) for feature inputs, None
        for ids (integers have no gradient). dmemory must have exactly the memory's shape
        (B, S, C) and dtype."""
        validate.backward_inputs(dmemory, cache, EncodeCache, "dmemory")
        dx = self.transformer.encoder.backward(dmemory, cache.encoder)  # memory = encoder(x)
        if self.config.src_features is not None:
            return self._project_backward(dx, cache.embedding)      # x = project(src)
        self._embed_backward(self.src_embedding, dx, cache.embedding)  # x = embed(src)
        return None

    def decode(self, tgt_ids, memory, src_key_padding_mask=None, tgt_key_padding_mask=None,
               rng=None, *, past_kv=None, static_kv=None):
        """tgt_ids (B, T) at positions P .. P + T - 1 (P = the past_kv length) -> (logits
        (B, T, V), DecodeCache). With static_kv, memory is None; tgt_key_padding_mask covers
        the P + T positions."""
        c = self.config
        validate.integer_array("tgt_ids", tgt_ids, ndim=2, shape="(B, T)")
        validate.ids_in_range("tgt_ids", tgt_ids, c.tgt_vocab_size)
        heads = dict(batch=tgt_ids.shape[0], heads=c.nhead, head_dim=c.d_model // c.nhead,
                     dtype=self.dtype)
        offset = checks.past_kv(past_kv, c.num_decoder_layers, **heads)
        checks.past_kv(static_kv, c.num_decoder_layers, **heads, legend="B, H, S, d",
                       name="static_kv")
        y, embedding = self._embed(self.tgt_embedding, tgt_ids, offset)  # (B, T, C)
        h, decoder = self.transformer.decoder.forward(
            y, memory, None, None, tgt_key_padding_mask, src_key_padding_mask,
            tgt_is_causal=True, rng=rng, past_kv=past_kv, static_kv=static_kv)  # (B, T, C)
        logits, output = self.output.forward(h)                     # (B, T, V)
        return logits, DecodeCache(embedding, decoder, output, decoder.present,
                                   decoder.cross_kv)

    def decode_backward(self, dlogits, cache: DecodeCache):
        """Returns dmemory (None when static_kv stood for the memory). dlogits must have
        exactly the logits' shape (B, T, V) and dtype."""
        validate.backward_inputs(dlogits, cache, DecodeCache, "dlogits")
        dh = self.output.backward(dlogits, cache.output)            # logits = output(h)
        dy, dmemory = self.transformer.decoder.backward(dh, cache.decoder)  # h = decoder(y, memory)
        self._embed_backward(self.tgt_embedding, dy, cache.embedding)  # y = embed(tgt_ids)
        return dmemory

    def forward(self, src, tgt_ids, src_key_padding_mask=None, tgt_key_padding_mask=None,
                rng=None):
        self.check_source(src)
        validate.integer_array("tgt_ids", tgt_ids, ndim=2, shape="(B, T)")
        if src.shape[0] != tgt_ids.shape[0]:
            raise ValueError(f"src and tgt_ids must have the same batch size; got "
                             f"{src.shape[0]} and {tgt_ids.shape[0]}")
        validate.ids_in_range("tgt_ids", tgt_ids, self.config.tgt_vocab_size)
        validate.mask_array("src_key_padding_mask", src_key_padding_mask,
                            {"(B, S)": src.shape[:2]}, self.dtype, "padding")
        validate.mask_array("tgt_key_padding_mask", tgt_key_padding_mask,
                            {"(B, T)": tgt_ids.shape}, self.dtype, "padding")
        memory, encode = self.encode(src, src_key_padding_mask, rng)  # (B, S, C)
        logits, decode = self.decode(tgt_ids, memory, src_key_padding_mask,
                                     tgt_key_padding_mask, rng)     # (B, T, V)
        return logits, Seq2SeqCache(encode, decode)

    def backward(self, dlogits, cache: Seq2SeqCache):
        """The forward in exact reverse: the decoder side, then the encoder with the memory's
        gradient. Returns dsrc for feature inputs, None for ids (integers have no gradient)."""
        validate.backward_inputs(dlogits, cache, Seq2SeqCache, "dlogits")
        dmemory = self.decode_backward(dlogits, cache.decode)       # logits = decode(tgt, memory)
        return self.encode_backward(dmemory, cache.encode)          # memory = encode(src)
