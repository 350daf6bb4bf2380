"""The encoder-only model (BERT; HF BertForMaskedLM): every token sees every other token, and a
masked-language-model head predicts the tokens that were hidden from the input.

Shapes: B batch, T length, C hidden_size, F intermediate_size, H heads, V vocab_size,
P max_position_embeddings, S type_vocab_size (segments).

    ids (B, T) -> word_embeddings (B, T, C) + token_type_embeddings[token_type_ids]
               + position_embeddings[0 .. T-1] -> LayerNorm -> dropout          embeddings
               -> N encoder layers (bidirectional; key_padding_mask True at padding)
               [-> a final LayerNorm, Pre-LN only] -> hidden (B, T, C)              encoder
    hidden -> dense (C, C) -> activation -> LayerNorm -> decoder (V, C) + bias
               -> logits (B, T, V)                                                  mlm_head

The encoder layers ARE numpy_tf's TransformerEncoderLayer (torch.nn.TransformerEncoderLayer):
BERT's layer is its Post-LN form, y = LN(x + f(x)) for the attention and then the feed-forward
network, with biases everywhere and the exact (erf) GELU; norm_first=True gives the Pre-LN form,
and then the stack ends with a LayerNorm of its own (`encoder.norm`, as Pre-LN encoders do: a
Pre-LN residual stream is never normalised otherwise). HF's separate query, key and value
Linears are the three blocks of the layer's in_proj_weight; numpy_tf.interop joins and splits
them.

Optional parts: `type_vocab_size=0` drops the segment table, `position_embeddings=False` the
position table (the model is then permutation-equivariant: permuting the tokens permutes the
logits). With tie_word_embeddings the decoder's weight is the word embedding: one Parameter
whose gradient is the sum of its two uses. HF's attention_mask (1 = real, 0 = padding) is
`key_padding_mask = attention_mask == 0` here; a padded position still gets logits (its query
attends to the real tokens) but no real position ever attends to it.

Parameter names: embeddings.word_embeddings.weight, embeddings.position_embeddings.weight,
embeddings.token_type_embeddings.weight, embeddings.norm.{weight,bias},
encoder.layers.0.self_attn.in_proj_weight, ... (torch's TransformerEncoder keys),
mlm_head.dense.*, mlm_head.norm.*, mlm_head.decoder.{weight,bias}.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..layers.activations import activation as make_activation
from ..layers.dropout import Dropout, DropoutCache
from ..layers.embedding import Embedding, EmbeddingCache, normal_init
from ..layers.linear import Linear, LinearCache
from ..layers.multihead import TorchMultiheadAttention
from ..layers.norm import LayerNorm, LayerNormCache
from ..layers.positions import LearnedPositions, LearnedPositionsCache
from . import checks
from .encoder_decoder.layers import ACTIVATIONS, TransformerEncoderLayer
from .encoder_decoder.transformer import StackCache, TransformerEncoder
from .resize import check_new_size, normal, resize_embedding, resize_head, zeros


@dataclass(frozen=True)
class BertConfig:
    """HF BertConfig's fields that shape the computation, with HF's names, and numpy_tf's
    options (norm_first, position_embeddings, type_vocab_size=0). hidden_act is "gelu" (exact,
    erf: HF's default) or "relu", the activations of the encoder layer it is built from."""
    vocab_size: int = 32
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 32
    hidden_act: str = "gelu"
    max_position_embeddings: int = 16
    type_vocab_size: int = 2                # 0: no segment embeddings
    layer_norm_eps: float = 1e-12           # HF BERT's; torch's LayerNorm default is 1e-5
    norm_first: bool = False                # Post-LN (BERT) or Pre-LN (+ a final LayerNorm)
    tie_word_embeddings: bool = True
    position_embeddings: bool = True        # False: no position table at all
    pad_token_id: int | None = 0            # its word embedding row gets no gradient, as in HF
    initializer_range: float = 0.02
    dropout: float = 0.0                    # embeddings, attention probabilities, residuals

    def __post_init__(self):
        validate.config_fields(self, {name: validate.positive_int for name in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "max_position_embeddings")})
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {', '.join(map(repr, ACTIVATIONS))} "
                             "(the activations of numpy_tf's TransformerEncoderLayer, which "
                             f"the encoder is built from); got {self.hidden_act!r}")
        validate.config_fields(self, {
            "type_vocab_size": validate.non_negative_int,
            "layer_norm_eps": validate.positive_float,
            "initializer_range": validate.positive_float,
            "norm_first": validate.flag, "tie_word_embeddings": validate.flag,
            "position_embeddings": validate.flag})
        validate.config_fields(self, {
            "dropout": validate.bounded(0.0, 1.0, high_open=True),
            "pad_token_id": lambda name, value: validate.optional_index(
                name, value, self.vocab_size, "a row of the vocabulary")})

    def to_dict(self) -> dict:
        return asdict(self)


