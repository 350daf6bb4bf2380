"""The Mixtral decoder (HF MixtralForCausalLM): Llama's block with its feed-forward replaced by a
sparse mixture of SwiGLU experts (layers/moe.py), and its objective with the router's
load-balancing loss.

Shapes: B batch, T new positions, P positions already in a KV cache, C hidden_size, F
intermediate_size (of one expert), E num_local_experts, k num_experts_per_tok, H query heads,
G key/value heads, d head_dim, V vocab_size, L num_hidden_layers.

    ids (B, T) -> embed_tokens (B, T, C) -> L blocks -> norm (RMSNorm) -> lm_head (B, T, V)

A block is Llama's (models/llama.py) but for the feed-forward:
    u = x + SelfAttn(input_layernorm(x))          causal; RoPE (halves); grouped-query heads
    y = u + MoE(post_attention_layernorm(u))      each token through k of E SwiGLU experts,
                                                  weighted by the renormalised router softmax

Parameter names are HF's (transformers 5) without the `model.` prefix: embed_tokens.weight,
layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.mlp.gate.weight (E, C) (the router),
layers.0.mlp.experts.gate_up_proj (E, 2F, C), layers.0.mlp.experts.down_proj (E, C, F),
layers.0.input_layernorm.weight, layers.0.post_attention_layernorm.weight, norm.weight,
lm_head.weight. numpy_tf.interop also reads the per-expert w1 / w2 / w3 of hub checkpoints.

The objective, HF's `loss` (MixtralLoss, the registry's objective for the family):

    loss = CE + router_aux_loss_coef * aux        with output_router_logits (config or call)
    loss = CE                                     without

CE is the mean next-token cross-entropy (NextTokenLoss: padded positions predict nothing and are
not predicted) and aux the load-balancing loss of every layer's router logits over the real
tokens (layers/moe.py load_balancing_loss_forward). This equals HF's

    out = hf_model(input_ids=ids, attention_mask=1 - key_padding_mask, labels=labels,
                   output_router_logits=True)       # labels = ids, -100 at padding
    out.loss                                         # MixtralLoss(model).forward(ids, mask)[0]
    out.aux_loss                                     # cache.aux_loss

and `MixtralLoss(model).backward(1.0, cache)` gives the gradients of out.loss
(numpy_tf.interop.to_hf(model, config, grads=True) names them as HF does). HF computes its
cross-entropy (logits.float()) and its auxiliary loss (float32 sums) in float32 even in a
float64 model; numpy_tf works in the model's dtype.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
from ..layers.cross_entropy_loss import (CrossEntropyCache, cross_entropy_backward,
                                         cross_entropy_forward)
from ..layers.embedding import EmbeddingCache, normal_init
from ..layers.linear import LinearCache
from ..layers.moe import (LoadBalancingCache, MoEExperts, SparseMoE,
                          load_balancing_loss_backward, load_balancing_loss_forward)
from ..layers.norm import RMSNormCache
from . import checks
from .accounting import count_mixtral
from .llama import Llama, LlamaConfig, LlamaDecoderLayer, LlamaDecoderLayerCache
from .objectives import NextTokenLoss, shifted_targets


@dataclass(frozen=True)
class MixtralConfig:
    """HF MixtralConfig's fields that shape the computation, with HF's names (defaults: a toy
    size; HF's defaults are Mixtral-8x7B's, MixtralConfig.mixtral_8x7b()). head_dim None is
    hidden_size // num_attention_heads; num_key_value_heads None is num_attention_heads.
    sliding_window W is Mistral's (HF's: query i sees key j when i - j < W), in the full forward
    and in KV-cache decoding, as LlamaConfig(sliding_window=W) computes it."""
    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 24
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False      # HF's default: the loss is the cross-entropy alone
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096     # documentation only: longer inputs are allowed
    attention_dropout: float = 0.0
    sliding_window: int | None = None
    pad_token_id: int | None = None         # its embedding row gets no gradient, as in HF
    initializer_range: float = 0.02

    def __post_init__(self):
        self.llama_config()             # the fields Llama shares are checked as Llama's
        validate.positive_int("num_local_experts", self.num_local_experts)
        validate.positive_int("num_experts_per_tok", self.num_experts_per_tok)
        if self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be at most "
                             f"num_local_experts ({self.num_local_experts}): each token "
                             "chooses that many different experts")
        validate.number("router_aux_loss_coef", self.router_aux_loss_coef)
        validate.flag("output_router_logits", self.output_router_logits)

    def llama_config(self) -> LlamaConfig:
        """The Llama whose blocks these are but for the feed-forward (its intermediate_size is
        one expert's)."""
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            attention_dropout=self.attention_dropout, pad_token_id=self.pad_token_id,
            initializer_range=self.initializer_range, sliding_window=self.sliding_window)

    @property
    def kv_heads(self) -> int:
        return self.num_attention_heads if self.num_key_value_heads is None \
            else self.num_key_value_heads

    @property
    def head_width(self) -> int:
        return self.hidden_size // self.num_attention_heads if self.head_dim is None \
            else self.head_dim

    def num_parameters(self) -> int:
        """The count of trainable scalars (accounting.count_mixtral), every expert counted."""
        return count_mixtral(self).total

    def active_parameters(self) -> int:
        """The parameters one token's forward uses: k of the E experts in each layer."""
        return count_mixtral(self).active

    @classmethod
    def mixtral_8x7b(cls, **changes) -> "MixtralConfig":
        """mistralai/Mixtral-8x7B-v0.1's shape: 46,702,792,704 parameters, 12,879,925,248 of
        them active per token (do not allocate it: 374 GB in float64)."""
        base = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-5,
                    rope_theta=1e6, max_position_embeddings=32768)
        return cls(**{**base, **changes})

    def to_dict(self) -> dict:
        return asdict(self)


