"""Counting parameters: exact counts from a model, exact counts from a config alone, and the
12 d^2 rule of thumb.

Per block of width d with a 4d feed-forward, attention has four d x d projections (4 d^2) and the
feed-forward two d x 4d matrices (8 d^2): about 12 d^2 per block, the biases and norms adding
only O(d) (a SwiGLU FFN of width I has three matrices, 3 d I, about 8 d^2 at I = 8d/3). The tiny
GPT's block (no attention biases) has exactly 12 d^2 + 9 d: its FFN biases (4d + d) and two
LayerNorms (4d). The whole model is then about L 12 d^2 + V d.

`account(config)` counts from the formulas below, never allocating a weight. Each family's
count is written once, here, and named in its numpy_tf.models.registry entry (`count` for a
numpy_tf config, `count_hf` for a Hugging Face config.json, `hf_config` between the two);
LlamaConfig.num_parameters is count_llama's total. Shapes: V vocabulary, d width, F FFN width,
L blocks; Llama adds H query heads, KV key/value heads, hd head width, I the SwiGLU width.

    GPT (GPTConfig, HF gpt2)  tokens V d, positions ctx d; per block: norm 2d, qkv 3d^2 (+3d),
                              attention output d^2 (+d), norm 2d, FFN d F (+F) + F d (+d);
                              final norm 2d; head V d unless tied to the tokens
    Llama (LlamaConfig,       embed V d; per block: RMSNorm d, q d H hd, k and v d KV hd each,
      HF llama)               o H hd d (biases H hd + 2 KV hd + d with attention_bias), RMSNorm d,
                              gate/up/down 3 d I (+2I + d with mlp_bias); final norm d;
                              lm_head V d unless tied
    GPT-NeoX (NeoXConfig,     embed_in V d; per layer: two LayerNorms 2d each, query_key_value
      HF gpt_neox)            3d^2 and dense d^2 (+3d + d with attention_bias), mlp 2 d F + F + d;
                              final_layer_norm 2d; embed_out (HF 5: lm_head) V d unless tied
    BERT (BertConfig,         word V d, positions P d, token types T d, LayerNorm 2d; per layer:
      HF bert)                qkv 3(d^2 + d), output d^2 + d, LayerNorm 2d, intermediate d I + I,
                              output I d + d, LayerNorm 2d; then by architecture (below)

    Encoder-decoder           per encoder layer: self_attn 4d² (+4d), linear1 d F (+F), linear2
      (Seq2SeqConfig, torch   F d (+d), norm1 and norm2 2d (d without bias); per decoder layer:
      kwargs with             the same and multihead_attn 4d² (+4d), norm3; final norms
      "torch_module":         encoder.norm and decoder.norm 2d each (unless final_norms=False);
      "torch.nn.Transformer") Seq2Seq adds src_embedding Vs d (or src_projection Fs d + d),
                              tgt_embedding Vt d and output d Vt + Vt; torch.nn.Transformer has
                              no embeddings and no head (44,140,544 at its defaults)

BERT's heads follow `architectures[0]` (default BertForMaskedLM, what a bare BertConfig is
trained as): BertForMaskedLM has the MLM head (transform d^2 + d, LayerNorm 2d, bias V, and the
decoder, whose weight is the word embedding and whose bias is that bias, unless
tie_word_embeddings is false: then transformers 5 ties neither, and the decoder adds V d + V)
and NO pooler (HF builds its BertModel with
add_pooling_layer=False); BertModel has the pooler (d^2 + d) and no head; BertForPreTraining
has both and the next-sentence head (2d + 2). An `add_pooling_layer` key in the config (read
by numpy_tf; HF takes it as a constructor argument) overrides the pooler. numpy_tf's Bert is a
BertForMaskedLM, counted under HF's names.

An encoder-decoder has two stacks, each with its rule of thumb: 12·d² per encoder layer, 16·d²
per decoder layer (its cross-attention adds 4d²).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path

from ..core import validate
from ..core.module import Module
from ..core.table import format_table
from .encoder_decoder.transformer import TORCH_TRANSFORMER_DEFAULTS
from .gpt import GPTConfig


def count_parameters(model: Module) -> int:
    """Trainable scalars, a tied Parameter counted once (as torch's sum over parameters())."""
    return validate.module("model", model).num_parameters()


def parameter_breakdown(model: Module) -> "OrderedDict[str, int]":
    """Counts per top-level component (`tokens`, `blocks.0`, ..., `output`), in model order; a
    tied Parameter is counted under the first name that reaches it."""
    groups: OrderedDict[str, int] = OrderedDict()
    for name, parameter in validate.module("model", model).named_parameters():
        parts = name.split(".")
        key = ".".join(parts[:2] if parts[1:2] and parts[1].isdigit() else parts[:1])
        groups[key] = groups.get(key, 0) + parameter.size
    return groups


def block_estimate(width: int) -> int:
    """The 12 d^2 per-block approximation."""
    return 12 * width * width


# -- counting from a config -------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    name: str           # the module path in the family's own state_dict; N = every block index
    formula: str
    count: int          # parameters of one copy
    copies: int = 1     # L for a per-block row

    @property
    def total(self) -> int:
        return self.count * self.copies


@dataclass(frozen=True)
class Stack:
    """A stack of identical layers: the rows whose names start with `prefix` (one copy each),
    `layers` copies, and the rule of thumb for one layer."""
    name: str           # "block", "encoder layer", "decoder layer"
    symbol: str         # its number of layers in the formulas: "L", "Le", "Ld"
    prefix: str         # "blocks.N.", "transformer.decoder.layers.N."
    layers: int
    rule: str           # "12·d²"
    estimate: int       # the rule's value for one layer


@dataclass(frozen=True)
class Accounting:
    family: str         # "gpt" (numpy_tf GPTConfig), "gpt2", "llama", "bert", "seq2seq"
    model: str          # the model class whose parameters these are (GPT2LMHeadModel, ...)
    rows: tuple[Row, ...]
    tied: bool          # the output head shares the token embedding (counted once)
    width: int          # d
    layers: int         # L (every layer of every stack)
    vocab_size: int     # V (an encoder-decoder: the target's; 0 without embeddings)
    has_head: bool = True   # False for an encoder without an output head (BertModel)
    # the layer stacks and their rules of thumb; () is one stack of 12·d² blocks, the rows
    # with ".N." in their names
    stacks: tuple[Stack, ...] = ()
    embedding_rule: str = "V·d"         # what the estimate adds for the embeddings
    embedding_estimate: int | None = None   # its value; None: vocab_size · width

    @property
    def total(self) -> int:
        return sum(row.total for row in self.rows)

    @property
    def layer_stacks(self) -> tuple[Stack, ...]:
        if self.stacks:
            return self.stacks
        names = [row.name for row in self.rows if ".N." in row.name]
        prefix = names[0][:names[0].index(".N.") + 3] if names else ".N."
        return (Stack("block", "L", prefix, self.layers, "12·d²", block_estimate(self.width)),)

    def stack_block(self, stack: Stack) -> int:
        """The exact parameters of one layer of `stack`."""
        return sum(row.count for row in self.rows if row.name.startswith(stack.prefix))

    @property
    def block(self) -> int:
        """The exact parameters of one block (of the first stack: an encoder-decoder's
        encoder layer)."""
        return self.stack_block(self.layer_stacks[0])

    @property
    def block_estimate(self) -> int:
        return self.layer_stacks[0].estimate

    @property
    def total_estimate(self) -> int:
        """L 12 d^2 + V d: blocks and one embedding, nothing else (an encoder-decoder: each
        stack by its rule, and its embedding tables)."""
        embeddings = self.vocab_size * self.width if self.embedding_estimate is None \
            else self.embedding_estimate
        return sum(stack.layers * stack.estimate for stack in self.layer_stacks) + embeddings

    @property
    def total_rule(self) -> str:
        terms = [f"{stack.symbol}·{stack.rule}" for stack in self.layer_stacks]
        return " + ".join(terms + ([self.embedding_rule] if self.embedding_rule else []))

    def to_dict(self) -> dict:
        stacks = [{"name": stack.name, "layers": stack.layers, "block": self.stack_block(stack),
                   "rule": stack.rule, "block_estimate": stack.estimate,
                   "block_estimate_rel_diff": relative_difference(stack.estimate,
                                                                  self.stack_block(stack))}
                  for stack in self.layer_stacks]
        return {"family": self.family, "model": self.model, "total": self.total,
                "tied": self.tied, "has_head": self.has_head,
                "width": self.width, "layers": self.layers, "vocab_size": self.vocab_size,
                "rows": [{"name": r.name, "formula": r.formula, "count": r.count,
                          "copies": r.copies, "total": r.total} for r in self.rows],
                "block": self.block, "block_estimate": self.block_estimate,
                "block_estimate_rel_diff": relative_difference(self.block_estimate, self.block),
                "stacks": stacks, "total_rule": self.total_rule,
                "total_estimate": self.total_estimate,
                "total_estimate_rel_diff": relative_difference(self.total_estimate, self.total)}

    def __str__(self) -> str:
        head = "output head tied to the token embedding (counted once)" if self.tied else \
            "untied output head" if self.has_head else \
            "no output head" if self.vocab_size else "no embeddings and no output head"
        vocab = f"V = {self.vocab_size}, " if self.vocab_size else ""
        table = [(r.name, r.formula, f"{r.count:,}", str(r.copies), f"{r.total:,}")
                 for r in self.rows] + [("total", "", "", "", f"{self.total:,}")]
        layers = ", ".join(f"{stack.symbol} = {stack.layers}" for stack in self.layer_stacks)
        lines = [f"{self.model} ({self.family}): d = {self.width}, {layers}, {vocab}{head}",
                 format_table(("component", "formula", "each", "copies", "total"), table,
                              align="llrrr")]
        for stack in self.layer_stacks:
            exact = self.stack_block(stack)
            lines.append(f"one {stack.name}: {exact:,} exact; {stack.rule} = "
                         f"{stack.estimate:,} (off by "
                         f"{relative_difference(stack.estimate, exact):+.2%})")
        lines.append(f"whole model: {self.total:,} exact; {self.total_rule} = "
                     f"{self.total_estimate:,} "
                     f"(off by {relative_difference(self.total_estimate, self.total):+.2%})")
        return "\n".join(lines)


def relative_difference(estimate: int, exact: int) -> float:
    """(estimate - exact) / exact: negative when the estimate is short."""
    return (estimate - exact) / exact if exact else 0.0


def _plus(condition: bool, term: str) -> str:
    return f" + {term}" if condition else ""


def _gpt(family, model, names, vocab, context, d, ffn, layers, attention_bias, ffn_bias, tied):
    """GPT-style rows; `names` maps tokens, positions, norm1, attention, norm2, feedforward,
    final_norm, head to the family's module paths."""
    rows = (
        Row(names[0], "V·d", vocab * d), Row(names[1], "ctx·d", context * d),
        Row(names[2], "2d", 2 * d, layers),
        Row(names[3], "4d²" + _plus(attention_bias, "4d"),
            4 * d * d + (4 * d if attention_bias else 0), layers),
        Row(names[4], "2d", 2 * d, layers),
        Row(names[5], "2·d·F" + _plus(ffn_bias, "F + d"),
            2 * d * ffn + (ffn + d if ffn_bias else 0), layers),
        Row(names[6], "2d", 2 * d),
        Row(names[7], "tied: 0" if tied else "V·d", 0 if tied else vocab * d))
    return Accounting(family, model, rows, tied, d, layers, vocab)


GPT_NAMES = ("tokens", "positions", "blocks.N.norm1", "blocks.N.attention", "blocks.N.norm2",
             "blocks.N.feedforward", "final_norm", "output")
HF_GPT2_NAMES = ("transformer.wte", "transformer.wpe", "transformer.h.N.ln_1",
                 "transformer.h.N.attn", "transformer.h.N.ln_2", "transformer.h.N.mlp",
                 "transformer.ln_f", "lm_head")


class _Keys:
    """A config's values, checked as they are read: the message names the key."""

    def __init__(self, config: dict, where: str):
        self.config, self.where = config, where

    def int(self, key: str, default=None) -> int:
        """A positive integer; a missing or null key takes `default` (None: required)."""
        value = self.config.get(key)
        value = default if value is None else value
        if value is None:
            raise ValueError(f"{self.where} lacks {key!r}")
        return validate.positive_int(f"{self.where} {key}", value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        return default if value is None else validate.flag(f"{self.where} {key}", value)


# -- GPT: numpy_tf's GPTConfig under its own names, HF gpt2 under GPT2LMHeadModel's ------------
def count_gpt(config: GPTConfig) -> Accounting:
    """A numpy_tf GPTConfig, numpy_tf's names."""
    keys = _Keys(config.to_dict(), "GPTConfig")
    width = keys.int("width")
    return _gpt("gpt", "numpy_tf GPT", GPT_NAMES, keys.int("vocab_size"),
                keys.int("max_context"), width, keys.int("hidden", 4 * width), keys.int("layers"),
                keys.flag("attention_bias", False), keys.flag("ffn_bias", True),
                keys.flag("tied", False))


def count_gpt2_hf(config: dict) -> Accounting:
    """An HF gpt2 config.json, GPT2LMHeadModel's names."""
    keys = _Keys(config, "gpt2 config")
    if keys.flag("add_cross_attention", False):
        raise ValueError("gpt2 config has add_cross_attention: true; cross-attention blocks "
                         "are not counted here")
    width = keys.int("n_embd")
    return _gpt("gpt2", "GPT2LMHeadModel", HF_GPT2_NAMES, keys.int("vocab_size"),
                keys.int("n_positions"), width, keys.int("n_inner", 4 * width),
                keys.int("n_layer"), True, True, keys.flag("tie_word_embeddings", True))


_GPT2_ACTIVATION_NAMES = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def gpt2_hf_config(config: GPTConfig) -> dict:
    """The HF gpt2 config.json of a GPTConfig in GPT-2's layout (interop.gpt2_config reads it
    back); a config outside that layout is refused by name."""
    wrong = [f"{name}={getattr(config, name)!r}" for name, needed in
             [("attention_bias", True), ("ffn_bias", True), ("norm_first", True)]
             if getattr(config, name) is not needed]
    if wrong or config.activation not in _GPT2_ACTIVATION_NAMES:
        raise ValueError(f"GPTConfig with {', '.join(wrong) or config.activation} is not in "
                         "GPT-2's layout (biases everywhere, Pre-LN), so it has no gpt2 "
                         "config.json")
    return {"model_type": "gpt2", "vocab_size": config.vocab_size,
            "n_positions": config.max_context, "n_embd": config.width,
            "n_layer": config.layers, "n_head": config.heads,
            "n_inner": config.hidden or 4 * config.width,
            "activation_function": _GPT2_ACTIVATION_NAMES[config.activation],
            "layer_norm_epsilon": config.norm_eps, "tie_word_embeddings": config.tied,
            "initializer_range": config.init_std}


# -- Llama: one formula, under numpy_tf's names or HF's (the same but for `model.`) -----------
@dataclass(frozen=True)
class _LlamaShape:
    """What the Llama formula reads: numpy_tf's LlamaConfig options, HF's family options."""
    vocab: int
    d: int
    inner: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool          # q_proj, k_proj, v_proj biases
    output_bias: bool       # o_proj bias
    mlp_bias: bool
    qk_norm: bool           # Qwen3's q_norm, k_norm (hd each)


def _llama(family, model, prefix, shape: _LlamaShape) -> Accounting:
    s = shape
    d, query, key_value = s.d, s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention_formula = "d·H·hd + 2·d·KV·hd + H·hd·d" + _plus(s.qkv_bias, "H·hd + 2·KV·hd") \
        + _plus(s.output_bias, "d") + _plus(s.qk_norm, "2·hd")
    attention = 2 * d * query + 2 * d * key_value + (query + 2 * key_value if s.qkv_bias else 0) \
        + (d if s.output_bias else 0) + (2 * s.head_dim if s.qk_norm else 0)
    rows = (
        Row(f"{prefix}embed_tokens", "V·d", s.vocab * d),
        Row(f"{prefix}layers.N.input_layernorm", "d", d, s.layers),
        Row(f"{prefix}layers.N.self_attn", attention_formula, attention, s.layers),
        Row(f"{prefix}layers.N.post_attention_layernorm", "d", d, s.layers),
        Row(f"{prefix}layers.N.mlp", "3·d·I" + _plus(s.mlp_bias, "2I + d"),
            3 * d * s.inner + (2 * s.inner + d if s.mlp_bias else 0), s.layers),
        Row(f"{prefix}norm", "d", d),
        Row("lm_head", "tied: 0" if s.tied else "V·d", 0 if s.tied else s.vocab * d))
    return Accounting(family, model, rows, s.tied, d, s.layers, s.vocab)


def count_llama(config) -> Accounting:
    """A numpy_tf LlamaConfig (it validates itself), numpy_tf's names; LlamaConfig's
    num_parameters is this count's total."""
    return _llama("llama", "numpy_tf Llama", "", _LlamaShape(
        config.vocab_size, config.hidden_size, config.intermediate_size,
        config.num_hidden_layers, config.num_attention_heads, config.kv_heads,
        config.head_width, config.tie_word_embeddings, config.attention_bias,
        config.output_bias, config.mlp_bias, config.qk_norm))


# model_type -> (its ForCausalLM class, its fixed options: q/k/v bias, o bias, mlp bias, qk norm;
# None: the config's attention_bias / mlp_bias key), the default head_dim key
_LLAMA_LIKE = {
    "llama": ("LlamaForCausalLM", (None, None, None, False)),
    "mistral": ("MistralForCausalLM", (None, None, None, False)),
    "qwen2": ("Qwen2ForCausalLM", (True, False, False, False)),
    "qwen3": ("Qwen3ForCausalLM", (None, None, False, True)),
    "phi3": ("Phi3ForCausalLM", (False, False, False, False)),
}


def _count_llama_like_hf(config: dict, model_type: str) -> Accounting:
    model, (qkv_bias, output_bias, mlp_bias, qk_norm) = _LLAMA_LIKE[model_type]
    keys = _Keys(config, f"{model_type} config")
    vocab, d, inner = keys.int("vocab_size"), keys.int("hidden_size"), \
        keys.int("intermediate_size")
    layers, heads = keys.int("num_hidden_layers"), keys.int("num_attention_heads")
    kv_heads = keys.int("num_key_value_heads", heads)
    head_dim = keys.int("head_dim", 128 if model_type == "qwen3" else
                        d // heads if d % heads == 0 else None)
    attention_bias = keys.flag("attention_bias", False)
    return _llama(model_type, model, "model.", _LlamaShape(
        vocab, d, inner, layers, heads, kv_heads, head_dim,
        keys.flag("tie_word_embeddings", False),
        attention_bias if qkv_bias is None else qkv_bias,
        attention_bias if output_bias is None else output_bias,
        keys.flag("mlp_bias", False) if mlp_bias is None else mlp_bias, qk_norm))


def count_llama_hf(config: dict) -> Accounting:
    """An HF llama config.json, LlamaForCausalLM's names (a mistral one: MistralForCausalLM's,
    the same parameters)."""
    return _count_llama_like_hf(config, "mistral" if config.get("model_type") == "mistral"
                                else "llama")


def count_qwen2_hf(config: dict) -> Accounting:
    """An HF qwen2 config.json, Qwen2ForCausalLM's names (q, k, v biases; o_proj none)."""
    return _count_llama_like_hf(config, "qwen2")


def count_qwen3_hf(config: dict) -> Accounting:
    """An HF qwen3 config.json, Qwen3ForCausalLM's names (q_norm and k_norm per layer)."""
    return _count_llama_like_hf(config, "qwen3")


def count_phi3_hf(config: dict) -> Accounting:
    """An HF phi3 config.json, Phi3ForCausalLM's names (the fused qkv_proj and gate_up_proj
    hold the same scalars as Llama's separate projections)."""
    return _count_llama_like_hf(config, "phi3")


def _rope_parameters(config) -> dict:
    parameters = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        parameters = {"rope_theta": config.rope_theta, **{
            key: value for key, value in config.rope_scaling.to_dict().items()
            if value is not None}}
    return parameters


def _llama_like_hf_config(config, model_type: str, names: tuple[str, ...]) -> dict:
    return {"model_type": model_type, **{name: getattr(config, name) for name in names},
            "num_key_value_heads": config.kv_heads, "head_dim": config.head_width,
            "rope_parameters": _rope_parameters(config)}


_LLAMA_HF_NAMES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "rms_norm_eps", "tie_word_embeddings",
                   "max_position_embeddings", "attention_dropout", "pad_token_id",
                   "initializer_range")


def _require(config, model_type: str, **needed) -> None:
    wrong = [f"{name}={getattr(config, name)!r}" for name, value in needed.items()
             if getattr(config, name) != value]
    if wrong:
        raise ValueError(f"LlamaConfig with {', '.join(wrong)} is not in {model_type}'s layout, "
                         f"so it has no {model_type} config.json")


def llama_hf_config(config) -> dict:
    """The HF llama config.json of a LlamaConfig (interop.llama_config reads it back); with a
    sliding window, a mistral one."""
    _require(config, "llama", output_bias=config.attention_bias, qk_norm=False)
    fields_ = _llama_like_hf_config(config, "llama",
                                    _LLAMA_HF_NAMES + ("attention_bias", "mlp_bias"))
    if config.sliding_window is not None:                   # Mistral's window
        fields_.update(model_type="mistral", sliding_window=config.sliding_window)
    return fields_


def qwen2_hf_config(config) -> dict:
    """The HF qwen2 config.json of a LlamaConfig in Qwen2's layout."""
    _require(config, "qwen2", attention_bias=True, output_bias=False, mlp_bias=False,
             qk_norm=False)
    return _llama_like_hf_config(config, "qwen2", _LLAMA_HF_NAMES)


def qwen3_hf_config(config) -> dict:
    """The HF qwen3 config.json of a LlamaConfig in Qwen3's layout."""
    _require(config, "qwen3", output_bias=config.attention_bias, mlp_bias=False, qk_norm=True)
    return _llama_like_hf_config(config, "qwen3", _LLAMA_HF_NAMES + ("attention_bias",))


def phi3_hf_config(config) -> dict:
    """The HF phi3 config.json of a LlamaConfig in Phi-3's layout (no biases, no qk norm)."""
    _require(config, "phi3", attention_bias=False, output_bias=False, mlp_bias=False,
             qk_norm=False)
    return _llama_like_hf_config(config, "phi3", _LLAMA_HF_NAMES)


# -- Gemma and Gemma2: Llama's rows (no MLP biases), Gemma2 adding two norms per layer --------
GEMMA2_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def _gemma(model, prefix, vocab, d, inner, layers, heads, kv_heads, head_dim, tied,
           attention_bias, gemma2) -> Accounting:
    rows = list(_llama("gemma", model, prefix, _LlamaShape(
        vocab, d, inner, layers, heads, kv_heads, head_dim, tied, attention_bias, attention_bias,
        False, False)).rows)
    if gemma2:
        after = next(index for index, row in enumerate(rows)
                     if row.name.endswith("post_attention_layernorm")) + 1
        rows[after:after] = [Row(f"{prefix}layers.N.{name}", "d", d, layers)
                             for name in GEMMA2_NORMS]
    return Accounting("gemma", model, tuple(rows), tied, d, layers, vocab)


def count_gemma(config) -> Accounting:
    """A numpy_tf GemmaConfig (it validates itself), numpy_tf's names."""
    return _gemma(f"numpy_tf Gemma ({config.model_type})", "", config.vocab_size,
                  config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                  config.num_attention_heads, config.kv_heads, config.head_width,
                  config.tie_word_embeddings, config.attention_bias,
                  config.model_type == "gemma2")


def count_gemma_hf(config: dict) -> Accounting:
    """An HF gemma or gemma2 config.json, GemmaForCausalLM's / Gemma2ForCausalLM's names."""
    keys = _Keys(config, f"{config.get('model_type')} config")
    d, heads = keys.int("hidden_size"), keys.int("num_attention_heads")
    gemma2 = config.get("model_type") == "gemma2"
    return _gemma("Gemma2ForCausalLM" if gemma2 else "GemmaForCausalLM", "model.",
                  keys.int("vocab_size"), d, keys.int("intermediate_size"),
                  keys.int("num_hidden_layers"), heads, keys.int("num_key_value_heads", heads),
                  keys.int("head_dim", d // heads if d % heads == 0 else None),
                  keys.flag("tie_word_embeddings", True), keys.flag("attention_bias", False),
                  gemma2)


def gemma_hf_config(config) -> dict:
    """The HF gemma / gemma2 config.json of a GemmaConfig (interop.gemma_config reads it)."""
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
             "max_position_embeddings", "attention_bias", "attention_dropout", "pad_token_id",
             "initializer_range", "model_type")
    fields_ = {name: getattr(config, name) for name in names}
    fields_.update(num_key_value_heads=config.kv_heads, head_dim=config.head_width,
                   hidden_activation="gelu_pytorch_tanh")
    if config.model_type == "gemma2":
        fields_.update(
            query_pre_attn_scalar=config.query_pre_attn_scalar or config.head_width,
            attn_logit_softcapping=config.attn_logit_softcapping,
            final_logit_softcapping=config.final_logit_softcapping,
            sliding_window=config.sliding_window,
            layer_types=list(config.layer_types or
                             ["full_attention"] * config.num_hidden_layers))
    return fields_


# -- GPT-NeoX: one formula, under numpy_tf's names or HF's (`gpt_neox.`, the head lm_head) -----
def _neox(model, prefix, head, vocab, d, inner, layers, tied, attention_bias) -> Accounting:
    rows = (
        Row(f"{prefix}embed_in", "V·d", vocab * d),
        Row(f"{prefix}layers.N.input_layernorm", "2d", 2 * d, layers),
        Row(f"{prefix}layers.N.post_attention_layernorm", "2d", 2 * d, layers),
        Row(f"{prefix}layers.N.attention", "4d²" + _plus(attention_bias, "4d"),
            4 * d * d + (4 * d if attention_bias else 0), layers),
        Row(f"{prefix}layers.N.mlp", "2·d·F + F + d", 2 * d * inner + inner + d, layers),
        Row(f"{prefix}final_layer_norm", "2d", 2 * d),
        Row(head, "tied: 0" if tied else "V·d", 0 if tied else vocab * d))
    return Accounting("neox", model, rows, tied, d, layers, vocab)


def count_neox(config) -> Accounting:
    """A numpy_tf NeoXConfig (it validates itself), numpy_tf's names; NeoXConfig's
    num_parameters is this count's total."""
    return _neox("numpy_tf GPTNeoX", "", "embed_out", config.vocab_size, config.hidden_size,
                 config.intermediate_size, config.num_hidden_layers,
                 config.tie_word_embeddings, config.attention_bias)


def count_neox_hf(config: dict) -> Accounting:
    """An HF gpt_neox config.json, GPTNeoXForCausalLM's names (transformers 5 calls the head
    lm_head; checkpoints call it embed_out)."""
    keys = _Keys(config, "gpt_neox config")
    d, heads = keys.int("hidden_size"), keys.int("num_attention_heads")
    if d % heads:
        raise ValueError(f"gpt_neox config hidden_size ({d}) must be divisible by "
                         f"num_attention_heads ({heads})")
    return _neox("GPTNeoXForCausalLM", "gpt_neox.", "lm_head", keys.int("vocab_size"), d,
                 keys.int("intermediate_size"), keys.int("num_hidden_layers"),
                 keys.flag("tie_word_embeddings", False), keys.flag("attention_bias", True))


def neox_hf_config(config) -> dict:
    """The HF gpt_neox config.json of a NeoXConfig, as transformers 5 writes it (rotary_pct
    and the base in rope_parameters); interop.neox_config reads it back."""
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "layer_norm_eps", "use_parallel_residual",
             "tie_word_embeddings", "attention_bias", "attention_dropout",
             "max_position_embeddings", "initializer_range")
    return {"model_type": "gpt_neox", **{name: getattr(config, name) for name in names},
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                                "partial_rotary_factor": config.rotary_pct}}
# -- Mixtral: Llama's attention and norms, a router and E SwiGLU experts per layer -----------
@dataclass(frozen=True)
class MoEAccounting(Accounting):
    """An Accounting of a mixture-of-experts model: `experts_row` names the row of every
    layer's experts, of which a token uses `experts_per_token` of `experts`."""
    experts: int = 1                # E
    experts_per_token: int = 1      # k
    experts_row: str = ""

    @property
    def active(self) -> int:
        """The parameters one token's forward runs through: everything but the E - k experts
        each layer leaves out (the embedding counted whole, as published figures count it)."""
        row = next(row for row in self.rows if row.name == self.experts_row)
        return self.total - row.total // self.experts * (self.experts - self.experts_per_token)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "experts": self.experts,
                "experts_per_token": self.experts_per_token, "active": self.active}

    def __str__(self) -> str:
        return (f"{super().__str__()}\nactive per token: {self.active:,} ({self.experts_per_token}"
                f" of {self.experts} experts in each layer)")


