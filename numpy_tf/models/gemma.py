"""Gemma and Gemma2 (HF GemmaForCausalLM, Gemma2ForCausalLM): Llama's decoder with Gemma's
RMSNorm, a scaled embedding, a GeGLU feed-forward and a tied head; Gemma2 adds norms after
each sub-layer, soft-capped scores and logits, and a sliding window on alternate layers.

Shapes: B batch, T new positions, P positions already in a KV cache, C hidden_size, F
intermediate_size, H query heads, G key/value heads, d head_dim, V vocab_size.

    ids (B, T) -> embed_tokens (B, T, C) * sqrt(C) -> N blocks -> norm -> lm_head (B, T, V)
               [Gemma2: -> final soft cap, logits = c tanh(logits / c)]

Gemma's block is Llama's (GemmaDecoderLayer inherits its forward and backward):
    u = x + SelfAttn(input_layernorm(x))              causal; RoPE (HF's halves layout)
    y = u + MLP(post_attention_layernorm(u))          MLP(h) = down(gelu_tanh(gate(h)) * up(h))
Gemma2's block puts a norm after each sub-layer too:
    u = x + post_attention_layernorm(SelfAttn(input_layernorm(x)))
    y = u + post_feedforward_layernorm(MLP(pre_feedforward_layernorm(u)))
with attention scores c tanh(s q k^T / c) (attn_logit_softcapping c), the scale
s = query_pre_attn_scalar^(-1/2), and on the layers layer_types calls "sliding_attention" a
window of sliding_window positions (HF's default: layers 0, 2, 4, ...).

Every RMSNorm is Gemma's: out = (1 + w) x / sqrt(mean(x^2) + eps), w starting at 0. The
embedding is multiplied by sqrt(hidden_size) rounded to the model's dtype, as HF rounds it
(torch.tensor(hidden_size ** 0.5) cast to the weights' dtype): in float32 the float32 value
of sqrt(C), in float64 the float64 one.

Parameter names are HF's without the `model.` prefix (numpy_tf.interop adds it); the head is
the token embedding unless tie_word_embeddings is False.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..layers.embedding import EmbeddingCache
from ..layers.linear import LinearCache
from ..layers.mlp import SwiGLU, SwiGLUCache
from ..layers.multihead import AttentionLayerCache, MultiHeadAttention
from ..layers.norm import RMSNorm, RMSNormCache
from ..layers.softcap import SoftCap, SoftCapCache
from . import checks
from .accounting import count_gemma
from .llama import Llama, LlamaConfig, LlamaDecoderLayer

GEMMA_TYPES = ("gemma", "gemma2")
LAYER_TYPES = ("full_attention", "sliding_attention")
_LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                 "rope_theta", "max_position_embeddings", "pad_token_id", "sliding_window")


@dataclass(frozen=True)
class GemmaConfig:
    """HF GemmaConfig's and Gemma2Config's fields that shape the computation, with HF's names.
    model_type "gemma2" gives Gemma2's block (norms after the sub-layers too); the options
    below it (soft caps, query_pre_attn_scalar, the window) are Gemma2's and None otherwise.
    head_dim None is hidden_size // num_attention_heads; num_key_value_heads None is
    num_attention_heads; layer_types None is every layer "full_attention"."""
    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 24
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192     # documentation only: longer inputs are allowed
    attention_bias: bool = False
    attention_dropout: float = 0.0
    pad_token_id: int | None = None         # its embedding row gets no gradient, as in HF
    initializer_range: float = 0.02
    model_type: str = "gemma"
    query_pre_attn_scalar: float | None = None      # None: head_dim (scores / sqrt(head_dim))
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self):
        LlamaConfig(**{name: getattr(self, name) for name in _LLAMA_FIELDS})   # Llama's checks
        validate.choice("model_type", self.model_type, GEMMA_TYPES)
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping",
                     "final_logit_softcapping"):
            if getattr(self, name) is not None:
                validate.positive_float(name, getattr(self, name))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"layer_types must name one type per layer "
                                 f"({self.num_hidden_layers}); got {len(self.layer_types)}")
            for kind in self.layer_types:
                validate.choice("layer_types' entries", kind, LAYER_TYPES)
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers but sliding_window "
                                 "is None: give the window's length")

    kv_heads = LlamaConfig.kv_heads            # num_key_value_heads, or num_attention_heads
    head_width = LlamaConfig.head_width        # head_dim, or hidden_size // heads

    def layer_window(self, index: int) -> int | None:
        """The sliding window of layer `index` (None: it sees every earlier position)."""
        sliding = self.layer_types is not None and \
            self.layer_types[index] == "sliding_attention"
        return self.sliding_window if sliding else None

    def num_parameters(self) -> int:
        """The count of trainable scalars (accounting.count_gemma's total)."""
        return count_gemma(self).total

    @classmethod
    def gemma_2b(cls, **changes) -> "GemmaConfig":
        """google/gemma-2b's shape: 2,506,172,416 parameters."""
        base = dict(vocab_size=256000, hidden_size=2048, intermediate_size=16384,
                    num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                    head_dim=256, pad_token_id=0)
        return cls(**{**base, **changes})

    @classmethod
    def gemma2_2b(cls, **changes) -> "GemmaConfig":
        """google/gemma-2-2b's shape: 2,614,341,888 parameters."""
        base = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                    num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                    head_dim=256, pad_token_id=0, model_type="gemma2",
                    query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, sliding_window=4096,
                    layer_types=alternating_layer_types(26))
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        fields = asdict(self)
        if self.layer_types is not None:
            fields["layer_types"] = list(self.layer_types)
        return fields


