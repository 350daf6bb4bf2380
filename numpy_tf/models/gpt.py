"""Decoder-only models: the tiny GPT of the seed material and the GPT-2 layout.

    ids (B, T) -> tokens + learned positions (B, T, C) -> N blocks -> final LayerNorm
        -> output head (B, T, V) logits

A block is Pre-LN (the seed material's choice, GPT-2's):
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

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, ModuleList
from ..layers.embedding import Embedding, normal_init
from ..layers.linear import Linear
from ..layers.mlp import feedforward
from ..layers.multihead import FusedAttention
from ..layers.norm import LayerNorm
from ..layers.positions import LearnedPositions


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

    @classmethod
    def tiny(cls, **changes) -> "GPTConfig":
        """The seed material's TinyTransformer(vocab 20, max_context 8, width 16, 4 heads,
        2 layers): 7,232 parameters."""
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
    norm1: tuple
    attention: tuple
    norm2: tuple
    feedforward: tuple


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
        attend = lambda h: self.attention.forward(  # noqa: E731
            h, is_causal=True, key_padding_mask=key_padding_mask, past_kv=past_kv, rng=rng)
        if self.norm_first:
            h, norm1 = self.norm1.forward(x)                        # (B, T, C)
            a, attention = attend(h)
            u = x + a
            h, norm2 = self.norm2.forward(u)
            f, ff = self.feedforward.forward(h)
            y = u + f
        else:
            a, attention = attend(x)
            u, norm1 = self.norm1.forward(x + a)
            f, ff = self.feedforward.forward(u)
            y, norm2 = self.norm2.forward(u + f)
        return y, DecoderBlockCache(norm1, attention, norm2, ff)

    def backward(self, dy, cache: DecoderBlockCache):
        """The forward in exact reverse. A residual x + g(x) passes its gradient straight
        through and adds g's input gradient."""
        if self.norm_first:
            du = self.norm2.backward(self.feedforward.backward(dy, cache.feedforward),
                                     cache.norm2)
            du += dy                        # in place: LayerNorm's backward returns a fresh dx
            dx = self.norm1.backward(self.attention.backward(du, cache.attention), cache.norm1)
            dx += du
        else:
            ds = self.norm2.backward(dy, cache.norm2)               # d(u + f)
            du = ds + self.feedforward.backward(ds, cache.feedforward)
            ds = self.norm1.backward(du, cache.norm1)               # d(x + a)
            dx = ds + self.attention.backward(ds, cache.attention)
        return dx


class GPTCache(NamedTuple):
    tokens: tuple
    positions: tuple
    blocks: list
    final_norm: tuple
    output: tuple
    present: list               # per block, the (k, v) KV cache after this call


class GPT(Module):
    """The decoder-only model; `GPT(GPTConfig.tiny())` is the seed material's tiny GPT."""

    def __init__(self, config: GPTConfig = GPTConfig(), *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
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
        """The seed material's rule: every Linear and Embedding weight N(0, init_std^2),
        Linear biases zero; LayerNorms keep ones and zeros."""
        for _, module in self.named_modules():
            if isinstance(module, (Linear, Embedding, LearnedPositions)):
                module.weight.data[...] = normal_init(rng, module.weight.shape,
                                                      self.config.init_std, self.dtype)
            if isinstance(module, Linear) and module.bias is not None:
                module.bias.data[...] = 0.0

    def forward(self, ids, key_padding_mask=None, past_kv=None, rng=None):
        """ids (B, T) -> logits (B, T, V). `key_padding_mask` (B, P + T) is True at padding;
        `past_kv` is the list of per-block (k, v) of P earlier positions (generation)."""
        validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
        offset = 0 if past_kv is None else past_kv[0][0].shape[2]
        length = ids.shape[1]
        if offset + length > self.config.max_context:
            raise ValueError(f"ids has {length} positions after {offset} cached ones, more than "
                             f"max_context = {self.config.max_context} learned positions; "
                             "shorten the input (learned positions cannot extrapolate)")
        if past_kv is not None and len(past_kv) != len(self.blocks):
            raise ValueError(f"past_kv must hold one (k, v) per block ({len(self.blocks)}); "
                             f"got {len(past_kv)}")
        x, tokens = self.tokens.forward(ids)                        # (B, T, C)
        x, positions = self.positions.forward(x, offset)
        blocks, present = [], []
        for index, block in enumerate(self.blocks):
            x, cache = block.forward(x, key_padding_mask,
                                     None if past_kv is None else past_kv[index], rng)
            blocks.append(cache)
            present.append(cache.attention.present)
        x, final_norm = self.final_norm.forward(x)
        logits, output = self.output.forward(x)                     # (B, T, V)
        return logits, GPTCache(tokens, positions, blocks, final_norm, output, present)

    def backward(self, dlogits, cache: GPTCache):
        """The forward in exact reverse; returns None (integer ids have no gradient)."""
        dx = self.output.backward(dlogits, cache.output)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.final_norm.backward(dx, cache.final_norm)
        for block, block_cache in zip(reversed(list(self.blocks)), reversed(cache.blocks)):
            dx = block.backward(dx, block_cache)
        dx = self.positions.backward(dx, cache.positions)
        self.tokens.backward(dx, cache.tokens)
        return None