def _mixtral(model, prefix, vocab, d, inner, layers, heads, kv_heads, head_dim, tied, experts,
             top_k) -> MoEAccounting:
    query, key_value = heads * head_dim, kv_heads * head_dim
    rows = (
        Row(f"{prefix}embed_tokens", "V·d", vocab * d),
        Row(f"{prefix}layers.N.input_layernorm", "d", d, layers),
        Row(f"{prefix}layers.N.self_attn", "d·H·hd + 2·d·KV·hd + H·hd·d",
            2 * d * query + 2 * d * key_value, layers),
        Row(f"{prefix}layers.N.post_attention_layernorm", "d", d, layers),
        Row(f"{prefix}layers.N.mlp.gate", "E·d", experts * d, layers),
        Row(f"{prefix}layers.N.mlp.experts", "3·E·d·I", 3 * experts * d * inner, layers),
        Row(f"{prefix}norm", "d", d),
        Row("lm_head", "tied: 0" if tied else "V·d", 0 if tied else vocab * d))
    stack = Stack("block", "L", f"{prefix}layers.N.", layers, "(4·d² + 3·E·d·I)",
                  4 * d * d + 3 * experts * d * inner)
    return MoEAccounting("mixtral", model, rows, tied, d, layers, vocab, stacks=(stack,),
                         experts=experts, experts_per_token=top_k,
                         experts_row=f"{prefix}layers.N.mlp.experts")