def alternating_layer_types(layers: int) -> tuple[str, ...]:
    """Gemma2's default: sliding window on layers 0, 2, 4, ..., full attention between."""
    return tuple("sliding_attention" if index % 2 == 0 else "full_attention"
                 for index in range(layers))


def _gemma_sublayers(layer: Module, config: GemmaConfig, index: int, rng, dtype,
                     norms: tuple[str, ...]) -> None:
    """The attention, the GeGLU MLP and Gemma RMSNorms named `norms` of layer `index`."""
    c = config
    scale = None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5
    layer.self_attn = MultiHeadAttention(
        c.hidden_size, c.num_attention_heads, c.kv_heads, c.head_width, c.attention_bias,
        c.attention_dropout, rope=True, rope_base=c.rope_theta, rope_interleaved=False,
        sliding_window=c.layer_window(index), softcap=c.attn_logit_softcapping, scale=scale,
        rng=rng, dtype=dtype)
    layer.mlp = SwiGLU(c.hidden_size, c.intermediate_size, activation="gelu_tanh", rng=rng,
                       dtype=dtype)
    for name in norms:
        setattr(layer, name, RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=dtype,
                                     unit_offset=True))


class GemmaDecoderLayer(LlamaDecoderLayer):
    """Gemma's block: Llama's forward and backward (inherited) over Gemma's sub-layers
    (HF's names and order: self_attn, mlp, input_layernorm, post_attention_layernorm)."""

    def __init__(self, config: GemmaConfig, index: int = 0, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        Module.__init__(self, dtype)
        _gemma_sublayers(self, config, index, np.random.default_rng(rng), dtype,
                         ("input_layernorm", "post_attention_layernorm"))


class Gemma2DecoderLayerCache(NamedTuple):
    input_layernorm: RMSNormCache               # of x (B, T, C)
    self_attn: AttentionLayerCache              # its `present` is this layer's KV cache
    post_attention_layernorm: RMSNormCache      # of the attention's output a (B, T, C)
    pre_feedforward_layernorm: RMSNormCache     # of u (B, T, C)
    mlp: SwiGLUCache                            # of pre_feedforward_layernorm(u)
    post_feedforward_layernorm: RMSNormCache    # of the MLP's output f (B, T, C)


class Gemma2DecoderLayer(Module):
    """Gemma2's block, a norm before and after each sub-layer (HF's names and order:
    self_attn, mlp, input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
    post_feedforward_layernorm)."""

    def __init__(self, config: GemmaConfig, index: int = 0, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        _gemma_sublayers(self, config, index, np.random.default_rng(rng), dtype,
                         ("input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"))

    def forward(self, x, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """x (B, T, C) -> y (B, T, C), one sub-layer per line."""
        h, input_norm = self.input_layernorm.forward(x)                 # (B, T, C)
        a, attention = self.self_attn.forward(
            h, is_causal=True, key_padding_mask=key_padding_mask, positions=positions,
            past_kv=past_kv, rng=rng)                                   # (B, T, C)
        a, post_attention = self.post_attention_layernorm.forward(a)    # (B, T, C)
        u = x + a
        h, pre_feedforward = self.pre_feedforward_layernorm.forward(u)  # (B, T, C)
        f, mlp = self.mlp.forward(h)                                    # (B, T, C)
        f, post_feedforward = self.post_feedforward_layernorm.forward(f)
        y = u + f
        return y, Gemma2DecoderLayerCache(input_norm, attention, post_attention,
                                          pre_feedforward, mlp, post_feedforward)

    def backward(self, dy, cache: Gemma2DecoderLayerCache):
        """The forward in exact reverse, each line commented with the forward line it undoes.
        Each residual passes its gradient straight through and adds its branch's input
        gradient: du = dy + dMLP-branch, dx = du + dattn-branch."""
        df = self.post_feedforward_layernorm.backward(
            dy, cache.post_feedforward_layernorm)                   # f = post_ff(f); y = u + f
        dh = self.mlp.backward(df, cache.mlp)                       # f = mlp(h)
        du = dy + self.pre_feedforward_layernorm.backward(
            dh, cache.pre_feedforward_layernorm)                    # h = pre_feedforward(u)
        da = self.post_attention_layernorm.backward(
            du, cache.post_attention_layernorm)                     # a = post_attn(a); u = x + a
        dh = self.self_attn.backward(da, cache.self_attn)           # a = self_attn(h)
        dx = du + self.input_layernorm.backward(dh, cache.input_layernorm)  # h = input_norm(x)
        return dx


class GemmaCache(NamedTuple):
    embed_tokens: EmbeddingCache    # the ids (B, T) looked up
    layers: list                    # one block cache per layer, in forward order
    norm: RMSNormCache              # of the last layer's output (B, T, C)
    lm_head: LinearCache            # the head's input (B, T, C) and weight (V, C)
    final_softcap: SoftCapCache | None  # tanh(logits / c) (B, T, V), Gemma2's final cap
    present: list                   # per layer, the KVCache (k, v) heads (B, G, P + T, d)

    @property
    def output_spec(self):      # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.lm_head)


class Gemma(Llama):
    """The decoder-only Gemma / Gemma2 model; `Gemma(GemmaConfig(...))`, or
    numpy_tf.interop.from_hf for a Hugging Face Gemma or Gemma2 checkpoint. Llama's input
    checks, initialisation and resize_token_embeddings carry over."""

    config_class = GemmaConfig

    def __init__(self, config: GemmaConfig = GemmaConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(config, rng=rng, dtype=dtype)
        c = self.config
        self.final_softcap = None if c.final_logit_softcapping is None else \
            SoftCap(c.final_logit_softcapping, dtype=dtype)

    def _decoder_layer(self, index: int, rng: np.random.Generator, dtype) -> Module:
        block = Gemma2DecoderLayer if self.config.model_type == "gemma2" else GemmaDecoderLayer
        return block(self.config, index, rng=rng, dtype=dtype)

    def _final_norm(self, dtype) -> Module:
        """Gemma's RMSNorm scales by 1 + weight."""
        return RMSNorm(self.config.hidden_size, self.config.rms_norm_eps, dtype=dtype,
                       unit_offset=True)

    @property
    def normalizer(self) -> np.ndarray:
        """sqrt(hidden_size) rounded to the model's dtype (a 0-d array: no upcast)."""
        return np.asarray(self.config.hidden_size ** 0.5, dtype=self.dtype)

    def forward(self, ids, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """ids (B, T) -> logits (B, T, V), causal; the arguments are Llama.forward's."""
        self._check_inputs(ids, key_padding_mask, past_kv, positions)
        caches, present = [], []
        x, embed_tokens = self.embed_tokens.forward(ids)            # (B, T, C)
        x = x * self.normalizer                                     # times sqrt(C)
        for index, layer in enumerate(self.layers):
            x, cache = layer.forward(x, key_padding_mask,
                                     None if past_kv is None else past_kv[index], positions,
                                     rng)                           # (B, T, C)
            caches.append(cache)
            present.append(cache.self_attn.present)
        x, norm = self.norm.forward(x)                              # (B, T, C)
        logits, lm_head = self.lm_head.forward(x)                   # (B, T, V)
        final_softcap = None
        if self.final_softcap is not None:
            logits, final_softcap = self.final_softcap.forward(logits)  # c tanh(logits / c)
        return logits, GemmaCache(embed_tokens, caches, norm, lm_head, final_softcap, present)

    def backward(self, dlogits, cache: GemmaCache):
        """The forward in exact reverse; returns None (integer ids have no gradient)."""
        validate.backward_inputs(dlogits, cache, GemmaCache, "dlogits")
        if cache.final_softcap is not None:
            dlogits = self.final_softcap.backward(dlogits, cache.final_softcap)
        dx = self.lm_head.backward(dlogits, cache.lm_head)          # logits = lm_head(x)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.norm.backward(dx, cache.norm)                     # x = norm(x)
        for layer, layer_cache in zip(reversed(list(self.layers)), reversed(cache.layers)):
            dx = layer.backward(dx, layer_cache)                    # x = layer(x)
        dx = dx * self.normalizer                                   # x = x sqrt(C)
        self.embed_tokens.backward(dx, cache.embed_tokens)          # x = embed_tokens(ids)
        return None
