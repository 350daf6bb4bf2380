"""Decoder-only models: the 7,232-parameter Pre-LN GPT (GPTConfig.tiny()) and the GPT-2 layout.

    ids (B, T) -> tokens + learned positions (B, T, C) -> N blocks -> final LayerNorm
        -> output head (B, T, V) logits

A block is Pre-LN (the tiny GPT's choice, and GPT-2's):
    u = x + Attn(LN1(x))            y = u + FFN(LN2(u))
or Post-LN (the original Transformer's):
    u = LN1(x + Attn(x))            y = LN2(u + FFN(u))
with causal self-attention through a fused `qkv` projection, and the FFN Linear, GELU (or ReLU),
Linear. Parameter names are the tiny GPT torch module's state_dict keys: tokens.weight,
positions.weight, blocks.0.norm1.weight, blocks.0.attention.qkv.weight,
blocks.0.attention.output.weight, blocks.0.feedforward.0.weight, ..., final_norm.weight,
output.weight. GPT-2 (numpy_tf.interop maps its Hugging Face names) has biases everywhere, the
tanh GELU and an output head tied to the token embedding: one Parameter whose gradient is the
sum of its two uses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, ModuleList
from ..layers.embedding import Embedding, EmbeddingCache, normal_init
from ..layers.linear import Linear, LinearCache
from ..layers.mlp import feedforward
from ..layers.multihead import AttentionLayerCache, FusedAttention
from ..layers.norm import LayerNorm, LayerNormCache
from ..layers.positions import LearnedPositions, LearnedPositionsCache
from . import checks
from .resize import check_new_size, normal, resize_embedding, resize_head


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 20
    max_context: int = 8
    width: int = 16
    heads: int = 4
    layers: int = 2
    hidden: int | None = None           # FFN width; None is 4 * width
    attention_bias: bool = False        # biases of qkv and the attention output
    ffn_bias: bool = True
    activation: str = "gelu"            # "gelu" (exact), "gelu_tanh", "relu"
    norm_eps: float = 1e-5
    norm_first: bool = True             # Pre-LN (True) or Post-LN (False)
    tied: bool = False                  # output head shares the token embedding
    init_std: float = 0.02
    dropout: float = 0.0

    def __post_init__(self):
        integer, flag = validate.positive_int, validate.flag
        validate.config_fields(self, {
            "vocab_size": integer, "max_context": integer, "width": integer, "heads": integer,
            "layers": integer, "hidden": validate.optional(integer),
            "attention_bias": flag, "ffn_bias": flag, "norm_first": flag, "tied": flag,
            "activation": validate.one_of("gelu", "gelu_tanh", "relu"),
            "norm_eps": validate.positive_float, "init_std": validate.bounded(low=0.0),
            "dropout": validate.bounded(0.0, 1.0, high_open=True)})
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")

    @classmethod
    def tiny(cls, **changes) -> "GPTConfig":
        """The 7,232-parameter Pre-LN GPT: vocab 20, max_context 8, width 16, 4 heads, 2 layers
        (reference/gpt.py's TinyGPT is its torch twin)."""
        return cls(**changes)

    @classmethod
    def gpt2(cls, **changes) -> "GPTConfig":
        """GPT-2 124M: biases everywhere, tanh GELU, tied head."""
        base = dict(vocab_size=50257, max_context=1024, width=768, heads=12, layers=12,
                    attention_bias=True, ffn_bias=True, activation="gelu_tanh", tied=True)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return asdict(self)


class DecoderBlockCache(NamedTuple):
    norm1: LayerNormCache           # Pre-LN: of x; Post-LN: of x + a
    attention: AttentionLayerCache  # its `present` is this block's KV cache
    norm2: LayerNormCache           # Pre-LN: of u; Post-LN: of u + f
    feedforward: tuple              # the Sequential's caches: Linear, activation, Linear


class DecoderBlock(Module):
    """One Pre-LN or Post-LN block with causal self-attention (names norm1, norm2, attention,
    feedforward, in the tiny GPT's order)."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        self.norm_first = config.norm_first
        self.norm1 = LayerNorm(config.width, config.norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(config.width, config.norm_eps, dtype=dtype)
        self.attention = FusedAttention(config.width, config.heads, config.attention_bias,
                                        config.dropout, rng=rng, dtype=dtype)
        self.feedforward = feedforward(config.width, config.hidden, config.activation,
                                       config.ffn_bias, rng=rng, dtype=dtype)

    def forward(self, x, key_padding_mask=None, past_kv=None, rng=None):
        """x (B, T, C) -> y (B, T, C), one sub-layer per line."""
        if self.norm_first:                 # Pre-LN: u = x + attn(norm1(x)), y = u + ffn(norm2(u))
            h, norm1 = self.norm1.forward(x)                                # (B, T, C)
            with self.norm1.feeding(h, norm1):     # the qkv Linear keeps x_hat, not h
                a, attention = self.attention.forward(
                    h, is_causal=True, key_padding_mask=key_padding_mask, past_kv=past_kv,
                    rng=rng)                                                # (B, T, C)
            u = x + a
            h, norm2 = self.norm2.forward(u)                                # (B, T, C)
            with self.norm2.feeding(h, norm2):
                f, feedforward = self.feedforward.forward(h)                # (B, T, C)
            y = u + f
        else:                               # Post-LN: u = norm1(x + attn(x)), y = norm2(u + ffn(u))
            a, attention = self.attention.forward(
                x, is_causal=True, key_padding_mask=key_padding_mask, past_kv=past_kv,
                rng=rng)                                                    # (B, T, C)
            u, norm1 = self.norm1.forward(x + a)                            # (B, T, C)
            with self.norm1.feeding(u, norm1):
                f, feedforward = self.feedforward.forward(u)                # (B, T, C)
            y, norm2 = self.norm2.forward(u + f)                            # (B, T, C)
        return y, DecoderBlockCache(norm1, attention, norm2, feedforward)

    def backward(self, dy, cache: DecoderBlockCache, *, overwrite_dy: bool = False):
        """The forward in exact reverse, each line commented with the forward line it undoes. A
        residual sum passes its gradient to both terms unchanged, so a value that reached a sum
        twice (directly and through a branch) gets the sum of the two gradients; Post-LN's ds
        is the gradient of the sum inside a norm.

        overwrite_dy=True lets a Pre-LN block write du into dy's own array (the same bits):
        for a dy its caller made and nobody else holds (GPT.backward passes the gradient the
        block above it, or the final norm, has just returned), so that attention's backward,
        the step's peak, runs with one (B, T, C) gradient fewer alive."""
        if self.norm_first:
            dh = self.feedforward.backward(dy, cache.feedforward)       # f = ffn(h)
            dn = self.norm2.backward(dh, cache.norm2)                   # h = norm2(u)
            del dh                  # not held through attention's backward, the step's peak
            into = dy if overwrite_dy and dy.flags.writeable else None  # where du goes
            du = np.add(dy, dn, out=into)                               # y = u + f
            del dn, into
            dh = self.attention.backward(du, cache.attention)           # a = attn(h)
            dx = du + self.norm1.backward(dh, cache.norm1)              # h = norm1(x); u = x + a
        else:
            ds = self.norm2.backward(dy, cache.norm2)                   # y = norm2(u + f)
            du = ds + self.feedforward.backward(ds, cache.feedforward)  # f = ffn(u)
            ds = self.norm1.backward(du, cache.norm1)                   # u = norm1(x + a)
            dx = ds + self.attention.backward(ds, cache.attention)      # a = attn(x)
        return dx


class GPTCache(NamedTuple):
    tokens: EmbeddingCache      # the ids (B, T) looked up
    positions: LearnedPositionsCache    # the rows P .. P + T - 1 added
    blocks: list                # one DecoderBlockCache per block, in forward order
    final_norm: LayerNormCache  # of the last block's output (B, T, C)
    output: LinearCache         # the head's input (B, T, C) and weight (V, C)
    present: list               # per block, the KVCache (k, v) after this call: the next past_kv

    @property
    def output_spec(self):      # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.output)


class GPT(Module):
    """The decoder-only model; `GPT(GPTConfig.tiny())` is the 7,232-parameter Pre-LN GPT."""

    def __init__(self, config: GPTConfig = GPTConfig(), *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig; got {type(config).__name__}")
        rng = np.random.default_rng(rng)
        self.config = config
        c = config
        self.tokens = Embedding(c.vocab_size, c.width, rng=rng, dtype=dtype)
        self.positions = LearnedPositions(c.max_context, c.width, rng=rng, dtype=dtype)
        self.blocks = ModuleList([DecoderBlock(c, rng=rng, dtype=dtype) for _ in
                                  range(c.layers)], dtype=dtype)
        self.final_norm = LayerNorm(c.width, c.norm_eps, dtype=dtype)
        self.output = Linear(c.width, c.vocab_size, bias=False, rng=rng, dtype=dtype)
        self._initialize(rng)
        if c.tied:
            self.output.weight = self.tokens.weight

    def _initialize(self, rng: np.random.Generator) -> None:
        """The tiny GPT's initialisation: every Linear and Embedding weight N(0, init_std^2),
        Linear biases zero; LayerNorms keep ones and zeros."""
        for _, module in self.named_modules():
            if isinstance(module, (Linear, Embedding, LearnedPositions)):
                module.weight.data[...] = normal_init(rng, module.weight.shape,
                                                      self.config.init_std, self.dtype)
            if isinstance(module, Linear) and module.bias is not None:
                module.bias.data[...] = 0.0

    def resize_token_embeddings(self, new_num_tokens: int, *,
                                rng: np.random.Generator) -> None:
        """The vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): the new
        rows of `tokens` and of the untied `output` drawn N(0, init_std^2) from `rng`, as the
        model draws them; a tied head stays tied; config.vocab_size follows."""
        n = check_new_size(new_num_tokens)
        draw = normal(validate.generator("rng", rng), self.config.init_std, self.dtype)
        resize_embedding(self.tokens, n, draw)
        resize_head(self.output, n, draw, tied_to=self.tokens if self.config.tied else None)
        self.config = replace(self.config, vocab_size=n)

    def forward(self, ids, key_padding_mask=None, past_kv=None, rng=None):
        """ids (B, T) -> logits (B, T, V). `key_padding_mask` (B, P + T) is True at padding;
        `past_kv` is the list of per-block (k, v) of P earlier positions (generation): an
        earlier call's `present`, or plain (k, v) tuples."""
        c = self.config
        validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
        validate.ids_in_range("ids", ids, c.vocab_size)
        offset = checks.past_kv(past_kv, len(self.blocks), batch=ids.shape[0], heads=c.heads,
                                head_dim=c.width // c.heads, dtype=self.dtype)
        length = ids.shape[1]
        if offset + length > c.max_context:
            raise ValueError(f"ids has {length} positions after {offset} cached ones, more than "
                             f"max_context = {c.max_context} learned positions; "
                             "shorten the input (learned positions cannot extrapolate)")
        validate.mask_array("key_padding_mask", key_padding_mask,
                            {"(B, Tk)": (ids.shape[0], offset + length)}, self.dtype,
                            "padding")
        x, tokens = self.tokens.forward(ids)                        # (B, T, C)
        x, positions = self.positions.forward(x, offset)            # (B, T, C)
        blocks, present = [], []
        for index, block in enumerate(self.blocks):
            x, cache = block.forward(x, key_padding_mask,
                                     None if past_kv is None else past_kv[index], rng)
            blocks.append(cache)
            present.append(cache.attention.present)
        x, final_norm = self.final_norm.forward(x)                  # (B, T, C)
        with self.final_norm.feeding(x, final_norm):
            logits, output = self.output.forward(x)                 # (B, T, V)
        return logits, GPTCache(tokens, positions, blocks, final_norm, output, present)

    def backward(self, dlogits, cache: GPTCache):
        """The forward in exact reverse; returns None (integer ids have no gradient).
        dlogits must have exactly the logits' shape (B, T, V) and dtype."""
        validate.backward_inputs(dlogits, cache, GPTCache, "dlogits")
        dx = self.output.backward(dlogits, cache.output)            # logits = output(x)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.final_norm.backward(dx, cache.final_norm)         # x = final_norm(x)
        for block, block_cache in zip(reversed(list(self.blocks)), reversed(cache.blocks)):
            dx = block.backward(dx, block_cache, overwrite_dy=True)  # x = block(x)
        dx = self.positions.backward(dx, cache.positions)           # x = x + W_pos[P .. P+T-1]
        self.tokens.backward(dx, cache.tokens)                      # x = W_tok[ids]
        return None