def count_mixtral(config) -> MoEAccounting:
    """A numpy_tf MixtralConfig (it validates itself), numpy_tf's names; its
    num_parameters and active_parameters are this count's total and active."""
    return _mixtral("numpy_tf Mixtral", "", config.vocab_size, config.hidden_size,
                    config.intermediate_size, config.num_hidden_layers,
                    config.num_attention_heads, config.kv_heads, config.head_width,
                    config.tie_word_embeddings, config.num_local_experts,
                    config.num_experts_per_tok)


def count_mixtral_hf(config: dict) -> MoEAccounting:
    """An HF mixtral config.json, MixtralForCausalLM's names (transformers 5's layout, whose
    counts the hub's per-expert w1 / w2 / w3 share)."""
    keys = _Keys(config, "mixtral config")
    vocab, d, inner = keys.int("vocab_size"), keys.int("hidden_size"), \
        keys.int("intermediate_size")
    layers, heads = keys.int("num_hidden_layers"), keys.int("num_attention_heads")
    kv_heads = keys.int("num_key_value_heads", heads)
    head_dim = keys.int("head_dim", d // heads if d % heads == 0 else None)
    experts, top_k = keys.int("num_local_experts", 8), keys.int("num_experts_per_tok", 2)
    if top_k > experts:
        raise ValueError(f"mixtral config num_experts_per_tok ({top_k}) must be at most "
                         f"num_local_experts ({experts})")
    return _mixtral("MixtralForCausalLM", "model.", vocab, d, inner, layers, heads, kv_heads,
                    head_dim, keys.flag("tie_word_embeddings", False), experts, top_k)


def mixtral_hf_config(config) -> dict:
    """The HF mixtral config.json of a MixtralConfig (interop.mixtral_config reads it back)."""
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_local_experts", "num_experts_per_tok",
             "router_aux_loss_coef", "output_router_logits", "rms_norm_eps",
             "tie_word_embeddings", "max_position_embeddings", "attention_dropout",
             "sliding_window", "pad_token_id", "initializer_range")
    return {"model_type": "mixtral", **{name: getattr(config, name) for name in names},
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "num_key_value_heads": config.kv_heads, "head_dim": config.head_width}


