"""A Flax (linen) mirror of the 7,232-parameter Pre-LN GPT, GPTConfig.tiny(): the architecture
of reference/gpt.py's torch TinyGPT, written against JAX independently of numpy_tf (it imports
nothing of it). Used by tests/test_jax_bridge.py; imported only after jax and flax are found.

attention="einsum" computes the softmax in the working dtype (float64 with x64), the faithful
mirror; attention="jax.nn" calls jax.nn.dot_product_attention, which takes its softmax in
float32 whatever the dtype.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


class CausalSelfAttention(nn.Module):
    width: int
    heads: int
    attention: str = "einsum"

    @nn.compact
    def __call__(self, x):
        batch, length, width = x.shape
        head = width // self.heads
        qkv = nn.Dense(3 * width, use_bias=False, name="qkv")(x)
        q, k, v = (part.reshape(batch, length, self.heads, head)       # (B, T, H, d)
                   for part in jnp.split(qkv, 3, axis=-1))
        if self.attention == "jax.nn":
            heads = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(head))
            future = jnp.triu(jnp.ones((length, length), dtype=bool), k=1)
            weights = jax.nn.softmax(jnp.where(future, -jnp.inf, scores), axis=-1)
            heads = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return nn.Dense(width, use_bias=False, name="output")(heads.reshape(batch, length, width))


class GELU(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.gelu(x, approximate=False)


class FeedForward(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * self.width, name="fc")(x)
        return nn.Dense(self.width, name="proj")(GELU(name="gelu")(h))


def layer_norm(name: str, eps: float = 1e-5) -> nn.LayerNorm:
    """torch's LayerNorm: eps 1e-5 (Flax's default is 1e-6) and the variance as the mean of
    squared deviations (Flax's default fast variance, E[x^2] - E[x]^2, cancels)."""
    return nn.LayerNorm(epsilon=eps, use_fast_variance=False, name=name)


class Block(nn.Module):
    width: int
    heads: int
    attention: str = "einsum"
    norm1_eps: float = 1e-5

    @nn.compact
    def __call__(self, x):
        x = x + CausalSelfAttention(self.width, self.heads, self.attention,
                                    name="attention")(layer_norm("norm1", self.norm1_eps)(x))
        return x + FeedForward(self.width, name="feedforward")(layer_norm("norm2")(x))


class TinyGPT(nn.Module):
    vocab_size: int = 20
    max_context: int = 8
    width: int = 16
    heads: int = 4
    layers: int = 2
    attention: str = "einsum"
    planted_eps: tuple | None = None    # (block, eps): that block's norm1 with another eps

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab_size, self.width, name="tokens")(ids)
        x = x + nn.Embed(self.max_context, self.width, name="positions")(
            jnp.arange(ids.shape[1]))
        for index in range(self.layers):
            eps = self.planted_eps[1] if self.planted_eps and self.planted_eps[0] == index \
                else 1e-5
            x = Block(self.width, self.heads, self.attention, eps, name=f"blocks_{index}")(x)
        return nn.Dense(self.vocab_size, use_bias=False, name="output")(
            layer_norm("final_norm")(x))


def parameter_names(layers: int = 2) -> dict:
    """{numpy_tf name: (Flax leaf, transposed)}: Dense kernels are (in, out)."""
    names = {"tokens.weight": ("params/tokens/embedding", False),
             "positions.weight": ("params/positions/embedding", False),
             "final_norm.weight": ("params/final_norm/scale", False),
             "final_norm.bias": ("params/final_norm/bias", False),
             "output.weight": ("params/output/kernel", True)}
    for i in range(layers):
        block = f"params/blocks_{i}"
        names.update({
            f"blocks.{i}.norm1.weight": (f"{block}/norm1/scale", False),
            f"blocks.{i}.norm1.bias": (f"{block}/norm1/bias", False),
            f"blocks.{i}.norm2.weight": (f"{block}/norm2/scale", False),
            f"blocks.{i}.norm2.bias": (f"{block}/norm2/bias", False),
            f"blocks.{i}.attention.qkv.weight": (f"{block}/attention/qkv/kernel", True),
            f"blocks.{i}.attention.output.weight": (f"{block}/attention/output/kernel", True),
            f"blocks.{i}.feedforward.0.weight": (f"{block}/feedforward/fc/kernel", True),
            f"blocks.{i}.feedforward.0.bias": (f"{block}/feedforward/fc/bias", False),
            f"blocks.{i}.feedforward.2.weight": (f"{block}/feedforward/proj/kernel", True),
            f"blocks.{i}.feedforward.2.bias": (f"{block}/feedforward/proj/bias", False)})
    return names


def activation_paths(layers: int = 2) -> dict:
    """{numpy_tf activation: Flax module path}; `positions` is left out (numpy_tf's adds the
    table to its input, Flax's Embed is the table alone)."""
    paths = {"tokens": "tokens", "final_norm": "final_norm", "output": "output"}
    for i in range(layers):
        block = f"blocks_{i}"
        paths.update({f"blocks.{i}": block, f"blocks.{i}.norm1": f"{block}/norm1",
                      f"blocks.{i}.attention.qkv": f"{block}/attention/qkv",
                      f"blocks.{i}.attention.output": f"{block}/attention/output",
                      f"blocks.{i}.attention": f"{block}/attention",
                      f"blocks.{i}.norm2": f"{block}/norm2",
                      f"blocks.{i}.feedforward.0": f"{block}/feedforward/fc",
                      f"blocks.{i}.feedforward.1": f"{block}/feedforward/gelu",
                      f"blocks.{i}.feedforward.2": f"{block}/feedforward/proj",
                      f"blocks.{i}.feedforward": f"{block}/feedforward"})
    return paths
