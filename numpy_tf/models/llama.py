"""The Llama decoder (HF LlamaForCausalLM): RMSNorm, rotary positions, grouped-query attention and
a SwiGLU feed-forward.

Shapes: B batch, T new positions, P positions already in a KV cache, C hidden_size, F
intermediate_size, H query heads, G key/value heads (G divides H), d head_dim, V vocab_size.

    ids (B, T) -> embed_tokens (B, T, C) -> N blocks -> norm (RMSNorm) -> lm_head (B, T, V)

A block is pre-norm, with no position table:
    u = x + SelfAttn(input_layernorm(x))          causal; RoPE on q and k (HF's halves layout)
    y = u + MLP(post_attention_layernorm(u))      MLP(h) = down(silu(gate(h)) * up(h))

The options of the config cover the Llama-shaped families of Hugging Face:
- attention_bias: biases on q_proj, k_proj, v_proj and o_proj (HF Llama's attention_bias);
  attention_output_bias=False keeps o_proj without one (Qwen2: q, k and v biases only);
- qk_norm: q_norm and k_norm, RMSNorms (weight (d,), eps rms_norm_eps) over each query and
  key head, after the projection and before RoPE (Qwen3), with head_dim free of C / H;
- rope_scaling: a scaled RoPE, rope_type linear, dynamic, llama3, yarn or longrope
  (numpy_tf.layers.rope_scaling: Llama 3.1's context, YaRN, NTK, Phi-3 128k);
- Phi-3 is this model too: its fused qkv_proj and gate_up_proj are split into q/k/v_proj and
  gate/up_proj by numpy_tf.interop (numpy_tf.interop.hf_llama), bit for bit both ways.

Parameter names are HF's with the `model.` prefix dropped: embed_tokens.weight,
layers.0.self_attn.q_proj.weight, ..., layers.0.mlp.gate_proj.weight, ...,
layers.0.input_layernorm.weight, layers.0.post_attention_layernorm.weight, norm.weight,
lm_head.weight (numpy_tf.interop adds the prefix). With tie_word_embeddings the head is the
token embedding: one Parameter whose gradient is the sum of its two uses.

Positions: RoPE rotates by position p = P + t by default (t = 0 .. T-1); explicit `positions`
(T,) or (B, T) serve left padding (HF's cumsum(attention_mask) - 1). RoPE has no table, so no
length is refused: max_position_embeddings is only the length the model was trained for.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, ModuleList
from ..layers.attention import check_window
from ..layers.embedding import Embedding, EmbeddingCache, normal_init
from ..layers.linear import Linear, LinearCache
from ..layers.mlp import SwiGLU, SwiGLUCache
from ..layers.multihead import AttentionLayerCache, MultiHeadAttention
from ..layers.norm import RMSNorm, RMSNormCache
from ..layers.rope_scaling import RopeScaling, as_rope_scaling, check_rope_scaling
from . import checks
from .accounting import count_llama
from .resize import check_new_size, normal, resize_embedding, resize_head


@dataclass(frozen=True)
class LlamaConfig:
    """HF LlamaConfig's fields that shape the computation, with HF's names. head_dim None is
    hidden_size // num_attention_heads; num_key_value_heads None is num_attention_heads.
    attention_output_bias None follows attention_bias; qk_norm and rope_scaling: see the
    module text (rope_scaling may be given as a RopeScaling or its fields as a dict)."""
    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 24
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048     # documentation only: longer inputs are allowed
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    pad_token_id: int | None = None         # its embedding row gets no gradient, as in HF
    initializer_range: float = 0.02
    sliding_window: int | None = None       # Mistral's: query i sees keys j > i - W only
    attention_output_bias: bool | None = None   # None: attention_bias (Qwen2: False)
    qk_norm: bool = False                       # Qwen3's q_norm / k_norm per head
    rope_scaling: RopeScaling | None = None     # linear, dynamic, llama3, yarn, longrope

    def __post_init__(self):
        object.__setattr__(self, "rope_scaling", as_rope_scaling(self.rope_scaling))
        integer, flag = validate.positive_int, validate.flag
        validate.config_fields(self, {
            "vocab_size": integer, "hidden_size": integer, "intermediate_size": integer,
            "num_hidden_layers": integer, "num_attention_heads": integer,
            "num_key_value_heads": validate.optional(integer),
            "head_dim": validate.optional(integer), "max_position_embeddings": integer,
            "tie_word_embeddings": flag, "attention_bias": flag, "mlp_bias": flag,
            "attention_output_bias": validate.optional(flag), "qk_norm": flag,
            "attention_dropout": validate.bounded(0.0, 1.0, high_open=True),
            "initializer_range": validate.bounded(low=0.0)})
        heads, kv_heads = self.num_attention_heads, self.kv_heads
        validate.positive_int("num_key_value_heads", kv_heads)
        if heads % kv_heads:
            raise ValueError(f"num_key_value_heads ({kv_heads}) must divide "
                             f"num_attention_heads ({heads}): each key/value head serves "
                             "an equal group of query heads")
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({heads}), or give head_dim")
        validate.even_positive_int("head_dim", self.head_width, "RoPE rotates pairs of "
                                   "features")
        if self.rope_scaling is not None:
            check_rope_scaling(self.rope_scaling, self.head_width)
        validate.config_fields(self, {
            "rms_norm_eps": validate.positive_float, "rope_theta": validate.positive_float,
            "pad_token_id": lambda name, value: validate.optional_index(
                name, value, self.vocab_size, "a row of the vocabulary")})
        check_window("sliding_window", self.sliding_window)

    @property
    def output_bias(self) -> bool:
        """Whether o_proj has a bias."""
        return self.attention_bias if self.attention_output_bias is None \
            else self.attention_output_bias

    @property
    def kv_heads(self) -> int:
        return self.num_attention_heads if self.num_key_value_heads is None \
            else self.num_key_value_heads

    @property
    def head_width(self) -> int:
        return self.hidden_size // self.num_attention_heads if self.head_dim is None \
            else self.head_dim

    def num_parameters(self) -> int:
        """The count of trainable scalars, from the shapes alone (nothing is allocated); a tied
        head is counted once. The formula is accounting.count_llama's, per component."""
        return count_llama(self).total

    @classmethod
    def smollm2_135m(cls, **changes) -> "LlamaConfig":
        """HuggingFaceTB/SmolLM2-135M's shape: 134,515,008 parameters."""
        base = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                    max_position_embeddings=8192)
        return cls(**{**base, **changes})

    @classmethod
    def llama2_7b(cls, **changes) -> "LlamaConfig":
        """meta-llama/Llama-2-7b-hf's shape: 6,738,415,616 parameters (do not allocate it
        casually: 54 GB in float64)."""
        base = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096)
        return cls(**{**base, **changes})

    @classmethod
    def llama3_2_1b(cls, **changes) -> "LlamaConfig":
        """meta-llama/Llama-3.2-1B's shape, with its llama3 RoPE: 1,235,814,400 parameters."""
        base = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                    tie_word_embeddings=True, max_position_embeddings=131072,
                    rope_scaling=RopeScaling("llama3", 32.0, 8192, low_freq_factor=1.0,
                                             high_freq_factor=4.0))
        return cls(**{**base, **changes})

    @classmethod
    def qwen2_5_0_5b(cls, **changes) -> "LlamaConfig":
        """Qwen/Qwen2.5-0.5B's shape (q, k, v biases; tied head): 494,032,768 parameters."""
        base = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                    max_position_embeddings=32768, attention_bias=True,
                    attention_output_bias=False)
        return cls(**{**base, **changes})

    @classmethod
    def qwen3_0_6b(cls, **changes) -> "LlamaConfig":
        """Qwen/Qwen3-0.6B's shape (q_norm and k_norm; head_dim 128 for hidden 1024 and 16
        heads; tied head): 596,049,920 parameters."""
        base = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, max_position_embeddings=40960, qk_norm=True)
        return cls(**{**base, **changes})

    @classmethod
    def phi3_mini_4k(cls, **changes) -> "LlamaConfig":
        """microsoft/Phi-3-mini-4k-instruct's shape (its checkpoint fuses qkv_proj and
        gate_up_proj): 3,821,079,552 parameters."""
        base = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
                    pad_token_id=32000)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return asdict(self)