# -- BERT: counted as HF's BertForMaskedLM (numpy_tf's Bert holds exactly its parameters) ------
BERT_ARCHITECTURES = {              # architecture -> (pooler, MLM head, next-sentence head)
    "BertForMaskedLM": (False, True, False),
    "BertModel": (True, False, False),
    "BertForPreTraining": (True, True, True),
}


def count_bert_hf(config: dict) -> Accounting:
    """An HF BERT config.json (by architectures[0], see the module text), HF's names."""
    keys = _Keys(config, "bert config")
    architectures = config.get("architectures") or ["BertForMaskedLM"]
    if not isinstance(architectures, list):
        raise ValueError(f"bert config architectures must be a list; got {architectures!r}")
    architecture = architectures[0]
    if architecture not in BERT_ARCHITECTURES:
        raise ValueError(f"bert config architecture {architecture!r} is not supported; "
                         f"supported: {', '.join(BERT_ARCHITECTURES)}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("bert config position_embedding_type must be 'absolute'; got "
                         f"{config['position_embedding_type']!r}")
    if keys.flag("add_cross_attention", False):
        raise ValueError("bert config has add_cross_attention: true; not counted here")
    pooler, mlm, next_sentence = BERT_ARCHITECTURES[architecture]
    pooler = keys.flag("add_pooling_layer", pooler)
    tied = mlm and keys.flag("tie_word_embeddings", True)
    vocab, d, inner = keys.int("vocab_size"), keys.int("hidden_size"), \
        keys.int("intermediate_size")
    layers = keys.int("num_hidden_layers")
    base = "bert." if mlm else ""
    layer = f"{base}encoder.layer.N."
    rows = [
        Row(f"{base}embeddings.word_embeddings", "V·d", vocab * d),
        Row(f"{base}embeddings.position_embeddings", "P·d",
            keys.int("max_position_embeddings") * d),
        Row(f"{base}embeddings.token_type_embeddings", "T·d", keys.int("type_vocab_size") * d),
        Row(f"{base}embeddings.LayerNorm", "2d", 2 * d),
        Row(f"{layer}attention.self", "3(d² + d)", 3 * (d * d + d), layers),
        Row(f"{layer}attention.output.dense", "d² + d", d * d + d, layers),
        Row(f"{layer}attention.output.LayerNorm", "2d", 2 * d, layers),
        Row(f"{layer}intermediate.dense", "d·I + I", d * inner + inner, layers),
        Row(f"{layer}output.dense", "I·d + d", inner * d + d, layers),
        Row(f"{layer}output.LayerNorm", "2d", 2 * d, layers)]
    if pooler:
        rows.append(Row(f"{base}pooler.dense", "d² + d", d * d + d))
    if mlm:
        rows += [Row("cls.predictions.transform.dense", "d² + d", d * d + d),
                 Row("cls.predictions.transform.LayerNorm", "2d", 2 * d),
                 Row("cls.predictions.bias", "V", vocab),
                 Row("cls.predictions.decoder", "tied: 0" if tied else "V·d + V",
                     0 if tied else vocab * d + vocab)]
    if next_sentence:
        rows.append(Row("cls.seq_relationship", "2d + 2", 2 * d + 2))
    return Accounting("bert", architecture, tuple(rows), tied, d, layers, vocab, mlm)