# -- the embeddings -------------------------------------------------------------------------
class EmbeddingsCache(NamedTuple):
    word: EmbeddingCache                    # the ids (B, T) looked up
    token_type: EmbeddingCache | None       # the token types (None: no segment table)
    position: LearnedPositionsCache | None  # the rows 0 .. T-1 added (None: no position table)
    norm: LayerNormCache                    # of the sum (B, T, C)
    dropout: DropoutCache                   # of the normalised sum


class BertEmbeddings(Module):
    """x = dropout(LN(W_word[ids] + W_type[token_type_ids] + W_pos[0 .. T-1])), HF's order of
    the sums. token_type_ids None means all zeros, as HF."""

    def __init__(self, config: BertConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        c = config
        rng = np.random.default_rng(rng)
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, c.pad_token_id, rng=rng,
                                         dtype=dtype)
        self.position_embeddings = LearnedPositions(
            c.max_position_embeddings, c.hidden_size, rng=rng, dtype=dtype) \
            if c.position_embeddings else None
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size, rng=rng,
                                               dtype=dtype) if c.type_vocab_size else None
        self.norm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(c.dropout, dtype)

    def forward(self, ids, token_type_ids=None, rng=None):
        """ids (B, T) -> x (B, T, C), one step per line."""
        token_type = position = None
        e, word = self.word_embeddings.forward(ids)                 # (B, T, C)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = np.zeros(ids.shape, dtype=np.int64)
            segments, token_type = self.token_type_embeddings.forward(token_type_ids)
            e = e + segments
        if self.position_embeddings is not None:
            e, position = self.position_embeddings.forward(e)       # e + W_pos[0 .. T-1]
        h, norm = self.norm.forward(e)                              # (B, T, C)
        x, dropout = self.dropout.forward(h, rng)
        return x, EmbeddingsCache(word, token_type, position, norm, dropout)

    def backward(self, dx, cache: EmbeddingsCache):
        """The forward in reverse. A sum passes its gradient to each term unchanged, so every
        table gets de = LN'(dh) at the rows it looked up. Returns None (ids are integers)."""
        dh = self.dropout.backward(dx, cache.dropout)               # x = dropout(h)
        de = self.norm.backward(dh, cache.norm)                     # h = norm(e)
        if cache.position is not None:
            de = self.position_embeddings.backward(de, cache.position)  # e = e + W_pos[0 .. T-1]
        if cache.token_type is not None:
            self.token_type_embeddings.backward(de, cache.token_type)  # e = e + segments
        self.word_embeddings.backward(de, cache.word)               # e = W_word[ids]
        return None


# -- the masked-language-model head ------------------------------------------------------------
class MaskedLMHeadCache(NamedTuple):
    dense: LinearCache          # of the hidden states h (B, T, C)
    activation: tuple           # ReLUCache or GELUCache of dense(h) (B, T, C)
    norm: LayerNormCache        # of the activation (B, T, C)
    decoder: LinearCache        # of the normalised states, weight (V, C)