class MixtralDecoderLayer(LlamaDecoderLayer):
    """Llama's block (HF's names and order: self_attn, mlp, input_layernorm,
    post_attention_layernorm) with mlp the SparseMoE (router `gate`, `experts`); its forward is
    Llama's, and its cache a LlamaDecoderLayerCache whose `mlp` is a MoECache (which holds the
    router logits)."""

    def __init__(self, config: MixtralConfig, *, rng: np.random.Generator | int = 0,
                 dtype=np.float64):
        rng = np.random.default_rng(rng)
        super().__init__(config.llama_config(), rng=rng, dtype=dtype)
        c = config
        self.mlp = SparseMoE(c.hidden_size, c.intermediate_size, c.num_local_experts,
                             c.num_experts_per_tok, rng=rng, dtype=dtype)

    def backward(self, dy, cache: LlamaDecoderLayerCache, drouter_logits=None):
        """Llama's backward, the forward in exact reverse. `drouter_logits` (B T, E) is the
        gradient the router logits get from outside the block (the auxiliary loss); the MoE
        adds it to its own."""
        dh = self.mlp.backward(dy, cache.mlp, drouter_logits)       # f = mlp(h); y = u + f
        du = dy + self.post_attention_layernorm.backward(
            dh, cache.post_attention_layernorm)                 # h = post_attention_layernorm(u)
        dh = self.self_attn.backward(du, cache.self_attn)           # a = self_attn(h); u = x + a
        dx = du + self.input_layernorm.backward(dh, cache.input_layernorm)  # h = input_layernorm(x)
        return dx


class MixtralCache(NamedTuple):
    embed_tokens: EmbeddingCache    # the ids (B, T) looked up
    layers: list                # one LlamaDecoderLayerCache per layer (mlp: a MoECache)
    norm: RMSNormCache          # of the last layer's output (B, T, C)
    lm_head: LinearCache        # the head's input (B, T, C) and weight (V, C)
    present: list               # per layer, the KVCache (k, v) (B, G, P + T, d): the next past_kv
    router_logits: list         # per layer, the router logits (B T, E) (HF's router_logits)

    @property
    def output_spec(self):      # the (shape, dtype) of the logits: dlogits's
        return checks.head_spec(self.lm_head)