def count_bert(config) -> Accounting:
    """A numpy_tf BertConfig, counted as the BertForMaskedLM it equals (HF's names)."""
    return count_bert_hf(bert_hf_config(config))


def bert_hf_config(config) -> dict:
    """The HF bert config.json (BertForMaskedLM) of a BertConfig; numpy_tf's own options
    (Pre-LN, no position table, no segment table) have no HF counterpart and are refused."""
    wrong = [text for text, present in [("norm_first=True", config.norm_first),
                                        ("position_embeddings=False",
                                         not config.position_embeddings),
                                        ("type_vocab_size=0", config.type_vocab_size == 0)]
             if present]
    if wrong:
        raise ValueError(f"BertConfig with {', '.join(wrong)} has no Hugging Face "
                         "BertForMaskedLM counterpart, so it has no bert config.json")
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "tie_word_embeddings", "pad_token_id", "initializer_range")
    return {"model_type": "bert", "architectures": ["BertForMaskedLM"],
            **{name: getattr(config, name) for name in names}}


# -- the encoder-decoder: torch.nn.Transformer's layer stacks, and Seq2Seq around them --------
TORCH_TRANSFORMER = "torch.nn.Transformer"


def _encoder_decoder(prefix, d, ffn, encoder_layers, decoder_layers, bias, final_norms,
                     before=(), after=()) -> tuple:
    """torch.nn.Transformer's rows under `prefix` (its state_dict order), between the rows
    `before` and `after`, and its two stacks: an encoder layer is self-attention, the FFN and
    two LayerNorms (12·d² at F = 4d), a decoder layer adds cross-attention and a third
    LayerNorm (16·d²)."""
    attention = ("4d² + 4d" if bias else "4d²", 4 * d * d + (4 * d if bias else 0))
    linear1 = ("d·F + F" if bias else "d·F", d * ffn + (ffn if bias else 0))
    linear2 = ("F·d + d" if bias else "F·d", ffn * d + (d if bias else 0))
    norm = ("2d" if bias else "d", 2 * d if bias else d)
    encoder, decoder = f"{prefix}encoder.layers.N.", f"{prefix}decoder.layers.N."
    rows = [*before,
            Row(f"{encoder}self_attn", *attention, encoder_layers),
            Row(f"{encoder}linear1", *linear1, encoder_layers),
            Row(f"{encoder}linear2", *linear2, encoder_layers),
            Row(f"{encoder}norm1", *norm, encoder_layers),
            Row(f"{encoder}norm2", *norm, encoder_layers)]
    if final_norms:
        rows.append(Row(f"{prefix}encoder.norm", *norm))
    rows += [Row(f"{decoder}self_attn", *attention, decoder_layers),
             Row(f"{decoder}multihead_attn", *attention, decoder_layers),
             Row(f"{decoder}linear1", *linear1, decoder_layers),
             Row(f"{decoder}linear2", *linear2, decoder_layers),
             *(Row(f"{decoder}norm{index}", *norm, decoder_layers) for index in (1, 2, 3))]
    if final_norms:
        rows.append(Row(f"{prefix}decoder.norm", *norm))
    stacks = (Stack("encoder layer", "Le", encoder, encoder_layers, "12·d²", 12 * d * d),
              Stack("decoder layer", "Ld", decoder, decoder_layers, "16·d²", 16 * d * d))
    return tuple(rows + list(after)), stacks