class MaskedLMHead(Module):
    """logits = decoder(LN(activation(dense(h)))): HF's cls.predictions (transform.dense,
    transform.LayerNorm, decoder with its bias). h (B, T, C) -> logits (B, T, V)."""

    def __init__(self, config: BertConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        c = config
        rng = np.random.default_rng(rng)
        self.dense = Linear(c.hidden_size, c.hidden_size, rng=rng, dtype=dtype)
        self.activation = make_activation(c.hidden_act, dtype)
        self.norm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype)
        self.decoder = Linear(c.hidden_size, c.vocab_size, rng=rng, dtype=dtype)

    def forward(self, h):
        z, dense = self.dense.forward(h)                            # (B, T, C)
        z, activation = self.activation.forward(z)
        z, norm = self.norm.forward(z)
        logits, decoder = self.decoder.forward(z)                   # (B, T, V)
        return logits, MaskedLMHeadCache(dense, activation, norm, decoder)

    def backward(self, dlogits, cache: MaskedLMHeadCache):
        """The forward in exact reverse; returns dh (B, T, C)."""
        dz = self.decoder.backward(dlogits, cache.decoder)          # logits = decoder(z)
        dz = self.norm.backward(dz, cache.norm)                     # z = norm(z)
        dz = self.activation.backward(dz, cache.activation)         # z = activation(z)
        dh = self.dense.backward(dz, cache.dense)                   # z = dense(h)
        return dh


# -- the model -------------------------------------------------------------------------------
class EncodeCache(NamedTuple):
    embeddings: EmbeddingsCache     # ids -> x (B, T, C)
    encoder: StackCache             # x -> hidden (B, T, C): every layer, then the final norm

    @property
    def output_spec(self):          # the (shape, dtype) of hidden (B, T, C): dhidden's
        x_hat = self.embeddings.norm.x_hat  # (B, T, C): the embeddings' normalised sum
        return x_hat.shape, x_hat.dtype


class BertCache(NamedTuple):
    encode: EncodeCache             # ids -> hidden
    mlm_head: MaskedLMHeadCache     # hidden -> logits (B, T, V)
    hidden: np.ndarray              # (B, T, C) the encoder's output, for whoever wants it

    @property
    def output_spec(self):          # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.mlm_head.decoder)


