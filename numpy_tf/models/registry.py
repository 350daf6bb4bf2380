"""The model families numpy_tf knows and their presets: the one table every tool reads.

Checkpoints (which class rebuilds a saved model), case export, the fixture runner behind
`numpy-tf check`, parameter accounting, the Hugging Face converters and every CLI command look
families and presets up here, by one set of names:

    family    config class   model class  Hugging Face model_type  presets
    gpt       GPTConfig      GPT          gpt2                     gpt2, gpt2-tiny, tiny-gpt,
                                                                   char-gpt
    llama     LlamaConfig    Llama        llama, mistral           smollm2-135m, llama-2-7b,
                                                                   llama-3.2-1b, llama-tiny,
                                                                   mistral-7b-v0.1, mistral-tiny
    qwen2     LlamaConfig    Llama        qwen2                    qwen2.5-0.5b, qwen2-tiny
    qwen3     LlamaConfig    Llama        qwen3                    qwen3-0.6b, qwen3-tiny
    phi3      LlamaConfig    Llama        phi3                     phi-3-mini-4k, phi3-tiny
    mixtral   MixtralConfig  Mixtral      mixtral                  mixtral-8x7b, mixtral-tiny
    bert      BertConfig     Bert         bert                     bert-base-uncased, bert-tiny
    seq2seq   Seq2SeqConfig  Seq2Seq      - (torch.nn.Transformer) seq2seq-tiny, seq2seq-digits,
                                                                   transformer-base
    cbow      -              CBOW         -                        -
    neox      NeoXConfig     GPTNeoX      gpt_neox                 pythia-160m, gpt-neox-20b,
                                                                   neox-tiny
    gemma     GemmaConfig    Gemma        gemma, gemma2            gemma-2b, gemma-2-2b,
                                                                   gemma-tiny, gemma2-tiny

    preset = find_preset("llama-tiny")                 # or PRESETS["llama-tiny"]
    model = family("llama-tiny").model_class(preset.config)   # a model from a name
    resolve("smollm2-135m")          # (Family, Preset or None) for a family or preset name
    read_config("gpt2")              # a preset, or the dict a JSON file / folder / text holds

A name is unique across families, presets and their aliases (the names earlier versions used,
still accepted: tiny, gpt2-124m, smollm2, digits, transformer), so any command can take any of
them. A family's presets are listed with the published models first. A preset marked `hf` is
a published Hugging Face model: `numpy-tf params` counts it under that checkpoint's parameter
names (through the family's hf_config and count_hf). A preset marked `torch` is a torch
module's shape (transformer-base: torch.nn.Transformer()'s defaults, the base model of
"Attention Is All You Need"): it is counted as that module, under torch's names (through
torch_config and count_torch), as a config file {"torch_module": "torch.nn.Transformer",
<its keyword arguments>} is.

Adding a family (Qwen2, say) is one entry here plus the tables of the tools that need code of
their own for it, each keyed by the family's name:

    1. here, at the end of this file: register_family(Family("qwen2", "Qwen2 decoder", Qwen2,
       Qwen2Config, NextTokenLoss, hf_model_types=("qwen2",), count=count_qwen2,
       count_hf=count_qwen2_hf, hf_config=qwen2_hf_config)), its parameter-count formula
       written once in accounting.py (the config's num_parameters, if it has one, returns its
       total), and register_preset(Preset("qwen2.5-0.5b", "qwen2", Qwen2Config(...), "...",
       hf=True)) for each known size;
    2. interop/hf.py HF_FAMILIES["qwen2"]: its config reader and its weight layout table;
    3. checking/export.py EXPORTS["qwen2"]: how its case inputs are drawn, the conventions
       written into the case, the preset a bare family name exports;
    4. checking/fixtures.py MODEL_INPUTS["qwen2"] (how a case's inputs reach the objective), and
       reference/ fixtures of kind hf_qwen2 (the kind maps to the family by its model_type);
    5. only if a command does more with it: cli/commands.py TRAIN_TASKS (numpy-tf train) and
       interop/pretrained.py PRETRAINED (released weights for sample and generate).

A family without a count (cbow today) is refused by `numpy-tf params` by name; giving it
count (and count_hf for a Hugging Face family, count_torch for a torch module's kwargs) is all
counting it takes.
tests/test_registry.py fails while a registered family lacks an entry a tool needs, and checks
that every command takes every preset name. Models import nothing above them, so this module
knows no tool: the tools import it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from ..text.tokenizers import ByteTokenizer
from .accounting import (TORCH_TRANSFORMER, bert_hf_config, count_bert, count_bert_hf,
                         count_gemma, count_gemma_hf, count_gpt, count_gpt2_hf, count_llama,
                         count_llama_hf, count_mixtral, count_mixtral_hf, count_neox,
                         count_neox_hf, count_phi3_hf, count_qwen2_hf, count_qwen3_hf,
                         count_seq2seq, count_torch_transformer, gemma_hf_config,
                         gpt2_hf_config, llama_hf_config, mixtral_hf_config, neox_hf_config,
                         phi3_hf_config, qwen2_hf_config, qwen3_hf_config,
                         torch_transformer_config)
from .bert import Bert, BertConfig
from .cbow import CBOW
from .encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from .gemma import Gemma, GemmaConfig
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig
from .mixtral import Mixtral, MixtralConfig, MixtralLoss
from .neox import GPTNeoX, NeoXConfig
from .objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss


@dataclass(frozen=True)
class Family:
    """A model family: the classes that build it and what every tool needs to know of it."""
    name: str                               # the key of every tool's table: "gpt", "llama", ...
    summary: str
    model_class: type                       # model_class(config, rng=..., dtype=...)
    config_class: type | None = None        # a frozen dataclass with to_dict(); None: CBOW
    objective: type | None = None           # the loss it is checked and exported with
    aliases: tuple[str, ...] = ()           # other names accepted for the family
    hf_model_types: tuple[str, ...] = ()    # Hugging Face config.json model_type values
    count: Callable[[Any], Any] | None = None         # numpy_tf config -> Accounting
    count_hf: Callable[[dict], Any] | None = None     # HF config.json -> Accounting (HF names)
    hf_config: Callable[[Any], dict] | None = None    # numpy_tf config -> HF config.json
    torch_modules: tuple[str, ...] = ()     # torch classes counted from their kwargs
    count_torch: Callable[[dict], Any] | None = None  # torch kwargs -> Accounting (torch names)
    torch_config: Callable[[Any], dict] | None = None  # numpy_tf config -> torch kwargs
    checkpoint_kind: str = ""               # "": the model class's name

    @property
    def kind(self) -> str:
        """What a checkpoint records to rebuild the model: the class name of its models."""
        return self.checkpoint_kind or self.model_class.__name__


@dataclass(frozen=True)
class Preset:
    """A named configuration of a family, the same config in every command."""
    name: str
    family: str
    config: Any                             # an instance of the family's config class
    summary: str
    aliases: tuple[str, ...] = ()
    hf: bool = False                        # a published Hugging Face model of this shape
    torch: bool = False                     # a torch module's shape, counted as that module

    def __post_init__(self):
        if self.hf and self.torch:
            raise ValueError(f"preset {self.name!r} is counted either as a Hugging Face model "
                             "(hf) or as a torch module (torch), not both")

    def fields(self) -> dict:
        return self.config.to_dict()


FAMILIES: dict[str, Family] = {}
PRESETS: dict[str, Preset] = {}
_NAMES: dict[str, Family | Preset] = {}     # every name and alias -> what it names


def _claim(names) -> None:
    taken = [name for name in names if name in _NAMES]
    if taken:
        raise ValueError(f"the name {taken[0]!r} is taken (by {_NAMES[taken[0]].name!r}); "
                         "family, preset and alias names are unique")


def register_family(family: Family, replace_existing: bool = False) -> Family:
    """Add a family (see the module text). A name already in use is refused, unless
    `replace_existing` and it names a family of the same name (checkpoint.register_model)."""
    if not isinstance(family, Family):
        raise TypeError(f"family must be a Family; got {type(family).__name__}")
    old = FAMILIES.get(family.name)
    if old is not None and replace_existing:
        for name in (old.name, *old.aliases):
            _NAMES.pop(name, None)
    _claim((family.name, *family.aliases))
    FAMILIES[family.name] = family
    for name in (family.name, *family.aliases):
        _NAMES[name] = family
    return family


def register_preset(preset: Preset) -> Preset:
    if not isinstance(preset, Preset):
        raise TypeError(f"preset must be a Preset; got {type(preset).__name__}")
    owner = FAMILIES.get(preset.family)
    if owner is None:
        raise ValueError(f"preset {preset.name!r} names no registered family "
                         f"({preset.family!r}); register the family first")
    if owner.config_class is None or not isinstance(preset.config, owner.config_class):
        raise TypeError(f"preset {preset.name!r} must hold a {owner.config_class}; got "
                        f"{type(preset.config).__name__}")
    _claim((preset.name, *preset.aliases))
    PRESETS[preset.name] = preset
    for name in (preset.name, *preset.aliases):
        _NAMES[name] = preset
    return preset


# -- lookups ----------------------------------------------------------------------------------
def names() -> str:
    """'families: gpt, ...; presets: gpt2, ...' for error messages and --help."""
    return f"families: {', '.join(FAMILIES)}; presets: {', '.join(PRESETS)}"


def resolve(name: str, argument: str = "model") -> tuple[Family, Preset | None]:
    """The family a family or preset name (or an alias) names, and the preset if it is one."""
    owner = _NAMES.get(name) if isinstance(name, str) else None
    if owner is None:
        raise ValueError(f"{argument} {name!r} is neither a model family nor a preset; "
                         f"{names()}")
    if isinstance(owner, Preset):
        return FAMILIES[owner.family], owner
    return owner, None


def family(name: str, argument: str = "family") -> Family:
    """The family of a family or preset name."""
    return resolve(name, argument)[0]


def find_preset(name) -> Preset | None:
    """The preset a name or alias names; None if it names none."""
    owner = _NAMES.get(name) if isinstance(name, str) else None
    return owner if isinstance(owner, Preset) else None


def presets_of(family_name: str) -> list[Preset]:
    return [p for p in PRESETS.values() if p.family == family_name]


def family_of_model_type(model_type) -> Family | None:
    for candidate in FAMILIES.values():
        if model_type in candidate.hf_model_types:
            return candidate
    return None


def family_of_torch_module(module) -> Family | None:
    """The family counting a torch class ("torch.nn.Transformer") from its kwargs."""
    for candidate in FAMILIES.values():
        if module in candidate.torch_modules:
            return candidate
    return None


def family_of_kind(kind) -> Family | None:
    """The family whose model class is named `kind` (a checkpoint's record)."""
    for candidate in FAMILIES.values():
        if candidate.kind == kind:
            return candidate
    return None


def family_of_config(config) -> Family | None:
    for candidate in FAMILIES.values():
        if candidate.config_class is not None and type(config) is candidate.config_class:
            return candidate
    return None


# -- the one config reader --------------------------------------------------------------------
def read_config(source, argument: str = "config", offered: str | None = None) -> Preset | dict:
    """What a config argument names: a Preset for a preset name (or alias), else the JSON object
    held by a file, by a folder's config.json, or by the text itself (inline JSON: text
    starting with "{", or "[" to be told it is not an object). A given dict comes back as a
    copy. The dict is numpy_tf config fields (with an optional "family" key, default gpt) or a
    Hugging Face config.json (with "model_type").

    A file or a folder holding config.json wins over a preset of the same name; a folder
    without one does not (`numpy-tf train --out tiny-gpt` makes such a folder). Every error
    names `argument` and what was given; `offered` (e.g. "numpy-tf train trains (...)") says
    which presets the command takes, in the message for an unknown name."""
    if isinstance(source, Preset):
        return source
    if isinstance(source, Mapping):
        return dict(source)
    if not isinstance(source, (str, Path)):
        raise TypeError(f"{argument} must be a preset name, a path or a dict; got "
                        f"{type(source).__name__}")
    text = str(source)
    if text.lstrip()[:1] in ("{", "["):
        return _json_object(text, lambda error: f"{argument} {text}: not valid JSON ({error})",
                            f"{argument} {text}")
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{argument} {path} cannot be read: {error}") from None
        return _json_object(content, lambda error: f"{argument} {path} is not a JSON file: "
                            f"{error}", f"{argument} {path}")
    preset = find_preset(text)
    if preset is not None:
        return preset
    if path.is_dir():
        raise ValueError(f"{argument} {text!r} is a folder without a config.json")
    if path.suffix == ".json" or len(path.parts) > 1:
        raise ValueError(f"{argument}: no such file: {text!r}")
    if offered is not None:
        raise ValueError(f"{argument} {text!r} is neither a preset {offered} nor a JSON file, a "
                         "folder holding config.json or inline JSON")
    raise ValueError(f"{argument} {text!r} is neither a file nor a preset; presets: "
                     f"{', '.join(PRESETS)}")


def _json_object(text: str, invalid: Callable[[Exception], str], where: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(invalid(error)) from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} must hold a JSON object; got {type(value).__name__}")
    return value


def split_family(fields: Mapping, default: str = "gpt",
                 argument: str = "config") -> tuple[Family, dict]:
    """numpy_tf config fields -> (their family, the fields without the "family" key)."""
    fields = dict(fields)
    name = fields.pop("family", default)
    try:
        owner = family(name, f"{argument} family")
    except ValueError:
        raise ValueError(f"{argument} family {name!r} is not a model family; families: "
                         f"{', '.join(FAMILIES)}") from None
    return owner, fields


def make_config(owner: Family, fields: Mapping, base=None, argument: str = "config"):
    """The family's config from `fields`, over `base` (a config of the family) when given,
    else over the config class's defaults; a field the class lacks is an error naming it."""
    if owner.config_class is None:
        raise ValueError(f"the {owner.name} family has no config class")
    try:
        if base is not None:
            return replace(base, **fields)
        return owner.config_class(**fields)
    except TypeError as error:
        raise ValueError(f"{argument}: {error}") from None


# -- the families and their presets -----------------------------------------------------------
register_family(Family(
    "gpt", "decoder-only GPT: the tiny Pre-LN GPT and GPT-2's layout", GPT, GPTConfig,
    NextTokenLoss, hf_model_types=("gpt2",), count=count_gpt, count_hf=count_gpt2_hf,
    hf_config=gpt2_hf_config))
register_family(Family(
    "llama", "Llama: RMSNorm, RoPE, grouped-query attention, SwiGLU", Llama, LlamaConfig,
    NextTokenLoss, hf_model_types=("llama", "mistral"), count=count_llama,
    count_hf=count_llama_hf,
    hf_config=llama_hf_config))
register_family(Family(
    "bert", "BERT: a bidirectional encoder with its masked-LM head", Bert, BertConfig,
    MaskedLMLoss, hf_model_types=("bert",), count=count_bert, count_hf=count_bert_hf,
    hf_config=bert_hf_config))
register_family(Family(
    "seq2seq", "the encoder-decoder: torch.nn.Transformer with embeddings and a head", Seq2Seq,
    Seq2SeqConfig, Seq2SeqLoss, aliases=("transformer",), count=count_seq2seq,
    torch_modules=(TORCH_TRANSFORMER,), count_torch=count_torch_transformer,
    torch_config=torch_transformer_config))
register_family(Family("cbow", "CBOW word vectors (word2vec's continuous bag of words)", CBOW))
register_family(Family(
    "neox", "GPT-NeoX / Pythia: partial RoPE, per-head fused qkv, parallel residual", GPTNeoX,
    NeoXConfig, NextTokenLoss, aliases=("gpt-neox", "pythia"), hf_model_types=("gpt_neox",),
    count=count_neox, count_hf=count_neox_hf, hf_config=neox_hf_config))
register_family(Family(
    "gemma", "Gemma and Gemma2: Gemma's RMSNorm, a scaled embedding, GeGLU, a tied head; "
    "Gemma2's sandwich norms, soft caps and alternating sliding window", Gemma, GemmaConfig,
    NextTokenLoss, hf_model_types=("gemma", "gemma2"), count=count_gemma,
    count_hf=count_gemma_hf, hf_config=gemma_hf_config))
# the Llama-shaped Hugging Face families: numpy_tf's Llama with the options each one sets
for _name, _summary, _count_hf, _hf_config in [
        ("qwen2", "Qwen2: Llama with q, k and v biases (o_proj without)", count_qwen2_hf,
         qwen2_hf_config),
        ("qwen3", "Qwen3: Llama with an RMSNorm per query and key head before RoPE",
         count_qwen3_hf, qwen3_hf_config),
        ("phi3", "Phi-3: Llama with fused qkv_proj and gate_up_proj checkpoints", count_phi3_hf,
         phi3_hf_config)]:
    register_family(Family(_name, _summary, Llama, LlamaConfig, NextTokenLoss,
                           hf_model_types=(_name,), count=count_llama, count_hf=_count_hf,
                           hf_config=_hf_config))

for _preset in [
    Preset("gpt2", "gpt", GPTConfig.gpt2(), "GPT-2 124M (Hugging Face gpt2)",
           aliases=("gpt2-124m",), hf=True),
    Preset("gpt2-tiny", "gpt", GPTConfig.gpt2(vocab_size=24, max_context=10, width=16, heads=4,
                                              layers=2),
           "GPT-2's layout (biases, tanh GELU, tied head) at toy size"),
    Preset("tiny-gpt", "gpt", GPTConfig.tiny(), "the 7,232-parameter Pre-LN GPT, "
           "GPTConfig.tiny()", aliases=("tiny",)),
    Preset("char-gpt", "gpt", GPTConfig(vocab_size=ByteTokenizer().vocab_size, max_context=64,
                                        width=96, heads=4, layers=3),
           "the byte-level GPT `numpy-tf train` trains by default"),
    Preset("smollm2-135m", "llama", LlamaConfig.smollm2_135m(), "SmolLM2-135M's shape "
           "(HuggingFaceTB/SmolLM2-135M)", aliases=("smollm2",), hf=True),
    Preset("llama-2-7b", "llama", LlamaConfig.llama2_7b(), "Llama-2-7B's shape "
           "(meta-llama/Llama-2-7b-hf)", hf=True),
    Preset("llama-3.2-1b", "llama", LlamaConfig.llama3_2_1b(), "Llama-3.2-1B's shape, with "
           "its llama3 RoPE scaling (meta-llama/Llama-3.2-1B)", hf=True),
    Preset("llama-tiny", "llama", LlamaConfig(num_key_value_heads=2),
           "a toy Llama with two key/value heads for four query heads"),
    Preset("pythia-160m", "neox", NeoXConfig.pythia_160m(), "Pythia-160M's shape "
           "(EleutherAI/pythia-160m)", hf=True),
    Preset("gpt-neox-20b", "neox", NeoXConfig.gpt_neox_20b(), "GPT-NeoX-20B's shape "
           "(EleutherAI/gpt-neox-20b)", hf=True),
    Preset("neox-tiny", "neox", NeoXConfig(), "a toy GPT-NeoX: parallel residual, a quarter "
           "of each head rotated"),
    Preset("mistral-7b-v0.1", "llama", LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
        max_position_embeddings=32768, sliding_window=4096),
        "Mistral-7B-v0.1's shape (mistralai/Mistral-7B-v0.1): a Llama with a 4096-position "
        "sliding window", hf=True),
    Preset("mistral-tiny", "llama", LlamaConfig(num_key_value_heads=2, sliding_window=3),
           "a toy Mistral: llama-tiny with a sliding window of 3 positions"),
    Preset("gemma-2b", "gemma", GemmaConfig.gemma_2b(), "Gemma-2B's shape (google/gemma-2b)",
           hf=True),
    Preset("gemma-2-2b", "gemma", GemmaConfig.gemma2_2b(), "Gemma-2-2B's shape "
           "(google/gemma-2-2b)", hf=True),
    Preset("gemma-tiny", "gemma", GemmaConfig(num_key_value_heads=2),
           "a toy Gemma with two key/value heads for four query heads"),
    Preset("gemma2-tiny", "gemma", GemmaConfig(
        num_hidden_layers=3, num_key_value_heads=2, model_type="gemma2",
        query_pre_attn_scalar=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
        sliding_window=3, layer_types=("sliding_attention", "full_attention",
                                       "sliding_attention")),
        "a toy Gemma2: sandwich norms, soft caps, a window of 3 on layers 0 and 2"),
    Preset("qwen2.5-0.5b", "qwen2", LlamaConfig.qwen2_5_0_5b(), "Qwen2.5-0.5B's shape "
           "(Qwen/Qwen2.5-0.5B)", hf=True),
    Preset("qwen2-tiny", "qwen2", LlamaConfig(num_key_value_heads=2, attention_bias=True,
                                              attention_output_bias=False),
           "a toy Qwen2: q, k and v biases, two key/value heads for four query heads"),
    Preset("qwen3-0.6b", "qwen3", LlamaConfig.qwen3_0_6b(), "Qwen3-0.6B's shape "
           "(Qwen/Qwen3-0.6B)", hf=True),
    Preset("qwen3-tiny", "qwen3", LlamaConfig(num_key_value_heads=2, head_dim=6, qk_norm=True),
           "a toy Qwen3: q_norm and k_norm, head_dim 6 for hidden 16 and 4 heads"),
    Preset("phi-3-mini-4k", "phi3", LlamaConfig.phi3_mini_4k(), "Phi-3-mini-4k's shape "
           "(microsoft/Phi-3-mini-4k-instruct)", hf=True),
    Preset("phi3-tiny", "phi3", LlamaConfig(num_key_value_heads=2, rms_norm_eps=1e-5),
           "a toy Phi-3 (its checkpoints fuse qkv_proj and gate_up_proj)"),
    Preset("bert-base-uncased", "bert", BertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2),
        "BERT-base as BertForMaskedLM (bert-base-uncased)", hf=True),
    Preset("bert-tiny", "bert", BertConfig(), "a toy Post-LN BERT with its MLM head"),
    Preset("seq2seq-tiny", "seq2seq", Seq2SeqConfig(), "a toy Post-LN encoder-decoder (torch's "
           "default block) on the digit vocabulary", aliases=("digits",)),
    Preset("seq2seq-digits", "seq2seq", Seq2SeqConfig(norm_first=True), "the Pre-LN "
           "encoder-decoder `numpy-tf train --task reverse-digits` trains"),
    Preset("transformer-base", "seq2seq", Seq2SeqConfig(
        d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
        dropout=0.1, scale_embeddings=True), "the base model of Attention Is All You Need "
        "(torch.nn.Transformer()'s defaults); numpy-tf params counts its layer stacks as "
        "torch.nn.Transformer, 44,140,544", torch=True),
]:
    register_preset(_preset)

register_family(Family(
    "mixtral", "Mixtral: Llama's attention with a sparse mixture of SwiGLU experts", Mixtral,
    MixtralConfig, MixtralLoss, hf_model_types=("mixtral",), count=count_mixtral,
    count_hf=count_mixtral_hf, hf_config=mixtral_hf_config))
for _preset in [
    Preset("mixtral-8x7b", "mixtral", MixtralConfig.mixtral_8x7b(), "Mixtral-8x7B's shape "
           "(mistralai/Mixtral-8x7B-v0.1): 46,702,792,704 parameters, 12,879,925,248 active "
           "per token", hf=True),
    Preset("mixtral-tiny", "mixtral", MixtralConfig(num_key_value_heads=2,
                                                    output_router_logits=True),
           "a toy Mixtral: 4 experts, 2 per token, two key/value heads, the auxiliary loss on"),
]:
    register_preset(_preset)