def count_torch_transformer(kwargs: dict) -> Accounting:
    """torch.nn.Transformer(**kwargs) (its keyword arguments, torch's defaults for the rest):
    the two layer stacks and their final LayerNorms, under torch's names; it has no
    embeddings and no head. torch.nn.Transformer() itself, the base model of "Attention Is
    All You Need", holds 44,140,544."""
    if not isinstance(kwargs, dict):
        raise TypeError(f"{TORCH_TRANSFORMER} kwargs must be a dict; got "
                        f"{type(kwargs).__name__}")
    args = validate.over_defaults(TORCH_TRANSFORMER, kwargs, TORCH_TRANSFORMER_DEFAULTS)
    for key in ("custom_encoder", "custom_decoder"):
        if args[key] is not None:
            raise ValueError(f"{TORCH_TRANSFORMER} kwargs {key} must be null: a custom stack "
                             f"cannot be counted from kwargs; got {args[key]!r}")
    keys = _Keys(args, f"{TORCH_TRANSFORMER} kwargs")
    d, heads = keys.int("d_model"), keys.int("nhead")
    if d % heads:
        raise ValueError(f"{TORCH_TRANSFORMER} kwargs d_model ({d}) must be divisible by nhead "
                         f"({heads})")
    for key in ("batch_first", "norm_first"):
        keys.flag(key, False)
    layers = (keys.int("num_encoder_layers"), keys.int("num_decoder_layers"))
    rows, stacks = _encoder_decoder("", d, keys.int("dim_feedforward"), *layers,
                                    keys.flag("bias", True), True)
    return Accounting("seq2seq", TORCH_TRANSFORMER, rows, False, d, sum(layers), 0, False,
                      stacks, "", 0)