class Bert(Module):
    """The encoder with its masked-LM head; `Bert(BertConfig(...))`, or
    numpy_tf.interop.from_hf for a Hugging Face BertForMaskedLM's weights.
    forward(ids, key_padding_mask=None, token_type_ids=None, rng=None) -> (logits, cache);
    backward(dlogits, cache) -> None. `encode` / `encode_backward` give the hidden states."""

    def __init__(self, config: BertConfig = BertConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a BertConfig (use numpy_tf.interop.from_hf for a "
                            f"Hugging Face config); got {type(config).__name__}")
        rng = np.random.default_rng(rng)
        self.config = c = config
        self.embeddings = BertEmbeddings(c, rng=rng, dtype=dtype)
        layer = TransformerEncoderLayer(
            c.hidden_size, c.num_attention_heads, c.intermediate_size, c.dropout, c.hidden_act,
            c.layer_norm_eps, batch_first=True, norm_first=c.norm_first, rng=rng, dtype=dtype)
        final_norm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype) \
            if c.norm_first else None
        self.encoder = TransformerEncoder(layer, c.num_hidden_layers, final_norm)
        self.mlm_head = MaskedLMHead(c, rng=rng, dtype=dtype)
        self._initialize(rng)
        if c.tie_word_embeddings:
            self.mlm_head.decoder.weight = self.embeddings.word_embeddings.weight

    def _initialize(self, rng: np.random.Generator) -> None:
        """HF's rule: every weight matrix and table N(0, initializer_range^2) (each layer
        its own draw), every bias zero, the padding row zero; LayerNorms keep ones and zeros."""
        std = self.config.initializer_range
        for _, module in self.named_modules():
            if isinstance(module, TorchMultiheadAttention):     # its out_proj is a Linear
                weights, biases = [module.in_proj_weight], [module.in_proj_bias]
            elif isinstance(module, (Linear, Embedding, LearnedPositions)):
                weights, biases = [module.weight], [getattr(module, "bias", None)]
            else:
                continue
            for weight in weights:
                weight.data[...] = normal_init(rng, weight.shape, std, self.dtype)
            for bias in biases:
                if bias is not None:
                    bias.data[...] = 0.0
        if self.config.pad_token_id is not None:
            self.embeddings.word_embeddings.weight.data[self.config.pad_token_id] = 0.0

    def resize_token_embeddings(self, new_num_tokens: int, *,
                                rng: np.random.Generator) -> None:
        """The vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): the new
        rows of the word embedding and of the untied MLM decoder drawn N(0,
        initializer_range^2) from `rng`, the decoder bias's new entries zero, as HF
        initialises them (the padding row is kept); a tied decoder stays tied;
        config.vocab_size follows."""
        n = check_new_size(new_num_tokens, self.config.pad_token_id)
        draw = normal(validate.generator("rng", rng), self.config.initializer_range,
                      self.dtype)
        words = self.embeddings.word_embeddings
        resize_embedding(words, n, draw)
        resize_head(self.mlm_head.decoder, n, draw, zeros(self.dtype),
                    tied_to=words if self.config.tie_word_embeddings else None)
        self.config = replace(self.config, vocab_size=n)

    def _check_inputs(self, ids, key_padding_mask, token_type_ids) -> None:
        c = self.config
        validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
        validate.ids_in_range("ids", ids, c.vocab_size)
        if c.position_embeddings and ids.shape[1] > c.max_position_embeddings:
            raise ValueError(f"ids has T={ids.shape[1]} positions, more than "
                             f"max_position_embeddings = {c.max_position_embeddings} learned "
                             "positions; shorten the input (a learned table cannot "
                             "extrapolate)")
        validate.mask_array("key_padding_mask", key_padding_mask, {"(B, T)": ids.shape},
                            self.dtype, "padding")
        if token_type_ids is not None:
            if not c.type_vocab_size:
                raise ValueError("token_type_ids were given but the model has no segment "
                                 "table (type_vocab_size=0)")
            validate.integer_array("token_type_ids", token_type_ids, ndim=2, shape="(B, T)")
            if token_type_ids.shape != ids.shape:
                raise ValueError(f"token_type_ids must have the shape of ids {ids.shape}; got "
                                 f"{token_type_ids.shape}")
            validate.ids_in_range("token_type_ids", token_type_ids, c.type_vocab_size)

    def encode(self, ids, key_padding_mask=None, token_type_ids=None, rng=None):
        """ids (B, T) -> (hidden (B, T, C), EncodeCache): the embeddings and the encoder."""
        self._check_inputs(ids, key_padding_mask, token_type_ids)
        x, embeddings = self.embeddings.forward(ids, token_type_ids, rng)  # (B, T, C)
        hidden, encoder = self.encoder.forward(x, None, key_padding_mask, None, rng)  # (B, T, C)
        return hidden, EncodeCache(embeddings, encoder)

    def encode_backward(self, dhidden, cache: EncodeCache) -> None:
        """The forward in exact reverse; returns None (integer ids have no gradient).
        dhidden must have exactly the hidden states' shape (B, T, C) and dtype."""
        validate.backward_inputs(dhidden, cache, EncodeCache, "dhidden")
        dx = self.encoder.backward(dhidden, cache.encoder)          # hidden = encoder(x)
        self.embeddings.backward(dx, cache.embeddings)              # x = embeddings(ids)

    def forward(self, ids, key_padding_mask=None, token_type_ids=None, rng=None):
        """ids (B, T) -> logits (B, T, V) at every position; `key_padding_mask` (B, T) True at
        padding (bool, or float added to the scores); `token_type_ids` (B, T) segments."""
        hidden, encode = self.encode(ids, key_padding_mask, token_type_ids, rng)
        logits, mlm_head = self.mlm_head.forward(hidden)                # (B, T, V)
        return logits, BertCache(encode, mlm_head, hidden)

    def backward(self, dlogits, cache: BertCache):
        """The forward in exact reverse; returns None (integer ids have no gradient).
        dlogits must have exactly the logits' shape (B, T, V) and dtype."""
        validate.backward_inputs(dlogits, cache, BertCache, "dlogits")
        dhidden = self.mlm_head.backward(dlogits, cache.mlm_head)   # logits = mlm_head(hidden)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        self.encode_backward(dhidden, cache.encode)                 # hidden = encode(ids)
        return None
