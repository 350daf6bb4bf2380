"""Case export: one .npz file holding everything needed to check an implementation of a whole
model against numpy_tf, number by number (SPEC §7).

    case = export_case("tiny-gpt", seed=0, dtype="float64")        # or "gpt2", config=...
    case.save("case.npz")

The file is a zip of .npy arrays (np.load(path, allow_pickle=False); any language with an npy
reader can open it). Its keys, in this order (the order is part of the format):

    meta                  0-d string, JSON: model, config, seed, dtype, versions, loss, every
                          convention the numbers follow (meta["conventions"]), this key list
    param/<name>          every parameter (torch-style state_dict names; a tied weight under
                          each of its names)
    input/<name>          ids (B, T) int64; key_padding_mask (B, T) bool, True at padding (if
                          any); the transformer's: src_ids, decoder_input, target (-100 where
                          nothing is predicted), src_key_padding_mask, tgt_key_padding_mask;
                          BERT's: ids (after masking), labels (-100 where nothing is asked),
                          token_type_ids, key_padding_mask (if any)
    act/<module>          each named module's forward output, in forward call order
    output/logits         (B, T, V)
    loss                  0-d: the objective meta["loss"] defines
    grad_act/<module>     dL/d(act/<module>), in the order backward reached each module
    grad/<name>           dL/d(param/<name>); a tied weight's is the sum of its uses

`<module>` is the numpy_tf module name (blocks.0.norm1, blocks.0.attention.qkv, ...; a module
called twice in one pass is `<module>#2` the second time). Every float array has the case's
dtype. Weights and inputs are drawn from numpy.random.default_rng(seed): weights first, in
named_parameters order, N(0, s^2) with s = init_std (default 1.2 / sqrt(width), so attention
is far from uniform and the case has teeth), norm weights 1 + N(0, 0.2^2); then the ids.

A model is named as everywhere in numpy_tf (numpy_tf.models.registry): a family (gpt, llama,
qwen2, qwen3, phi3, neox, gemma, mixtral, bert, seq2seq) or a preset (tiny-gpt, gpt2-tiny,
llama-tiny, smollm2-135m, bert-tiny, neox-tiny, ...);
export's five first names (tiny-gpt, gpt2, llama, transformer, bert) keep their meaning. What a
family's cases need beyond its registry entry (the inputs, the conventions) is its EXPORTS
entry, keyed by the family's name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..core.module import Module, float_dtype, record_activations
from ..interop.hf import config_from_hf
from ..models import registry
from ..models.bert import Bert
from ..models.encoder_decoder.seq2seq import Seq2Seq
from ..models.gpt import GPT
from ..models.gemma import Gemma
from ..models.llama import Llama
from ..models.neox import GPTNeoX
from ..models.mixtral import Mixtral
from ..models.objectives import MaskedLMLoss
from ..text.datasets import mask_tokens, reverse_digits
from .case_file import Case

ORDER = ["meta", "param/<name>", "input/<name>", "act/<module> (forward order)",
         "output/<name>", "loss", "grad_act/<module> (backward order)", "grad/<name>"]

NEXT_TOKEN_LOSS = {
    "name": "next_token_cross_entropy", "ignore_index": -100,
    "definition": "mean over the kept (b, t) of -log softmax(logits[b, t])[ids[b, t + 1]]; the "
                  "last position, padded positions and positions followed by padding are not "
                  "kept (their target is ignore_index); 0.0 with zero gradients if nothing is "
                  "kept"}
TARGET_LOSS = {
    "name": "target_cross_entropy", "ignore_index": -100,
    "definition": "mean over the (b, t) with target[b, t] != -100 of "
                  "-log softmax(logits[b, t])[target[b, t]] (teacher forcing: the decoder reads "
                  "decoder_input = BOS + reversed digits and predicts target = reversed digits "
                  "+ EOS)"}
MASKED_LM_LOSS = {
    "name": "masked_lm_cross_entropy", "ignore_index": -100,
    "definition": "mean over the (b, t) whose labels[b, t] is not -100 of -log softmax(logits"
                  "[b, t])[labels[b, t]] (HF BertForMaskedLM's labels= loss); 0.0 with zero "
                  "gradients if no label is given"}
MIXTRAL_LOSS = {
    "name": "next_token_cross_entropy_plus_router_aux", "ignore_index": -100,
    "definition": NEXT_TOKEN_LOSS["definition"] + "; plus router_aux_loss_coef times the "
                  "load-balancing loss (meta conventions auxiliary_loss) when the config's "
                  "output_router_logits is true: HF MixtralForCausalLM's loss with labels and "
                  "output_router_logits"}
KEYWORD_INPUTS = ("key_padding_mask", "src_key_padding_mask", "tgt_key_padding_mask",
                  "token_type_ids")
LINEAR_LAYOUT = "(out_features, in_features), y = x W^T + b"


@dataclass(frozen=True)
class ModelExport:
    """What exporting one registered family takes beyond its registry entry."""
    default: str                                    # the preset the bare family name exports
    inputs: Callable[[Module, np.random.Generator, int, int | None, int], dict]
    conventions: Callable[[Module], dict]
    loss: dict                                      # meta["loss"]; "name" picks the torch loss
    width: Callable[[Module], int]                  # for the default weight spread
    objective: Callable[[Module], Module] | None = None   # None: the family's objective


def _lm_inputs(model: Module, g: np.random.Generator, batch: int, length: int | None,
               pad: int) -> dict:
    """ids (batch, length) uniform over the vocabulary; `pad` padded positions at the end of
    the last row (a key_padding_mask, True at padding)."""
    longest = getattr(model.config, "max_context", None)
    length = min(7, longest or 7) if length is None else length
    if length < 1 or (longest is not None and length > longest):
        raise ValueError(f"length must be in [1, max_context = {longest}]; got {length}")
    if not 0 <= pad < length:
        raise ValueError(f"pad must be in [0, length = {length}); got {pad}")
    inputs = {"ids": g.integers(0, model.config.vocab_size, (batch, length), dtype=np.int64)}
    if pad:
        inputs["key_padding_mask"] = np.zeros((batch, length), dtype=bool)
        inputs["key_padding_mask"][-1, length - pad:] = True
    return inputs


def _gpt_conventions(model: GPT) -> dict:
    c = model.config
    block = ("Pre-LN: u = x + attention(norm1(x)); y = u + feedforward(norm2(u))" if
             c.norm_first else "Post-LN: u = norm1(x + attention(x)); y = norm2(u + "
             "feedforward(u))")
    activation = {"gelu": "exact GELU x Phi(x) (erf; torch.nn.GELU(approximate='none'))",
                  "gelu_tanh": "tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) "
                               "(torch approximate='tanh', HF gelu_new)",
                  "relu": "ReLU"}[c.activation]
    return {
        "model": "ids -> tokens (embedding) -> positions (adds learned rows 0..T-1) -> blocks "
                 "-> final_norm -> output (Linear, no bias) = logits",
        "block": block,
        "attention": f"causal self-attention, {c.heads} heads of {c.width // c.heads}: one "
                     "fused Linear `qkv` (C -> 3C) whose output columns are [q | k | v], each "
                     "(B, T, C) -> (B, H, T, d); scores q k^T / sqrt(d); query i sees keys "
                     "j <= i; softmax over keys (row max subtracted); heads merged back to "
                     "(B, T, C), then the Linear `output`",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key (a query row with "
                            "every key blocked gives zeros, never NaN)",
        "layernorm": f"over the last axis, biased variance (divide by C), eps = {c.norm_eps} "
                     "inside the square root, weight and bias",
        "feedforward": f"Sequential: feedforward.0 Linear(C, {c.hidden or 4 * c.width}), "
                       f"feedforward.1 {activation}, feedforward.2 Linear back to C",
        "gelu": activation,
        "positions": "learned absolute positions (a (max_context, C) table); no RoPE",
        "rope": "none",
        "biases": f"attention {c.attention_bias}, feedforward {c.ffn_bias}, output head none",
        "tied": "output.weight IS tokens.weight (one Parameter, listed under both names; its "
                "gradient is the sum of both uses)" if c.tied else "untied",
        "dropout": "none (p = 0: the case is deterministic)",
        "linear_weight_layout": LINEAR_LAYOUT,
    }


def _llama_conventions(model: Llama) -> dict:
    c = model.config
    return {
        "model": "ids -> embed_tokens -> layers -> norm -> lm_head (Linear, no bias) = logits; "
                 "names are HF LlamaForCausalLM's without the `model.` prefix",
        "block": "u = x + self_attn(input_layernorm(x)); y = u + mlp(post_attention_layernorm"
                 "(u))",
        "attention": f"causal self-attention, {c.num_attention_heads} query heads and "
                     f"{c.kv_heads} key/value heads of {c.head_width}; q_proj, k_proj, v_proj, "
                     "o_proj; key/value head j serves query heads j r .. j r + r - 1 (HF "
                     "repeat_kv); scores q k^T / sqrt(d); query i sees keys j <= i",
        "rope": f"on q and k after the projections, halves layout (HF rotate_half: pairs "
                f"(i, i + d/2)), inv_freq_i = {c.rope_theta:g}^(-2i/d), positions 0 .. T-1, "
                "angles in the working dtype (HF computes them in float32)"
                + ("" if c.rope_scaling is None else
                   f"; scaled: {c.rope_scaling.to_dict()} (numpy_tf.layers.rope_scaling, HF's "
                   "rope initialisation; yarn multiplies cos and sin by its attention factor)"),
        "qk_norm": "q_norm and k_norm: RMSNorm (weight (d,), eps = rms_norm_eps) over each "
                   "query and key head after the projection, before RoPE (HF Qwen3)"
                   if c.qk_norm else "none",
        "rmsnorm": f"w x / sqrt(mean(x^2) + eps), eps = {c.rms_norm_eps:g}, over the last axis, "
                   "in the working dtype (HF casts to float32)",
        "mlp": "SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x))",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key",
        "biases": f"q_proj, k_proj, v_proj {c.attention_bias}, o_proj {c.output_bias}, mlp "
                  f"{c.mlp_bias}, lm_head none",
        "tied": "lm_head.weight IS embed_tokens.weight (listed under both names; its gradient "
                "is the sum of both uses)" if c.tie_word_embeddings else "untied",
        "positions": "RoPE only (no absolute positions)", "gelu": "none (SiLU in the MLP)",
        "dropout": "none", "linear_weight_layout": LINEAR_LAYOUT,
        "sliding_window": _window_convention(c.sliding_window),
    }


def _window_convention(window) -> str:
    return "none" if window is None else \
        f"{window}: query i sees keys i - {window} < j <= i only (Mistral's, HF's)"


def _gemma_conventions(model: Gemma) -> dict:
    c = model.config
    gemma2 = c.model_type == "gemma2"
    scale = f"query_pre_attn_scalar^(-1/2) = {c.query_pre_attn_scalar:g}^(-1/2)" \
        if c.query_pre_attn_scalar else "1 / sqrt(d)"
    windows = [c.layer_window(i) for i in range(c.num_hidden_layers)]
    return {
        "model": "ids -> embed_tokens -> times sqrt(hidden_size) rounded to the working dtype "
                 "-> layers -> norm -> lm_head (Linear, no bias) = logits"
                 + (f" -> c tanh(logits / c), c = {c.final_logit_softcapping:g}"
                    if c.final_logit_softcapping else "")
                 + f"; names are HF {'Gemma2' if gemma2 else 'Gemma'}ForCausalLM's without "
                 "the `model.` prefix",
        "block": "u = x + post_attention_layernorm(self_attn(input_layernorm(x))); y = u + "
                 "post_feedforward_layernorm(mlp(pre_feedforward_layernorm(u)))" if gemma2
                 else "u = x + self_attn(input_layernorm(x)); y = u + mlp("
                      "post_attention_layernorm(u))",
        "attention": f"causal self-attention, {c.num_attention_heads} query heads and "
                     f"{c.kv_heads} key/value heads of {c.head_width} (HF repeat_kv order); "
                     f"scores scaled by {scale}"
                     + (f", soft-capped c tanh(s / c), c = {c.attn_logit_softcapping:g}, "
                        "before the masks" if c.attn_logit_softcapping else ""),
        "sliding_window": "; ".join(f"layer {i}: {_window_convention(w)}"
                                    for i, w in enumerate(windows)),
        "rope": f"halves layout (HF rotate_half), inv_freq_i = {c.rope_theta:g}^(-2i/d), "
                "angles in the working dtype",
        "rmsnorm": f"Gemma's: (1 + w) x / sqrt(mean(x^2) + eps), eps = {c.rms_norm_eps:g}, "
                   "in the working dtype (HF casts to float32)",
        "mlp": "GeGLU: down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))",
        "gelu": "tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in the MLP's gate",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key",
        "biases": f"attention {c.attention_bias}, mlp none, lm_head none",
        "tied": "lm_head.weight IS embed_tokens.weight (listed under both names; its gradient "
                "is the sum of both uses)" if c.tie_word_embeddings else "untied",
        "positions": "RoPE only", "dropout": "none", "linear_weight_layout": LINEAR_LAYOUT,
    }


def _neox_conventions(model: GPTNeoX) -> dict:
    c = model.config
    residual = ("parallel: y = x + attention(input_layernorm(x)) + mlp(post_attention_layernorm"
                "(x))" if c.use_parallel_residual else "sequential: u = x + attention("
                "input_layernorm(x)); y = u + mlp(post_attention_layernorm(u))")
    activation = {"gelu": "exact GELU x Phi(x) (erf)", "relu": "ReLU"}.get(
        c.hidden_act, "tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")
    return {
        "model": "ids -> embed_in -> layers -> final_layer_norm -> embed_out (Linear, no bias) "
                 "= logits; names are HF GPTNeoXForCausalLM's without the `gpt_neox.` prefix "
                 "(HF 5 calls embed_out lm_head)",
        "block": residual,
        "attention": f"causal self-attention, {c.num_attention_heads} heads of {c.head_width}: "
                     "one Linear query_key_value (C -> 3C) whose output is grouped per head, "
                     "[q_h | k_h | v_h] for head h (HF: view(B, T, H, 3d), chunk(3)); scores "
                     "q k^T / sqrt(d); query i sees keys j <= i; then the Linear dense",
        "rope": f"partial: features 0 .. {c.rotary_dim - 1} of each q and k head rotate "
                f"(rotary_dim = int(d * rotary_pct) = int({c.head_width} * {c.rotary_pct})), "
                f"the rest pass through; halves layout (pairs (i, i + {c.rotary_dim // 2})), "
                f"inv_freq_i = {c.rope_theta:g}^(-2i/{c.rotary_dim}), positions 0 .. T-1, "
                "angles in the working dtype (HF computes them in float32)",
        "layernorm": f"over the last axis, biased variance, eps = {c.layer_norm_eps} inside the "
                     "square root, weight and bias",
        "mlp": f"dense_h_to_4h (C -> {c.intermediate_size}, bias), act, dense_4h_to_h (bias)",
        "gelu": activation if c.hidden_act != "relu" else "none (ReLU)",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key",
        "biases": f"query_key_value and dense {c.attention_bias}, mlp True, LayerNorms True, "
                  "embed_out none",
        "tied": "embed_out.weight IS embed_in.weight (listed under both names; its gradient "
                "is the sum of both uses)" if c.tie_word_embeddings else "untied",
        "positions": "RoPE only (no absolute positions)",
        "dropout": "none", "linear_weight_layout": LINEAR_LAYOUT,
    }


def _mixtral_conventions(model: Mixtral) -> dict:
    c = model.config
    aux = (f"the loss adds router_aux_loss_coef ({c.router_aux_loss_coef:g}) times the "
           "load-balancing loss" if c.output_router_logits else "output_router_logits is "
           "false: the loss is the cross-entropy alone")
    return {
        **_llama_conventions(SimpleNamespace(config=c.llama_config())),  # the same attention
        "model": "ids -> embed_tokens -> layers -> norm -> lm_head (Linear, no bias) = logits; "
                 "names are HF MixtralForCausalLM's (transformers 5) without the `model.` "
                 "prefix",
        "mlp": f"sparse mixture of {c.num_local_experts} SwiGLU experts, "
               f"{c.num_experts_per_tok} per token: router logits z = mlp.gate(x) (E), p = "
               "softmax(z) over every expert, the top-k of p (largest first), weights p[S] / "
               "sum p[S]; y = sum_j w_j down_e(silu(gate_e x) * up_e x) with "
               "mlp.experts.gate_up_proj[e] = [gate_e; up_e] (E, 2F, C) and "
               "mlp.experts.down_proj[e] (E, C, F); act/layers.i.mlp is y",
        "auxiliary_loss": "aux = E sum_e f_e P_e over every layer's rows at once: f_e the share "
                          "of the real tokens' top-k choices that went to e, P_e the mean "
                          "router probability of e over the real tokens (HF "
                          "load_balancing_loss_func with the attention_mask); " + aux,
        "biases": "none",
    }


def _digit_inputs(model: Seq2Seq, g: np.random.Generator, batch: int, length: int | None,
                  pad: int) -> dict:
    """The digit-reversal task (numpy_tf.data.reverse_digits): `batch` strings of random
    lengths in [1, length], so the shorter ones are padded on both sides."""
    if pad:
        raise ValueError("pad applies to the decoder-only models; the transformer's digit "
                         "strings are padded by their random lengths")
    if model.config.src_features is not None:
        raise ValueError(f"the seq2seq case draws digit strings as the source; a config with "
                         f"src_features={model.config.src_features} reads feature vectors, "
                         "which export does not draw")
    task = reverse_digits(batch, g, 1, 5 if length is None else length)
    return {"src_ids": task.source, "decoder_input": task.decoder_input,
            "target": task.target, "src_key_padding_mask": task.source_padding_mask,
            "tgt_key_padding_mask": task.target_padding_mask}


def _seq2seq_conventions(model: Seq2Seq) -> dict:
    c = model.config
    return {
        "model": "src_ids -> src_embedding [* sqrt(d_model)] -> positions -> "
                 "transformer.encoder = memory; decoder_input -> tgt_embedding [* sqrt(d_model)] "
                 "-> positions (its second call: act/positions#2) -> transformer.decoder(., "
                 "memory) -> output (Linear with bias) = logits; transformer.* are "
                 "torch.nn.Transformer(batch_first=True)'s names",
        "scale_embeddings": c.scale_embeddings,
        "block": ("Pre-LN" if c.norm_first else "Post-LN (torch's default)") +
                 f", {c.activation} feed-forward of {c.dim_feedforward}, {c.nhead} heads, "
                 + ("final LayerNorms transformer.encoder.norm and transformer.decoder.norm"
                    if c.final_norms else "no final LayerNorms (final_norms=False)"),
        "masks": "src_key_padding_mask (B, S) and tgt_key_padding_mask (B, T) bool, True = "
                 "padding; the source padding is also the memory's (memory_key_padding_mask); "
                 "the decoder's self-attention is causal",
        "positions": "sinusoidal PE(t, 2i) = sin(t 10000^(-2i/C)), PE(t, 2i+1) = cos(.), added",
        "layernorm": f"biased variance over the last axis, eps = {c.layer_norm_eps} inside "
                     "the square root",
        "gelu": "exact (erf)" if c.activation == "gelu" else "none (ReLU)",
        "rope": "none", "dropout": "none", "linear_weight_layout": LINEAR_LAYOUT,
    }


class _MaskedLM(MaskedLMLoss):
    """MaskedLMLoss with the case's input names: forward(ids, labels, key_padding_mask=None,
    token_type_ids=None)."""

    def forward(self, ids, labels, key_padding_mask=None, token_type_ids=None):
        return super().forward(ids, labels, key_padding_mask=key_padding_mask,
                               token_type_ids=token_type_ids)


def _mlm_inputs(model: Bert, g: np.random.Generator, batch: int, length: int | None,
                pad: int) -> dict:
    """Random ids with `pad` padded positions at the end of the last row (pad_token_id there),
    corrupted by numpy_tf.data.mask_tokens with the last id as [MASK] and half the real tokens
    chosen (BERT's 15 % would leave a case of a few tokens with one label or none); segments
    0 for the first half of each row and 1 after (with type_vocab_size 2 or more)."""
    c = model.config
    inputs = _lm_inputs(model, g, batch, length if length is not None else
                        min(7, c.max_position_embeddings), pad)
    ids, padding = inputs["ids"], inputs.get("key_padding_mask")
    if padding is not None and c.pad_token_id is not None:
        ids[padding] = c.pad_token_id
    inputs["ids"], inputs["labels"] = mask_tokens(ids, g, c.vocab_size - 1, c.vocab_size,
                                                  padding_mask=padding, probability=0.5)
    if c.type_vocab_size:
        segments = np.zeros(ids.shape, dtype=np.int64)
        segments[:, ids.shape[1] // 2:] = min(1, c.type_vocab_size - 1)
        inputs["token_type_ids"] = segments
    return inputs


def _bert_conventions(model: Bert) -> dict:
    c = model.config
    activation = "exact GELU x Phi(x) (erf)" if c.hidden_act == "gelu" else "ReLU"
    return {
        "model": "ids -> embeddings (word + segment (token_type_ids) + learned positions "
                 "0..T-1, then LayerNorm) -> encoder (torch.nn.TransformerEncoder names: "
                 "encoder.layers.i.self_attn with in_proj_weight = [q; k; v], linear1, "
                 "linear2, norm1, norm2) -> mlm_head (dense, activation, layer_norm, decoder "
                 "with bias) = logits at every position",
        "block": ("Pre-LN, with a final encoder.norm" if c.norm_first else
                  "Post-LN (BERT): u = norm1(x + self_attn(x)); y = norm2(u + ffn(u))"),
        "attention": f"bidirectional self-attention, {c.num_attention_heads} heads of "
                     f"{c.hidden_size // c.num_attention_heads}; scores q k^T / sqrt(d)",
        "key_padding_mask": "(B, T) bool, True = padding: blocked as a key; padded positions "
                            f"hold pad_token_id = {c.pad_token_id}, whose word embedding row "
                            "gets no gradient",
        "masking": f"numpy_tf.data.mask_tokens with [MASK] = {c.vocab_size - 1} (the last id) "
                   "and probability 0.5: each chosen real token becomes [MASK] (0.8), a random "
                   "id (0.1) or stays (0.1); labels hold the original ids there",
        "layernorm": f"biased variance over the last axis, eps = {c.layer_norm_eps} inside "
                     "the square root",
        "feedforward": f"linear1 (C -> {c.intermediate_size}), {activation}, linear2",
        "gelu": activation if c.hidden_act == "gelu" else "none (ReLU)",
        "positions": "learned absolute positions; act/embeddings.position_embeddings is its "
                     "input plus the rows 0..T-1 (numpy_tf's positions module adds them)"
                     if c.position_embeddings else "none",
        "rope": "none",
        "tied": "mlm_head.decoder.weight IS embeddings.word_embeddings.weight (listed under "
                "both names; its gradient is the sum of both uses)" if c.tie_word_embeddings
                else "untied",
        "dropout": "none", "linear_weight_layout": LINEAR_LAYOUT,
    }


# registry family name -> how its cases are made (in the order `export --help` lists them)
EXPORTS: dict[str, ModelExport] = {
    "gpt": ModelExport(default="tiny-gpt", inputs=_lm_inputs, conventions=_gpt_conventions,
                       loss=NEXT_TOKEN_LOSS, width=lambda model: model.config.width),
    "llama": ModelExport(default="llama-tiny", inputs=_lm_inputs,
                         conventions=_llama_conventions, loss=NEXT_TOKEN_LOSS,
                         width=lambda model: model.config.hidden_size),
    "mixtral": ModelExport(default="mixtral-tiny", inputs=_lm_inputs,
                           conventions=_mixtral_conventions, loss=MIXTRAL_LOSS,
                           width=lambda model: model.config.hidden_size),
    "gemma": ModelExport(default="gemma-tiny", inputs=_lm_inputs,
                         conventions=_gemma_conventions, loss=NEXT_TOKEN_LOSS,
                         width=lambda model: model.config.hidden_size),
    # the Llama-shaped families: numpy_tf's Llama, exported as llama is
    **{name: ModelExport(default=f"{name}-tiny", inputs=_lm_inputs,
                         conventions=_llama_conventions, loss=NEXT_TOKEN_LOSS,
                         width=lambda model: model.config.hidden_size)
       for name in ("qwen2", "qwen3", "phi3")},
    "bert": ModelExport(default="bert-tiny", inputs=_mlm_inputs, conventions=_bert_conventions,
                        loss=MASKED_LM_LOSS, width=lambda model: model.config.hidden_size,
                        objective=_MaskedLM),
    "seq2seq": ModelExport(default="seq2seq-tiny", inputs=_digit_inputs,
                           conventions=_seq2seq_conventions, loss=TARGET_LOSS,
                           width=lambda model: model.config.d_model),
    "neox": ModelExport(default="neox-tiny", inputs=_lm_inputs, conventions=_neox_conventions,
                        loss=NEXT_TOKEN_LOSS, width=lambda model: model.config.hidden_size),
}

# `export --model` took these five names before the registry; each keeps its meaning. Two are
# GPT presets whose bare name exports the first preset listed here (gpt2 alone is gpt2-tiny, not
# the 124M model), and an unknown --config after them lists these presets by the names export
# gave them then (all still accepted).
FIRST_NAMES = ("tiny-gpt", "gpt2", "llama", "transformer", "bert")
FIRST_PRESETS = {"tiny-gpt": ("tiny",), "gpt2": ("gpt2-tiny", "gpt2-124m")}


# the largest model export builds: every parameter is held four times (weights, gradients and
# the copies written into the case), 32 GB in float64 at this size
MAX_PARAMETERS = 1_000_000_000


def model_names() -> str:
    """What `export --model` takes, for messages and --help."""
    presets = [preset.name for name in EXPORTS for preset in registry.presets_of(name)]
    return (f"families {', '.join(EXPORTS)} and their presets {', '.join(presets)}")


def _model(model: str):
    """(family, the config --config fields change (None: the class defaults), the default
    preset, the presets an unknown --config lists) of an --model name."""
    try:
        family, preset = registry.resolve(model)
    except (ValueError, TypeError):
        raise ValueError(f"unknown model {model!r}; numpy_tf exports "
                         f"{', '.join(FIRST_NAMES)} and the {model_names()}") from None
    if family.name not in EXPORTS:
        raise ValueError(f"model {model!r} ({family.summary}) cannot be exported; numpy_tf "
                         f"exports the {model_names()}")
    if model in FIRST_PRESETS:
        default = registry.find_preset(FIRST_PRESETS[model][0])
        offered = f"of {model} ({', '.join(FIRST_PRESETS[model])})"
    else:
        default = preset or registry.find_preset(EXPORTS[family.name].default)
        offered = (f"of the {family.name} family "
                   f"({', '.join(p.name for p in registry.presets_of(family.name))})")
    return family, None if preset is None else preset.config, default, offered


def model_config(model: str, config=None, overrides: dict | None = None):
    """(family, config) of a case: `model` a family or preset name (or one of FIRST_NAMES);
    `config` None (the model's default preset), a preset name, a path or inline JSON (see
    registry.read_config) or a dict of config fields over the model's own config (a Hugging
    Face config.json, with model_type, is read by interop); then `overrides` (fields)."""
    family, base, default, offered = _model(model)
    found = default if config is None else registry.read_config(config, "config", offered)
    if isinstance(found, registry.Preset):
        owner, result = registry.FAMILIES[found.family], found.config
    elif "model_type" in found:
        result = config_from_hf(found)
        owner = registry.family_of_config(result)
    else:
        owner, fields = registry.split_family(found, family.name)
        result = registry.make_config(owner, fields, base if owner is family else None,
                                      f"config for {model}")
    if owner is not family:
        raise ValueError(f"config {config!r} is a {owner.name} config; --model {model} is "
                         f"{family.name}")
    if overrides:
        result = registry.make_config(family, overrides, result, f"config for {model}")
    return family, result


def resolve_config(model: str, config=None, overrides: dict | None = None) -> dict:
    """The config fields of a case (see model_config)."""
    return model_config(model, config, overrides)[1].to_dict()


def model_export(model: str) -> ModelExport:
    """The EXPORTS entry of a model name's family."""
    return EXPORTS[_model(model)[0].name]


