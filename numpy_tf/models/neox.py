"""GPT-NeoX and Pythia (HF GPTNeoXForCausalLM): LayerNorms with biases, rotary positions on a
part of each head, a fused per-head query_key_value, and parallel (or sequential) residuals.

Shapes: B batch, T new positions, P positions already in a KV cache, C hidden_size, F
intermediate_size, H heads, d = C / H head width, R = int(d * rotary_pct) rotary features, V
vocab_size.

    ids (B, T) -> embed_in (B, T, C) -> N layers -> final_layer_norm -> embed_out (B, T, V)

A layer, with use_parallel_residual (Pythia's, GPT-NeoX-20B's: both branches read x):
    y = x + attention(input_layernorm(x)) + mlp(post_attention_layernorm(x))
and without it (sequential, as GPT-2 and Llama):
    u = x + attention(input_layernorm(x));   y = u + mlp(post_attention_layernorm(u))
attention: causal, query_key_value's output grouped per head [q_h | k_h | v_h], RoPE (halves
layout, omega_i = rope_theta^(-2i/R)) on features 0 .. R-1 of each q and k head only, dense
(numpy_tf.layers.neox_attention); mlp(h) = dense_4h_to_h(act(dense_h_to_4h(h))), act by
hidden_act (Pythia: "gelu", the exact erf GELU). Every Linear but embed_out has a bias
(query_key_value and dense only with attention_bias, HF's default).

Parameter names are HF's with the `gpt_neox.` prefix dropped: embed_in.weight,
layers.0.input_layernorm.weight, ..., layers.0.attention.query_key_value.weight,
layers.0.attention.dense.weight, layers.0.mlp.dense_h_to_4h.weight, ...,
final_layer_norm.weight, final_layer_norm.bias, and embed_out.weight: the head's name in
every GPT-NeoX and Pythia checkpoint (transformers 5 renames it lm_head; numpy_tf.interop reads
both and writes lm_head). With tie_word_embeddings the head is the token embedding: one
Parameter whose gradient is the sum of its two uses. GPT-NeoX's embedding has no padding row:
pad_token_id's row gets its gradient like any other, as in HF.

Positions: RoPE rotates by position p = P + t by default; explicit `positions` (T,) or (B, T)
serve left padding. No table, so no length is refused.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, ModuleList
from ..layers.activations import GELU, GELUCache, ReLU, ReLUCache
from ..layers.embedding import Embedding, EmbeddingCache, normal_init
from ..layers.linear import Linear, LinearCache
from ..layers.neox_attention import NeoXAttention, NeoXAttentionCache
from ..layers.norm import LayerNorm, LayerNormCache
from . import checks
from .accounting import count_neox
from .resize import check_new_size, normal, resize_embedding, resize_head

# HF hidden_act -> its GELU approximation (torch's `approximate`); None: ReLU
HIDDEN_ACTS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "relu": None}


@dataclass(frozen=True)
class NeoXConfig:
    """HF GPTNeoXConfig's fields that shape the computation, with HF's names; rotary_pct is
    transformers 5's rope_parameters["partial_rotary_factor"] (and rope_theta its
    rope_parameters["rope_theta"], older configs' rotary_emb_base)."""
    vocab_size: int = 32
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 64
    hidden_act: str = "gelu"
    rotary_pct: float = 0.25
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-5
    use_parallel_residual: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    attention_dropout: float = 0.0
    max_position_embeddings: int = 2048     # documentation only: longer inputs are allowed
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings"):
            validate.positive_int(name, getattr(self, name))
        validate.choice("hidden_act", self.hidden_act, tuple(HIDDEN_ACTS))
        heads = self.num_attention_heads
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({heads})")
        if isinstance(self.rotary_pct, bool) or not isinstance(self.rotary_pct, (int, float)) \
                or not 0.0 < self.rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct must be a number in (0, 1] (the part of each head "
                             f"RoPE rotates); got {self.rotary_pct!r}")
        rotary = self.rotary_dim
        if rotary == 0 or rotary % 2:
            raise ValueError(f"rotary_pct {self.rotary_pct!r} of the head width "
                             f"{self.head_width} gives rotary_dim int({self.head_width} * "
                             f"{self.rotary_pct!r}) = {rotary}: RoPE needs a positive even "
                             "number of features (it rotates pairs)")
        validate.positive_float("rope_theta", self.rope_theta)
        validate.positive_float("layer_norm_eps", self.layer_norm_eps)
        for name in ("use_parallel_residual", "tie_word_embeddings", "attention_bias"):
            validate.flag(name, getattr(self, name))

    @property
    def head_width(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """R = int(d * rotary_pct), as HF truncates it."""
        return int(self.head_width * self.rotary_pct)

    def num_parameters(self) -> int:
        """The count of trainable scalars, from the shapes alone (accounting.count_neox); a
        tied head is counted once."""
        return count_neox(self).total

    @classmethod
    def pythia_160m(cls, **changes) -> "NeoXConfig":
        """EleutherAI/pythia-160m's shape: 162,322,944 parameters."""
        base = dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12,
                    num_attention_heads=12, intermediate_size=3072, rotary_pct=0.25,
                    rope_theta=10000.0, max_position_embeddings=2048)
        return cls(**{**base, **changes})

    @classmethod
    def gpt_neox_20b(cls, **changes) -> "NeoXConfig":
        """EleutherAI/gpt-neox-20b's shape: 20,554,567,680 parameters (never allocate it in
        float64: 164 GB)."""
        base = dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44,
                    num_attention_heads=64, intermediate_size=24576, rotary_pct=0.25,
                    rope_theta=10000.0, max_position_embeddings=2048)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return asdict(self)