class LlamaDecoderLayerCache(NamedTuple):
    input_layernorm: RMSNormCache           # of x (B, T, C)
    self_attn: AttentionLayerCache          # its `present` is this layer's KV cache
    post_attention_layernorm: RMSNormCache  # of u (B, T, C)
    mlp: SwiGLUCache                        # of post_attention_layernorm(u)


class LlamaDecoderLayer(Module):
    """One pre-norm block (HF's names and order: self_attn, mlp, input_layernorm,
    post_attention_layernorm)."""

    def __init__(self, config: LlamaConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        c = config
        self.self_attn = MultiHeadAttention(
            c.hidden_size, c.num_attention_heads, c.kv_heads, c.head_width, c.attention_bias,
            c.attention_dropout, rope=True, rope_base=c.rope_theta, rope_interleaved=False,
            output_bias=c.output_bias, head_norm_eps=c.rms_norm_eps if c.qk_norm else None,
            rope_scaling=c.rope_scaling, sliding_window=c.sliding_window, rng=rng, dtype=dtype)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, c.mlp_bias, rng=rng, dtype=dtype)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=dtype)

    def forward(self, x, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """x (B, T, C) -> y (B, T, C), one sub-layer per line."""
        h, input_norm = self.input_layernorm.forward(x)             # (B, T, C)
        a, attention = self.self_attn.forward(
            h, is_causal=True, key_padding_mask=key_padding_mask, positions=positions,
            past_kv=past_kv, rng=rng)                               # (B, T, C)
        u = x + a
        h, post_norm = self.post_attention_layernorm.forward(u)     # (B, T, C)
        f, mlp = self.mlp.forward(h)                                # (B, T, C)
        y = u + f
        return y, LlamaDecoderLayerCache(input_norm, attention, post_norm, mlp)

    def backward(self, dy, cache: LlamaDecoderLayerCache):
        """The forward in exact reverse, each line commented with the forward line it undoes.
        Each residual passes its gradient straight through and adds its branch's input
        gradient: du = dy + dMLP-branch, dx = du + dattn-branch."""
        dh = self.mlp.backward(dy, cache.mlp)                       # f = mlp(h); y = u + f
        du = dy + self.post_attention_layernorm.backward(
            dh, cache.post_attention_layernorm)                 # h = post_attention_layernorm(u)
        dh = self.self_attn.backward(du, cache.self_attn)           # a = self_attn(h); u = x + a
        dx = du + self.input_layernorm.backward(dh, cache.input_layernorm)  # h = input_layernorm(x)
        return dx


class LlamaCache(NamedTuple):
    embed_tokens: EmbeddingCache    # the ids (B, T) looked up
    layers: list                # one LlamaDecoderLayerCache per layer, in forward order
    norm: RMSNormCache          # of the last layer's output (B, T, C)
    lm_head: LinearCache        # the head's input (B, T, C) and weight (V, C)
    present: list               # per layer, the KVCache (k, v) heads (B, G, P + T, d) after
                                # this call: the next past_kv

    @property
    def output_spec(self):      # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.lm_head)


class Llama(Module):
    """The decoder-only Llama model; `Llama(LlamaConfig(...))`, or numpy_tf.interop.from_hf
    for a Hugging Face LlamaForCausalLM's weights. The families built on it (Mixtral, Gemma)
    change its config class, its decoder layer and its final norm."""
    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig = LlamaConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        kind = self.config_class
        if not isinstance(config, kind):
            raise TypeError(f"config must be a {kind.__name__} (use numpy_tf.interop.from_hf "
                            f"for a Hugging Face config); got {type(config).__name__}")
        rng = np.random.default_rng(rng)
        self.config = c = config
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, c.pad_token_id, rng=rng,
                                      dtype=dtype)
        self.layers = ModuleList([self._decoder_layer(index, rng, dtype)
                                  for index in range(c.num_hidden_layers)], dtype=dtype)
        self.norm = self._final_norm(dtype)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False, rng=rng, dtype=dtype)
        self._initialize(rng)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _decoder_layer(self, index: int, rng: np.random.Generator, dtype) -> Module:
        """Block `index` of the stack (index 0 first)."""
        return LlamaDecoderLayer(self.config, rng=rng, dtype=dtype)

    def _final_norm(self, dtype) -> Module:
        """The norm after the last block."""
        return RMSNorm(self.config.hidden_size, self.config.rms_norm_eps, dtype=dtype)

    def _initialize(self, rng: np.random.Generator) -> None:
        """HF's rule: every Linear and Embedding weight N(0, initializer_range^2), biases
        zero, the padding row zero; RMSNorm weights keep their ones."""
        for _, module in self.named_modules():
            if isinstance(module, (Linear, Embedding)):
                module.weight.data[...] = normal_init(rng, module.weight.shape,
                                                      self.config.initializer_range, self.dtype)
            if isinstance(module, Linear) and module.bias is not None:
                module.bias.data[...] = 0.0
        if self.config.pad_token_id is not None:
            self.embed_tokens.weight.data[self.config.pad_token_id] = 0.0

    def resize_token_embeddings(self, new_num_tokens: int, *,
                                rng: np.random.Generator) -> None:
        """The vocabulary grown (or cut) to new_num_tokens (numpy_tf.models.resize): the new
        rows of embed_tokens and of the untied lm_head drawn N(0, initializer_range^2) from
        `rng`, as HF initialises them (the padding row is kept); a tied head stays tied;
        config.vocab_size follows."""
        n = check_new_size(new_num_tokens, self.config.pad_token_id)
        draw = normal(validate.generator("rng", rng), self.config.initializer_range,
                      self.dtype)
        resize_embedding(self.embed_tokens, n, draw)
        resize_head(self.lm_head, n, draw,
                    tied_to=self.embed_tokens if self.config.tie_word_embeddings else None)
        self.config = replace(self.config, vocab_size=n)

    def _check_inputs(self, ids, key_padding_mask, past_kv, positions) -> None:
        validate.integer_array("ids", ids, ndim=2, shape="(B, T)")
        validate.ids_in_range("ids", ids, self.config.vocab_size)
        c = self.config
        past_length = checks.past_kv(past_kv, len(self.layers), batch=ids.shape[0],
                                     heads=c.kv_heads, head_dim=c.head_width, dtype=self.dtype,
                                     legend="B, G, P, d")
        if key_padding_mask is not None:
            expected = (ids.shape[0], past_length + ids.shape[1])
            if np.shape(key_padding_mask) != expected:
                raise ValueError(f"key_padding_mask must have shape (B, Tk) = {expected} (the "
                                 f"cached and the new positions); got {np.shape(key_padding_mask)}")
        if positions is not None:
            validate.integer_array("positions", positions, ndim=(1, 2), shape="(T,) or (B, T)")
            expected = ((ids.shape[1],), ids.shape)
            if positions.shape not in expected:
                raise ValueError(f"positions must have shape (T,) = {expected[0]} or (B, T) = "
                                 f"{expected[1]} to match ids; got {positions.shape}")
            validate.non_negative_entries("positions", positions)

    def forward(self, ids, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """ids (B, T) -> logits (B, T, V), causal. `key_padding_mask` (B, P + T) is True at
        padding; `past_kv` is the cache's `present` of an earlier call (P positions); RoPE
        positions default to P .. P + T - 1, or are given as (T,) or (B, T) integers."""
        self._check_inputs(ids, key_padding_mask, past_kv, positions)
        caches, present = [], []
        x, embed_tokens = self.embed_tokens.forward(ids)            # (B, T, C)
        for index, layer in enumerate(self.layers):
            x, cache = layer.forward(x, key_padding_mask,
                                     None if past_kv is None else past_kv[index], positions,
                                     rng)                           # (B, T, C)
            caches.append(cache)
            present.append(cache.self_attn.present)
        x, norm = self.norm.forward(x)                              # (B, T, C)
        logits, lm_head = self.lm_head.forward(x)                   # (B, T, V)
        return logits, LlamaCache(embed_tokens, caches, norm, lm_head, present)

    def backward(self, dlogits, cache: LlamaCache):
        """The forward in exact reverse; returns None (integer ids have no gradient).
        dlogits must have exactly the logits' shape (B, T, V) and dtype."""
        validate.backward_inputs(dlogits, cache, LlamaCache, "dlogits")
        dx = self.lm_head.backward(dlogits, cache.lm_head)          # logits = lm_head(x)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.norm.backward(dx, cache.norm)                     # x = norm(x)
        for layer, layer_cache in zip(reversed(list(self.layers)), reversed(cache.layers)):
            dx = layer.backward(dx, layer_cache)                    # x = layer(x)
        self.embed_tokens.backward(dx, cache.embed_tokens)          # x = embed_tokens(ids)
        return None