def spread_weights(model: Module, g: np.random.Generator, std: float) -> None:
    """Every parameter N(0, std^2), norm weights 1 + N(0, 0.2^2), drawn in float64 in
    named_parameters order (a tied Parameter once) and cast to the model's dtype."""
    for name, parameter in model.named_parameters():
        noise = g.standard_normal(parameter.shape)
        is_norm_weight = "norm" in name.rsplit(".", 1)[0] and name.endswith("weight")
        parameter.data[...] = (1.0 + 0.2 * noise) if is_norm_weight else std * noise


def export_case(model: str, config: str | dict | None = None, overrides: dict | None = None,
                *, seed: int = 0, dtype="float64", batch: int = 2, length: int | None = None,
                pad: int = 0, init_std: float | None = None) -> Case:
    """The case of `model` (a family or preset name, see model_config) built from `config`,
    with weights and inputs drawn from `seed` (see the module text)."""
    from .. import __version__

    family, config = model_config(model, config, overrides)
    entry = EXPORTS[family.name]
    dtype = float_dtype(dtype)
    if family.count is not None and family.count(config).total > MAX_PARAMETERS:
        raise ValueError(f"{model}: a case of {family.count(config).total:,} parameters would "
                         f"hold them, their gradients and a copy of each ({MAX_PARAMETERS:,} "
                         "parameters at most); export a smaller config")
    network = family.model_class(config, dtype=dtype)
    g = np.random.default_rng(seed)
    std = 1.2 / math.sqrt(entry.width(network)) if init_std is None else float(init_std)
    spread_weights(network, g, std)
    inputs = entry.inputs(network, g, batch, length, pad)
    objective = (entry.objective or family.objective)(network)
    with record_activations(network) as recorder:
        loss, cache = objective.forward(**inputs)
        network.zero_grad()
        objective.backward(1.0, cache)
    arrays = {f"param/{name}": value.copy() for name, value in network.state_dict().items()}
    arrays.update({f"input/{name}": value for name, value in inputs.items()})
    arrays.update({f"act/{name}": value for name, value in recorder.activations.items()})
    arrays["output/logits"] = cache.logits
    arrays["loss"] = np.asarray(loss)
    arrays.update({f"grad_act/{name}": value for name, value in recorder.gradients.items()})
    arrays.update({f"grad/{name}": value.copy() for name, value in network.grad_dict().items()})
    meta = {"generator": "numpy_tf.export", "numpy_tf": __version__, "numpy": np.__version__,
            "model": model, "kind": model, "level": "model", "seed": seed,
            "dtype": dtype.name, "config": network.config.to_dict(), "init_std": std,
            "inputs": list(inputs), "keyword_inputs": [k for k in inputs if k in KEYWORD_INPUTS],
            "outputs": ["logits"], "loss": entry.loss, "order": ORDER,
            "conventions": {**entry.conventions(network), "dtype": f"every float array is "
                            f"{dtype.name}; ids int64; masks bool",
                            "act": "act/<module> = the module's forward output; grad_act/"
                                   "<module> = dL/d(that output); <module>#2 = second call"}}
    return Case(meta, arrays)