def torch_transformer_config(config) -> dict:
    """The torch.nn.Transformer kwargs of a Seq2SeqConfig's layer stacks; a config without
    final norms has none."""
    if not config.final_norms:
        raise ValueError("Seq2SeqConfig with final_norms=False has no torch.nn.Transformer "
                         "kwargs: torch.nn.Transformer always has encoder.norm and decoder.norm")
    return config.transformer_kwargs()


def count_seq2seq(config) -> Accounting:
    """A numpy_tf Seq2SeqConfig, numpy_tf's names: the source embedding (or the feature
    projection), the target embedding, torch.nn.Transformer's stacks under `transformer.`
    (without their final norms when final_norms=False) and the output head with its bias;
    the sinusoidal positions are not parameters."""
    keys = _Keys(config.to_dict(), "Seq2SeqConfig")
    d, heads, targets = keys.int("d_model"), keys.int("nhead"), keys.int("tgt_vocab_size")
    if d % heads:
        raise ValueError(f"Seq2SeqConfig d_model ({d}) must be divisible by nhead ({heads})")
    if config.src_features is None:
        sources = keys.int("src_vocab_size")
        source = Row("src_embedding", "Vs·d", sources * d)
        embedding_rule, embedding = "(Vs + Vt)·d", (sources + targets) * d
    else:
        source = Row("src_projection", "Fs·d + d", keys.int("src_features") * d + d)
        embedding_rule, embedding = "Vt·d", targets * d
    layers = (keys.int("num_encoder_layers"), keys.int("num_decoder_layers"))
    rows, stacks = _encoder_decoder(
        "transformer.", d, keys.int("dim_feedforward"), *layers, keys.flag("bias", True),
        keys.flag("final_norms", True),
        before=(source, Row("tgt_embedding", "Vt·d", targets * d)),
        after=(Row("output", "d·Vt + Vt", d * targets + targets),))
    return Accounting("seq2seq", "numpy_tf Seq2Seq", rows, False, d, sum(layers), targets,
                      True, stacks, embedding_rule, embedding)