class NeoXMLPCache(NamedTuple):
    dense_h_to_4h: LinearCache      # of h (B, T, C)
    act: GELUCache | ReLUCache      # the activation's, of (B, T, F)
    dense_4h_to_h: LinearCache      # of act (B, T, F)


class NeoXMLP(Module):
    """dense_4h_to_h(act(dense_h_to_4h(h))), both Linears with biases (HF GPTNeoXMLP)."""

    def __init__(self, config: NeoXConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        c = config
        self.dense_h_to_4h = Linear(c.hidden_size, c.intermediate_size, rng=rng, dtype=dtype)
        approximate = HIDDEN_ACTS[c.hidden_act]
        self.act = ReLU(dtype) if approximate is None else GELU(approximate, dtype)
        self.dense_4h_to_h = Linear(c.intermediate_size, c.hidden_size, rng=rng, dtype=dtype)

    def forward(self, h):
        z, dense_h_to_4h = self.dense_h_to_4h.forward(h)                # (B, T, F)
        a, act = self.act.forward(z)                                    # (B, T, F)
        f, dense_4h_to_h = self.dense_4h_to_h.forward(a)                # (B, T, C)
        return f, NeoXMLPCache(dense_h_to_4h, act, dense_4h_to_h)

    def backward(self, df, cache: NeoXMLPCache):
        da = self.dense_4h_to_h.backward(df, cache.dense_4h_to_h)      # f = dense_4h_to_h(a)
        dz = self.act.backward(da, cache.act)                           # a = act(z)
        return self.dense_h_to_4h.backward(dz, cache.dense_h_to_4h)    # z = dense_h_to_4h(h)


class NeoXLayerCache(NamedTuple):
    input_layernorm: LayerNormCache             # of x (B, T, C)
    attention: NeoXAttentionCache               # its `present` is this layer's KV cache
    post_attention_layernorm: LayerNormCache    # of x (parallel) or of u (sequential)
    mlp: NeoXMLPCache


class NeoXLayer(Module):
    """One GPT-NeoX layer (HF's names and order: input_layernorm, post_attention_layernorm,
    attention, mlp)."""

    def __init__(self, config: NeoXConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        c = config
        self.parallel = c.use_parallel_residual
        self.input_layernorm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype)
        self.post_attention_layernorm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype)
        self.attention = NeoXAttention(c.hidden_size, c.num_attention_heads, c.rotary_dim,
                                       c.rope_theta, c.attention_bias, c.attention_dropout,
                                       rng=rng, dtype=dtype)
        self.mlp = NeoXMLP(c, rng=rng, dtype=dtype)

    def forward(self, x, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """x (B, T, C) -> y (B, T, C), one sub-layer per line, added in HF's order."""
        h, input_norm = self.input_layernorm.forward(x)                 # (B, T, C)
        a, attention = self.attention.forward(h, key_padding_mask, positions, past_kv, rng)
        if self.parallel:
            h, post_norm = self.post_attention_layernorm.forward(x)     # (B, T, C)
            f, mlp = self.mlp.forward(h)                                # (B, T, C)
            y = f + a + x
        else:
            u = a + x
            h, post_norm = self.post_attention_layernorm.forward(u)     # (B, T, C)
            f, mlp = self.mlp.forward(h)                                # (B, T, C)
            y = f + u
        return y, NeoXLayerCache(input_norm, attention, post_norm, mlp)

    def backward(self, dy, cache: NeoXLayerCache):
        """The forward in exact reverse. Parallel: x reaches y three times (straight, through
        the attention branch, through the MLP branch), so dx = dy + dMLP-branch +
        dattention-branch, and both branches start from dy. Sequential: du = dy + dMLP-branch,
        dx = du + dattention-branch."""
        dh = self.mlp.backward(dy, cache.mlp)                           # f = mlp(h)
        dnorm = self.post_attention_layernorm.backward(dh, cache.post_attention_layernorm)
        if self.parallel:                                               # h = post_norm(x)
            da = dy                                                     # y = f + a + x
            dx = dy + dnorm
        else:                                                           # h = post_norm(u)
            da = dy + dnorm                                             # y = f + u; u = a + x
            dx = da
        dh = self.attention.backward(da, cache.attention)               # a = attention(h)
        return dx + self.input_layernorm.backward(dh, cache.input_layernorm)  # h = input_norm(x)


class NeoXCache(NamedTuple):
    embed_in: EmbeddingCache        # the ids (B, T) looked up
    layers: list                    # one NeoXLayerCache per layer, in forward order
    final_layer_norm: LayerNormCache    # of the last layer's output (B, T, C)
    embed_out: LinearCache          # the head's input (B, T, C) and weight (V, C)
    present: list                   # per layer, the KVCache (k, v) heads (B, H, P + T, d)
                                    # after this call: the next past_kv

    @property
    def output_spec(self):      # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.embed_out)


class GPTNeoX(Module):
    """The GPT-NeoX / Pythia language model; `GPTNeoX(NeoXConfig(...))`, or
    numpy_tf.interop.from_hf for a Hugging Face GPTNeoXForCausalLM's weights."""

    def __init__(self, config: NeoXConfig = NeoXConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        if not isinstance(config, NeoXConfig):
            raise TypeError(f"config must be a NeoXConfig (use numpy_tf.interop.from_hf for a "
                            f"Hugging Face config); got {type(config).__name__}")
        rng = np.random.default_rng(rng)
        self.config = c = config
        self.embed_in = Embedding(c.vocab_size, c.hidden_size, rng=rng, dtype=dtype)
        self.layers = ModuleList([NeoXLayer(c, rng=rng, dtype=dtype)
                                  for _ in range(c.num_hidden_layers)], dtype=dtype)
        self.final_layer_norm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype=dtype)
        self.embed_out = Linear(c.hidden_size, c.vocab_size, bias=False, rng=rng, dtype=dtype)
        self._initialize(rng)
        if c.tie_word_embeddings:
            self.embed_out.weight = self.embed_in.weight

    def _initialize(self, rng: np.random.Generator) -> None:
        """HF's rule: every Linear and Embedding weight N(0, initializer_range^2), biases zero;
        LayerNorms keep their ones and zeros."""
        for _, module in self.named_modules():
            if isinstance(module, (Linear, Embedding)):
                module.weight.data[...] = normal_init(rng, module.weight.shape,
                                                      self.config.initializer_range, self.dtype)
            if isinstance(module, Linear) and module.bias is not None:
                module.bias.data[...] = 0.0

    def resize_token_embeddings(self, new_num_tokens: int, *,
                                rng: np.random.Generator) -> None:
        """The vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): the new
        rows of embed_in and of the untied embed_out drawn N(0, initializer_range^2) from
        `rng`; a tied head stays tied; config.vocab_size follows."""
        n = check_new_size(new_num_tokens)
        draw = normal(validate.generator("rng", rng), self.config.initializer_range,
                      self.dtype)
        resize_embedding(self.embed_in, n, draw)
        resize_head(self.embed_out, n, draw,
                    tied_to=self.embed_in if self.config.tie_word_embeddings else None)
        self.config = replace(self.config, vocab_size=n)

    def _check_inputs(self, ids, key_padding_mask, past_kv, positions) -> None:
        validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
        validate.ids_in_range("ids", ids, self.config.vocab_size)
        batch, length = ids.shape
        past_length = 0
        if past_kv is not None:
            shapes = [[np.shape(part) for part in pair] for pair in past_kv]
            first = shapes[0][0] if shapes and shapes[0] else ()
            past_length = first[2] if len(first) == 4 else 0
            c = self.config
            expected = (batch, c.num_attention_heads, past_length, c.head_width)
            if len(shapes) != len(self.layers) or any(pair != [expected] * 2 for pair in shapes):
                raise ValueError(f"past_kv must hold one (k, v) per layer "
                                 f"({len(self.layers)}), each of shape (B, H, P, d) = "
                                 f"{expected}: the `present` of an earlier call")
        if key_padding_mask is not None and \
                np.shape(key_padding_mask) != (batch, past_length + length):
            raise ValueError(f"key_padding_mask must have shape (B, P + T) = "
                             f"{(batch, past_length + length)} (the cached and the new "
                             f"positions); got {np.shape(key_padding_mask)}")
        if positions is not None:
            validate.integer_array("positions", positions, ndim=(1, 2), shape="(T,) or (B, T)")
            if positions.shape not in ((length,), (batch, length)):
                raise ValueError(f"positions must have shape (T,) = {(length,)} or (B, T) = "
                                 f"{(batch, length)} to match ids; got {positions.shape}")
            validate.non_negative_entries("positions", positions)

    def forward(self, ids, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """ids (B, T) -> logits (B, T, V), causal. `key_padding_mask` (B, P + T) is True at
        padding; `past_kv` is the cache's `present` of an earlier call (P positions); RoPE
        positions default to P .. P + T - 1, or are given as (T,) or (B, T) integers."""
        self._check_inputs(ids, key_padding_mask, past_kv, positions)
        caches, present = [], []
        x, embed_in = self.embed_in.forward(ids)                        # (B, T, C)
        for index, layer in enumerate(self.layers):
            x, cache = layer.forward(x, key_padding_mask,
                                     None if past_kv is None else past_kv[index], positions,
                                     rng)                               # (B, T, C)
            caches.append(cache)
            present.append(cache.attention.present)
        x, final_layer_norm = self.final_layer_norm.forward(x)          # (B, T, C)
        logits, embed_out = self.embed_out.forward(x)                   # (B, T, V)
        return logits, NeoXCache(embed_in, caches, final_layer_norm, embed_out, present)

    def backward(self, dlogits, cache: NeoXCache):
        """The forward in exact reverse; returns None (integer ids have no gradient)."""
        validate.backward_inputs(dlogits, cache, NeoXCache, "dlogits")
        dx = self.embed_out.backward(dlogits, cache.embed_out)          # logits = embed_out(x)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.final_layer_norm.backward(dx, cache.final_layer_norm)  # x = final_norm(x)
        for layer, layer_cache in zip(reversed(list(self.layers)), reversed(cache.layers)):
            dx = layer.backward(dx, layer_cache)                        # x = layer(x)
        self.embed_in.backward(dx, cache.embed_in)                      # x = embed_in(ids)
        return None