class Mixtral(Llama):
    """The decoder-only Mixtral model; `Mixtral(MixtralConfig(...))`, or numpy_tf.interop.from_hf
    for a Hugging Face MixtralForCausalLM's weights. Shares Llama's input checks and
    resize_token_embeddings; its blocks are MixtralDecoderLayers."""

    config_class = MixtralConfig

    def __init__(self, config: MixtralConfig = MixtralConfig(), *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(config, rng=rng, dtype=dtype)

    def _decoder_layer(self, index: int, rng: np.random.Generator, dtype) -> Module:
        return MixtralDecoderLayer(self.config, rng=rng, dtype=dtype)

    def _initialize(self, rng: np.random.Generator) -> None:
        """HF's rule: Llama's (every Linear and Embedding weight, the router's among them,
        N(0, initializer_range^2)), and the experts' gate_up_proj and down_proj too."""
        super()._initialize(rng)
        for _, module in self.named_modules():
            if isinstance(module, MoEExperts):
                for parameter in (module.gate_up_proj, module.down_proj):
                    parameter.data[...] = normal_init(rng, parameter.shape,
                                                      self.config.initializer_range, self.dtype)

    def forward(self, ids, key_padding_mask=None, past_kv=None, positions=None, rng=None):
        """ids (B, T) -> logits (B, T, V): Llama's forward (its key_padding_mask, past_kv and
        positions) through these blocks; the cache adds each layer's router logits, what the
        auxiliary loss reads."""
        logits, cache = super().forward(ids, key_padding_mask, past_kv, positions, rng)
        router_logits = [layer.mlp.router_logits for layer in cache.layers]
        return logits, MixtralCache(**cache._asdict(), router_logits=router_logits)

    def backward(self, dlogits, cache: MixtralCache, drouter_logits=None):
        """The forward in exact reverse; `drouter_logits` (one (B T, E) per layer, or None) is
        the gradient of the router logits from the auxiliary loss. Returns None."""
        validate.backward_inputs(dlogits, cache, MixtralCache, "dlogits")
        if drouter_logits is not None:
            if len(drouter_logits) != len(cache.layers):
                raise ValueError(f"drouter_logits must hold one (B T, E) gradient per layer "
                                 f"({len(cache.layers)}); got {len(drouter_logits)}")
            for index, (d, z) in enumerate(zip(drouter_logits, cache.router_logits)):
                validate.gradient(f"drouter_logits[{index}]", d, z.shape, z.dtype, "the router")
        if drouter_logits is None:
            drouter_logits = [None] * len(cache.layers)
        dx = self.lm_head.backward(dlogits, cache.lm_head)          # logits = lm_head(x)
        del dlogits                 # (B, T, V), often the largest array: not held any longer
        dx = self.norm.backward(dx, cache.norm)                     # x = norm(x)
        for layer, layer_cache, drouter in zip(reversed(list(self.layers)),
                                               reversed(cache.layers),
                                               reversed(drouter_logits)):
            dx = layer.backward(dx, layer_cache, drouter)           # x = layer(x)
        self.embed_tokens.backward(dx, cache.embed_tokens)          # x = embed_tokens(ids)
        return None


class MixtralLossCache(NamedTuple):
    model: MixtralCache
    loss: CrossEntropyCache         # of the logits against the shifted targets
    logits: np.ndarray              # (B, T, V)
    aux: LoadBalancingCache | None  # None without output_router_logits
    aux_loss: np.ndarray | None     # 0-d, the auxiliary loss alone (HF's out.aux_loss)
    coefficient: float              # router_aux_loss_coef


class MixtralLoss(NextTokenLoss):
    """HF's MixtralForCausalLM `loss` (see the module text): forward(ids, key_padding_mask=None,
    **model_kwargs) -> (mean next-token cross-entropy + router_aux_loss_coef * aux, cache);
    the auxiliary term is there when `output_router_logits` (None: the model config's, as HF
    reads it) is True. The auxiliary loss counts the rows of this call's tokens; with a
    past_kv, the last T columns of key_padding_mask mark their padding."""

    def __init__(self, model: Module, label_smoothing: float = 0.0,
                 output_router_logits: bool | None = None):
        super().__init__(model, label_smoothing)
        if output_router_logits is not None:
            validate.flag("output_router_logits", output_router_logits)
        self.output_router_logits = output_router_logits

    def forward(self, ids, key_padding_mask=None, **model_kwargs):
        c = self.model.config
        targets = shifted_targets(ids, key_padding_mask)     # checks the mask before any work
        logits, model_cache = self.model.forward(ids, key_padding_mask=key_padding_mask,
                                                 **model_kwargs)
        cross_entropy, ce_cache = cross_entropy_forward(logits, targets,
                                                        label_smoothing=self.label_smoothing)
        with_aux = c.output_router_logits if self.output_router_logits is None \
            else self.output_router_logits
        if not with_aux:
            return cross_entropy, MixtralLossCache(model_cache, ce_cache, logits, None, None, 0.0)
        padding = None
        if key_padding_mask is not None:
            padding = np.asarray(key_padding_mask, dtype=bool)[:, -ids.shape[1]:].reshape(-1)
        aux, aux_cache = load_balancing_loss_forward(model_cache.router_logits,
                                                     c.num_experts_per_tok, padding)
        loss = cross_entropy + c.router_aux_loss_coef * aux
        return loss, MixtralLossCache(model_cache, ce_cache, logits, aux_cache, aux,
                                      c.router_aux_loss_coef)

    def backward(self, dloss, cache: MixtralLossCache):
        """loss = CE(logits) + coefficient * aux(router logits): each term's gradient, then the
        model's backward with both."""
        validate.cache_kind(cache, MixtralLossCache)
        drouter_logits = None
        if cache.aux is not None:                                   # + coefficient * aux
            drouter_logits = load_balancing_loss_backward(cache.coefficient * float(dloss),
                                                          cache.aux)
        # dlogits = d CE / d logits is passed without a name here, so that the model's
        # backward can let the (B, T, V) array go once its head has used it
        return self.model.backward(cross_entropy_backward(dloss, cache.loss), cache.model,
                                   drouter_logits)