# -- any config -------------------------------------------------------------------------------
GPT_CONFIG_KEYS = frozenset(field.name for field in fields(GPTConfig))


def account(config) -> Accounting:
    """The exact parameter count of `config`, per component, from formulas alone: a config of a
    registered family (GPTConfig, LlamaConfig, BertConfig, Seq2SeqConfig), a preset name (a
    published model, such as gpt2, is counted under its Hugging Face names; transformer-base
    as torch.nn.Transformer), a path or inline JSON (see
    numpy_tf.models.registry.read_config), or a dict: an HF config.json (model_type gpt2 /
    llama / bert), a torch module's keyword arguments with a "torch_module" key
    ({"torch_module": "torch.nn.Transformer", "d_model": 512, ...}), or numpy_tf config
    fields (a "family" key, or GPTConfig's own keys)."""
    from . import registry

    if isinstance(config, (str, Path)):
        config = registry.read_config(config)
    if isinstance(config, registry.Preset):
        owner = registry.FAMILIES[config.family]
        if owner.count is None:
            raise ValueError(f"preset {config.name!r}: counting the {owner.name} family is not "
                             "implemented")
        if config.hf:
            return owner.count_hf(owner.hf_config(config.config))
        if config.torch:
            return owner.count_torch(owner.torch_config(config.config))
        return owner.count(config.config)
    if isinstance(config, dict):
        return _account_dict(config, registry)
    owner = registry.family_of_config(config)
    if owner is None:
        classes = [f.config_class.__name__ for f in registry.FAMILIES.values()
                   if f.config_class is not None]
        raise TypeError(f"config must be a model config ({', '.join(classes)}), a dict, a "
                        f"preset name or a path; got {type(config).__name__}")
    if owner.count is None:
        raise ValueError(f"counting the {owner.name} family ({type(config).__name__}) is not "
                         "implemented")
    return owner.count(config)


def _account_dict(config: dict, registry) -> Accounting:
    if "torch_module" in config:
        module = config["torch_module"]
        owner = registry.family_of_torch_module(module)
        if owner is None or owner.count_torch is None:
            supported = [m for f in registry.FAMILIES.values() if f.count_torch
                         for m in f.torch_modules]
            raise ValueError(f"torch_module {module!r} is not supported; supported: "
                             f"{', '.join(supported)}")
        return owner.count_torch({k: v for k, v in config.items() if k != "torch_module"})
    model_type = config.get("model_type")
    if model_type is not None:
        owner = registry.family_of_model_type(model_type) if isinstance(model_type, str) \
            else None
        if owner is None or owner.count_hf is None:
            supported = [t for f in registry.FAMILIES.values() if f.count_hf
                         for t in f.hf_model_types]
            raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                             f"{', '.join(supported)} (or numpy_tf config fields)")
        return owner.count_hf(config)
    if "family" in config:
        owner, fields_ = registry.split_family(config)
        return account(registry.make_config(owner, fields_))
    unknown = sorted(set(config) - GPT_CONFIG_KEYS)
    if config and set(config) <= set(TORCH_TRANSFORMER_DEFAULTS):
        raise ValueError("config has no model_type, and its keys are torch.nn.Transformer's "
                         f"keyword arguments ({', '.join(config)}): add \"torch_module\": "
                         f"\"{TORCH_TRANSFORMER}\" to count them as that module")
    if unknown or "width" not in config:
        raise ValueError("config has no model_type and is not a numpy_tf GPTConfig ("
                         + (f"unknown keys: {', '.join(unknown)}" if unknown else
                            "no 'width'") + "); give model_type gpt2, llama or bert, a "
                         "\"torch_module\" or a \"family\" key")
    return count_gpt(GPTConfig(**config))


def load_config(source) -> dict:
    """The config a string names, as a dict: a path (a JSON file, or a folder holding
    config.json) or inline JSON is read; a preset gives its Hugging Face config.json when it
    is a published model, its torch kwargs with a "torch_module" key when it is a torch
    module's shape, else its numpy_tf fields with a "family" key (as PRESETS)."""
    from . import registry

    found = registry.read_config(source)
    return _preset_dict(found) if isinstance(found, registry.Preset) else found


def _preset_dict(preset) -> dict:
    from . import registry

    owner = registry.FAMILIES[preset.family]
    if preset.hf:
        return owner.hf_config(preset.config)
    if preset.torch:
        return {"torch_module": owner.torch_modules[0], **owner.torch_config(preset.config)}
    return {"family": preset.family, **preset.fields()}


def __getattr__(name: str):
    """PRESETS: every registered preset as the config.json it is counted from (built from
    numpy_tf.models.registry when first asked for)."""
    if name == "PRESETS":
        from . import registry

        return {preset.name: _preset_dict(preset) for preset in registry.PRESETS.values()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
