"""One table of numpy_tf's pure layer functions, shared by grade, assignment, explain and the
gradcheck command.

For every family `<name>` the table knows the pair `<name>_forward(...) -> (out, cache)` /
`<name>_backward(dout, cache)`, the cache NamedTuple, what the backward returns (`grads`: the
forward argument each returned gradient belongs to, in order), how to draw the forward's
keyword arguments for a shape (`build(g, shape, dtype, **options)`), the layer's edge cases
(T = 1, size-1 axes, fully masked attention rows, repeated embedding ids, ignored targets, rows
of near-zero variance, ...) and the definitions a student is given in place of the derivation.

The inputs are drawn by numpy_tf.layer_inputs. An input named `rng` holds a seed, and
`LayerSpec.call` gives every call a fresh Generator from it, so dropout draws the same mask each
time and can be checked numerically.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import numpy as np

from ..checking.finite_differences import GradcheckReport, gradcheck
from ..layers import (activations, attention, cross_entropy_loss, dropout, embedding,
                      flash_attention, linear, mlp, moe, norm, positions, rope, softcap,
                      softmax)
from ..models import cbow
from . import layer_inputs as draw


@dataclass(frozen=True)
class EdgeCase:
    name: str
    shape: tuple
    options: dict = field(default_factory=dict)
    finite_differences: bool = True     # False where a gradient is zero by definition


@dataclass(frozen=True)
class LayerSpec:
    name: str
    module: ModuleType
    cache: type | None
    grads: tuple[str, ...]              # the forward argument of each returned gradient
    build: Callable[..., dict]          # build(g, shape, dtype, **options) -> forward kwargs
    legend: str                         # what --shape means
    cases: tuple[EdgeCase, ...]
    definitions: str                    # a backward's docstring in an assignment

    @property
    def forward(self) -> Callable:
        return getattr(self.module, f"{self.name}_forward")

    @property
    def backward(self) -> Callable:
        return getattr(self.module, f"{self.name}_backward")

    def inputs(self, shape, dtype=np.float64, seed: int = 0, **options) -> dict:
        return self.build(np.random.default_rng(seed), tuple(shape), np.dtype(dtype), **options)

    def case_inputs(self, case: EdgeCase, dtype=np.float64, seed: int = 0) -> dict:
        return self.inputs(case.shape, dtype, seed, **case.options)

    def differentiable(self, inputs: dict) -> list[str]:
        return [name for name in self.grads if inputs.get(name) is not None]

    @staticmethod
    def call(function: Callable, inputs: dict):
        """function(**inputs), with a seed under `rng` turned into a fresh Generator."""
        return function(**{key: np.random.default_rng(value) if key == "rng" and
                           isinstance(value, int) else value for key, value in inputs.items()})


def _case(name, shape, finite_differences=True, **options) -> EdgeCase:
    return EdgeCase(name, shape, options, finite_differences)


_SOFTMAX_CASES = (_case("rows of 5", (2, 3, 5)), _case("over axis 0", (4, 3), axis=0),
                  _case("a size-1 axis (the gradient is zero)", (3, 1)),
                  _case("large logits (scale 20)", (2, 6), scale=20.0))

LAYERS: dict[str, LayerSpec] = {spec.name: spec for spec in [
    LayerSpec("linear", linear, linear.LinearCache, ("x", "weight", "bias"), draw.linear,
              "x (..., IN)", (_case("with bias", (2, 3, 4)),
                              _case("no bias", (2, 3, 4), bias=False),
                              _case("T=1, one feature, one output", (1, 1, 1), out_features=1),
                              _case("one vector x (IN,)", (4,))),
              "y = x W^T + b, x (..., IN), W (OUT, IN), b (OUT,) -> y (..., OUT).\n"
              "Return (dx, dweight, dbias), shaped like x, W and b; dbias is None without a bias."),
    LayerSpec("embedding", embedding, embedding.EmbeddingCache, ("weight",), draw.embedding,
              "ids (...)", (_case("ids (2, 3)", (2, 3)),
                            _case("every id the same: the row's gradients add up", (2, 4),
                                  repeated=True),
                            _case("padding_idx among the ids", (2, 4), False, padding_idx=0),
                            _case("one token", (1, 1))),
              "out[n] = W[ids[n]], ids (...) integers in [0, V), W (V, D) -> out (..., D).\n"
              "Return dweight (V, D); the padding_idx row (if any) gets no gradient, as in torch."),
    LayerSpec("relu", activations, activations.ReLUCache, ("x",), draw.away_from_zero, "x (...)",
              (_case("x (2, 3, 4)", (2, 3, 4)), _case("one element", (1, 1, 1)),
               _case("all negative", (3, 4), sign=-1.0)),
              "y = max(x, 0) elementwise. Return dx, shaped like x (0 at x = 0, as torch)."),
    LayerSpec("gelu", activations, activations.GELUCache, ("x",), draw.elementwise, "x (...)",
              (_case("exact (erf)", (2, 3, 4)), _case("tanh approximation", (2, 3, 4),
                                                     approximate="tanh"),
               _case("tails, |x| up to ~20", (3, 5), scale=8.0),
               _case("tanh tails", (3, 5), scale=8.0, approximate="tanh"),
               _case("one element", (1,))),
              "approximate='none': y = x Phi(x), Phi the standard normal CDF.\n"
              "approximate='tanh': y = x (1 + tanh(u)) / 2, u = sqrt(2/pi) (x + 0.044715 x^3).\n"
              "Return dx, the exact derivative of the variant that ran forward."),
    LayerSpec("silu", activations, activations.SiLUCache, ("x",), draw.elementwise, "x (...)",
              (_case("x (2, 3, 4)", (2, 3, 4)), _case("large |x| (scale 30)", (3, 5), scale=30.0),
               _case("one element", (1,))),
              "y = x sigma(x), sigma(x) = 1 / (1 + exp(-x)). Return dx, shaped like x."),
    LayerSpec("softcap", softcap, softcap.SoftCapCache, ("x",), draw.elementwise, "x (...)",
              (_case("cap 2", (2, 3, 4), cap=2.0),
               _case("far beyond the cap (|x| up to ~60, cap 1.5)", (3, 5), scale=20.0,
                     cap=1.5),
               _case("one element, cap 30", (1,), cap=30.0)),
              "y = c tanh(x / c) elementwise, c > 0 (Gemma2's soft-capping).\n"
              "Return dx, shaped like x."),
    LayerSpec("softmax", softmax, softmax.SoftmaxCache, ("x",), draw.elementwise, "x (...)",
              _SOFTMAX_CASES,
              "p_i = exp(x_i) / sum_j exp(x_j) along `axis`. Return dx, shaped like x."),
    LayerSpec("log_softmax", softmax, softmax.LogSoftmaxCache, ("x",), draw.elementwise, "x (...)",
              _SOFTMAX_CASES,
              "y_i = x_i - log sum_j exp(x_j) along `axis`. Return dx, shaped like x."),
    LayerSpec("cross_entropy", cross_entropy_loss, cross_entropy_loss.CrossEntropyCache, ("logits",),
              draw.cross_entropy,
              "logits (..., C)",
              (_case("mean over (2, 3) positions, 5 classes", (2, 3, 5)),
               _case("some targets ignored", (2, 4, 5), ignored=3),
               _case("every target ignored (loss 0, zero gradient)", (2, 3, 4), ignored="all"),
               _case("label smoothing 0.1, reduction sum", (3, 5), label_smoothing=0.1,
                     reduction="sum"),
               _case("reduction none", (4, 3), ignored=1, reduction="none"),
               _case("large logits (scale 30)", (2, 6), scale=30.0),
               _case("one position, one class", (1, 1))),
              "For a kept position with l = log_softmax(z), target y, smoothing e, C classes:\n"
              "loss = -(1 - e) l_y - (e / C) sum_c l_c; ignored targets contribute nothing;\n"
              "'mean' divides the sum by the number of kept targets (0 if none), 'sum' does\n"
              "not, 'none' keeps one loss per position. dloss is the upstream gradient of the\n"
              "loss (0-d, or per position for 'none'). Return dlogits, shaped like the logits."),
    LayerSpec("dropout", dropout, dropout.DropoutCache, ("x",), draw.elementwise, "x (...)",
              (_case("p = 0.5, training", (2, 3, 4), p=0.5, rng=3, training=True),
               _case("p = 0 (nothing dropped)", (2, 3), p=0.0, rng=3, training=True),
               _case("eval mode (the identity)", (2, 3), p=0.5, rng=3, training=False),
               _case("one element", (1,), p=0.3, rng=5, training=True)),
              "y = x m, with the mask m (0 or 1 / (1 - p)) drawn by the forward (None when\n"
              "nothing was dropped). Return dx, shaped like x."),
    LayerSpec("attention", attention, attention.AttentionCache, ("q", "k", "v"), draw.attention,
              "q (B, H, Tq, d)",
              (_case("causal self-attention", (2, 2, 4, 3), causal=True),
               _case("grouped-query: 4 heads, 2 key/value heads, Tq=3, Tk=5, dv=3", (1, 4, 3, 2),
                     kv_heads=2, keys=5, value_dim=3),
               _case("a fully masked query row (zero output and gradient)", (1, 2, 3, 2),
                     mask="blocked row"),
               _case("key padding, one sequence all padding", (2, 1, 3, 2),
                     padding="one sequence all padding"),
               _case("float mask added to the scores", (2, 2, 3, 4), mask="float"),
               _case("one query, one key (T=1)", (1, 1, 1, 2)),
               _case("dropout on the probabilities", (1, 2, 3, 2), dropout_p=0.3),
               _case("causal, sliding window of 2", (2, 2, 5, 3), causal=True, window=2),
               _case("soft-capped scores (cap 0.5)", (1, 2, 4, 3), causal=True,
                     softcap=0.5)),
              "S = scale q k^T + M (scale = 1/sqrt(d), M the float mask), S = -inf where blocked,\n"
              "P = softmax(S) over the keys (a fully blocked row gives P = 0), out = (P m) v\n"
              "with the dropout mask m (or P v). Key/value head j serves query heads j r ..\n"
              "j r + r - 1, r = H / G. q (B, H, Tq, d), k (B, G, Tk, d), v (B, G, Tk, dv).\n"
              "A window W also blocks keys j <= i + offset - W; a soft cap c makes the scaled\n"
              "scores c tanh(scale q k^T / c) before M is added.\n"
              "Return (dq, dk, dv), shaped like q, k and v."),
    LayerSpec("flash_attention", flash_attention, flash_attention.FlashAttentionCache,
              ("q", "k", "v"), draw.flash_attention, "q (B, H, Tq, d)",
              (_case("causal, tiles of 2 queries by 3 keys that do not divide T = 5",
                     (2, 2, 5, 3), causal=True, block_q=2, block_k=3),
               _case("causal offset 2 (a KV cache of 2 before 3 new queries), tiles of 1 by 2",
                     (1, 2, 3, 2), causal=True, keys=5, causal_offset=2, block_q=1, block_k=2),
               _case("tiles of one query by one key, a float mask", (1, 2, 3, 2), mask="float",
                     block_q=1, block_k=1),
               _case("grouped-query: 4 heads, 2 key/value heads, Tk=5, dv=3", (1, 4, 3, 2),
                     kv_heads=2, keys=5, value_dim=3, block_q=2, block_k=2),
               _case("a fully masked query row (zero output and gradient)", (1, 2, 3, 2),
                     mask="blocked row", block_q=2, block_k=2),
               _case("key padding, one sequence all padding", (2, 1, 3, 2),
                     padding="one sequence all padding", block_q=2, block_k=2),
               _case("one tile holds everything (64 by 64)", (2, 2, 4, 3), causal=True,
                     block_q=64, block_k=64)),
              "The output is attention's: S = scale q k^T + M (scale = 1/sqrt(d)), S = -inf\n"
              "where blocked, P = softmax(S) over the keys, out = P v; key/value head j serves\n"
              "query heads j r .. j r + r - 1. The forward works tile by tile (block_q queries\n"
              "by block_k keys) with an online softmax and keeps only out and the row\n"
              "logsumexp L = log sum_j exp(S_ij) (+inf for a fully masked row).\n"
              "Work tile by tile too: P_ij = exp(S_ij - L_i), D = rowsum(dout * out).\n"
              "Return (dq, dk, dv), shaped like q, k and v (a fully masked row: zeros)."),
    LayerSpec("layernorm", norm, norm.LayerNormCache, ("x", "weight", "bias"), draw.row_norm,
              "x (..., C)",
              (_case("x (2, 3, 5)", (2, 3, 5)), _case("T=1", (1, 1, 4)),
               _case("C=1 (x_hat is 0)", (2, 3, 1)),
               _case("rows of near-zero variance", (2, 2, 6), special_rows=True),
               _case("no weight, no bias", (2, 3, 4), weight=False, bias=False),
               _case("weight, no bias", (2, 4), bias=False)),
              "Over the last axis (C features): mean = (1/C) sum_j x_j,\n"
              "var = (1/C) sum_j (x_j - mean)^2, inv_std = (var + eps)^(-1/2),\n"
              "x_hat_i = (x_i - mean) inv_std, out_i = w_i x_hat_i + b_i.\n"
              "Return (dx, dweight, dbias); dweight / dbias are None without a weight / bias."),
    LayerSpec("rmsnorm", norm, norm.RMSNormCache, ("x", "weight"), draw.row_norm, "x (..., C)",
              (_case("x (2, 3, 5)", (2, 3, 5), rms=True, eps=1e-6),
               _case("rows of zeros", (2, 2, 4), rms=True, special_rows=True, eps=1e-6),
               _case("no weight", (2, 4), rms=True, weight=False, eps=1e-5),
               _case("C=1", (3, 1), rms=True, eps=1e-6), _case("T=1", (1, 1, 3), rms=True,
                                                               eps=1e-6),
               _case("Gemma's unit offset (scale 1 + w)", (2, 3, 5), rms=True, eps=1e-6,
                     unit_offset=True)),
              "Over the last axis: inv_rms = ((1/C) sum_j x_j^2 + eps)^(-1/2),\n"
              "x_hat_i = x_i inv_rms, out_i = w_i x_hat_i (unit_offset: (1 + w_i) x_hat_i).\n"
              "Return (dx, dweight); dweight is None without a weight."),
    LayerSpec("learned_positions", positions, positions.LearnedPositionsCache, ("x", "weight"),
              draw.learned_positions, "x (B, T, C)",
              (_case("x (2, 3, 4)", (2, 3, 4)), _case("offset 2", (2, 3, 4), offset=2),
               _case("T = max_context", (1, 6, 2)), _case("T=1 at the last row", (1, 1, 3),
                                                          offset=5)),
              "out[b, t] = x[b, t] + W[offset + t], W (max_context, C).\n"
              "Return (dx, dweight), shaped like x and W."),
    LayerSpec("sinusoidal_positions", positions, positions.SinusoidalPositionsCache, ("x",),
              draw.elementwise, "x (B, T, C)",
              (_case("x (2, 3, 4)", (2, 3, 4)), _case("offset 5", (1, 2, 6), offset=5)),
              "out = x + PE[offset : offset + T], PE a fixed table. Return dx, shaped like x."),
    LayerSpec("rope", rope, rope.RoPECache, ("x",), draw.rope, "x (B, H, T, D)",
              (_case("halves (HF Llama)", (2, 2, 3, 4)),
               _case("interleaved pairs (Meta Llama)", (2, 2, 3, 4), interleaved=True),
               _case("positions per sequence (B, T)", (2, 1, 3, 4), per_batch=True),
               _case("T=1, D=2, at position 100", (1, 1, 1, 2), offset=100)),
              "Each pair (a_i, b_i) of x's D features at position p is rotated by theta =\n"
              "p base^(-2i/D): a' = a cos(theta) - b sin(theta),\n"
              "b' = a sin(theta) + b cos(theta);\n"
              "pairs are (x_2i, x_2i+1) if interleaved, else (x_i, x_i+D/2). Return dx."),
    LayerSpec("partial_rope", rope, rope.PartialRoPECache, ("x",), draw.partial_rope,
              "x (B, H, T, D)",
              (_case("a quarter of D = 8 (Pythia)", (2, 2, 3, 8), rotary_dim=2),
               _case("half, per-sequence positions", (2, 1, 3, 8), rotary_dim=4,
                     per_batch=True),
               _case("all of D: RoPE itself", (1, 2, 3, 4), rotary_dim=4),
               _case("interleaved pairs", (1, 2, 3, 8), rotary_dim=4, interleaved=True)),
              "The first R = rotary_dim features of x are rotated as RoPE over a head of\n"
              "width R (theta = p base^(-2i/R) for pair i); features R .. D-1 pass through\n"
              "unchanged. Return dx."),
    LayerSpec("swiglu_gate", mlp, mlp.GateCache, ("gate", "up"), draw.gate,
              "gate (..., F)",
              (_case("(2, 3, 4)", (2, 3, 4)), _case("large gate values", (3, 4), scale=20.0),
               _case("one element", (1,)),
               _case("GeGLU: the tanh GELU as the gate", (2, 3, 4), activation="gelu_tanh")),
              "h = act(g) * u elementwise, act(g) = silu(g) = g sigma(g) (activation='silu')\n"
              "or the tanh GELU (activation='gelu_tanh'): g (1 + tanh(u)) / 2,\n"
              "u = sqrt(2/pi) (g + 0.044715 g^3). Return (dgate, dup), shaped like g and u."),
    LayerSpec("swiglu", mlp, mlp.SwiGLUCache,
              ("x", "gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias",
               "down_bias"), draw.swiglu, "x (..., C)",
              (_case("x (2, 3, 4), F = 6", (2, 3, 4)), _case("with biases", (2, 3, 4), bias=True),
               _case("T=1", (1, 1, 3)), _case("hidden width 1", (2, 3), hidden=1),
               _case("GeGLU (the tanh GELU gate)", (2, 3, 4), activation="gelu_tanh")),
              "y = W_down (act(W_gate x + b_gate) * (W_up x + b_up)) + b_down, act = silu\n"
              "(activation='silu') or the tanh GELU ('gelu_tanh');\n"
              "W_gate, W_up (F, C), W_down (C, F), optional biases (F,), (F,), (C,).\n"
              "Return (dx, dgate_weight, dup_weight, ddown_weight, dgate_bias, dup_bias,\n"
              "ddown_bias); a bias gradient is None where the forward had no bias."),
    LayerSpec("moe", moe, moe.MoECache,
              ("x", "router_weight", "gate_weights", "up_weights", "down_weights"), draw.moe,
              "x (..., C)",
              (_case("x (2, 3, 4), top-2 of 4 experts", (2, 3, 4)),
               _case("top-1", (2, 3, 4), top_k=1),
               _case("every expert (top-k = E)", (3, 4), experts=3, top_k=3),
               _case("one token", (1, 3))),
              "z = W_router x (E), p = softmax(z), S = the top_k experts of largest p,\n"
              "w_j = p[S_j] / sum_i p[S_i], y = sum_j w_j SwiGLU_{S_j}(x) with\n"
              "SwiGLU_e(x) = W_down[e] (silu(W_gate[e] x) * (W_up[e] x)); W_router (E, C),\n"
              "W_gate, W_up (E, F, C), W_down (E, C, F). S is piecewise constant (no\n"
              "gradient). Return (dx, drouter_weight, dgate_weights, dup_weights,\n"
              "ddown_weights)."),
    LayerSpec("load_balancing_loss", moe, moe.LoadBalancingCache, ("router_logits",),
              draw.load_balancing_loss, "router_logits (L, N, E)",
              (_case("3 layers, 5 tokens, top-2 of 4", (3, 5, 4)),
               _case("padding", (2, 6, 4), padded=True),
               _case("top-1, one layer", (1, 4, 3), top_k=1)),
              "m_t = 0 at padding, else 1; R = L sum_t m_t; p_lt = softmax(z_lt);\n"
              "f_e = sum_{l,t} m_t [e in top_k(p_lt)] / R (no gradient);\n"
              "P_e = sum_{l,t} m_t p_lte / R; aux = E sum_e f_e P_e. Return dz (L, N, E)."),
    LayerSpec("cbow", cbow, cbow.CBOWMeanCache, ("weight",), draw.cbow, "contexts (N, 2c)",
              (_case("4 rows of 4 context words", (4, 4)),
               _case("a word twice in each context", (3, 4), repeated=True),
               _case("one row, one context word", (1, 1))),
              "h_n = (1 / 2c) sum_j E[contexts[n, j]], contexts (N, 2c) ids, E (V, D) ->\n"
              "h (N, D). Return dweight (V, D)."),
]}


# What the grader tries beyond the named edge cases: every combination of these values of a
# layer's options (its forward's every argument at a non-default value somewhere), at one
# shape, with inputs large enough that a naive exp overflows (softmax, log_softmax and cross
# entropy at logits of ~1000, SiLU and the SwiGLU gate at ~500, GELU at ~100).
_ATTENTION_GRID = {"mask": (None, "blocked row", "float"),
                   "padding": (None, "one sequence all padding"),
                   "causal": (False, True), "causal_offset": (0, 2), "scale": (None, 0.7),
                   "kv_heads": (2,)}           # grouped-query throughout (4 heads, 2 groups)
GRIDS: dict[str, tuple[tuple, dict]] = {
    "linear": ((2, 3, 4), {"bias": (True, False), "out_features": (1, 5)}),
    "embedding": ((2, 4), {"padding_idx": (None, 0, 5), "repeated": (False, True)}),
    "relu": ((3, 4), {"sign": (None, -1.0, 1.0)}),
    "gelu": ((3, 5), {"approximate": ("none", "tanh"), "scale": (1.0, 8.0, 100.0)}),
    "silu": ((3, 5), {"scale": (1.0, 30.0, 500.0)}),
    "softmax": ((2, 3, 4), {"axis": (-1, 0, 1, -2), "scale": (1.0, 1000.0)}),
    "log_softmax": ((2, 3, 4), {"axis": (-1, 0, 1, -2), "scale": (1.0, 1000.0)}),
    "cross_entropy": ((2, 4, 5), {"reduction": ("mean", "sum", "none"),
                                  "label_smoothing": (0.0, 0.1), "ignored": (0, 3, "all"),
                                  "ignore_index": (-100, 2), "scale": (1.0, 1000.0)}),
    "dropout": ((2, 3, 4), {"p": (0.0, 0.3, 0.9), "training": (True, False), "rng": (3,)}),
    "attention": ((2, 4, 3, 2), {**_ATTENTION_GRID, "keys": (5,), "dropout_p": (0.0, 0.3)}),
    "flash_attention": ((2, 4, 3, 2), {**_ATTENTION_GRID, "keys": (5,),
                                       "tiles": ((2, 3), (64, 64))}),
    "layernorm": ((2, 3, 5), {"weight": (True, False), "bias": (True, False),
                              "eps": (1e-5, 0.1), "special_rows": (False, True)}),
    "rmsnorm": ((2, 3, 4), {"weight": (True, False), "eps": (1e-5, 1e-6, 0.1),
                            "special_rows": (False, True), "unit_offset": (False, True),
                            "rms": (True,)}),
    "learned_positions": ((2, 3, 4), {"offset": (0, 1, 3)}),
    "sinusoidal_positions": ((2, 3, 4), {"offset": (0, 7)}),
    "rope": ((2, 2, 3, 4), {"interleaved": (False, True), "base": (10000.0, 100.0),
                            "per_batch": (False, True), "offset": (0, 50)}),
    "softcap": ((3, 5), {"cap": (0.5, 2.0, 50.0), "scale": (1.0, 30.0, 500.0)}),
    "partial_rope": ((2, 2, 3, 8), {"rotary_dim": (2, 4, 8), "interleaved": (False, True),
                                    "per_batch": (False, True), "offset": (0, 50),
                                    "base": (10000.0, 100.0)}),
    "moe": ((2, 3, 4), {"top_k": (1, 2, 4), "hidden": (1, 3)}),
    "load_balancing_loss": ((3, 5, 4), {"top_k": (1, 2, 4), "padded": (False, True),
                                        "scale": (1.0, 1000.0)}),
    "swiglu_gate": ((3, 4), {"scale": (1.0, 20.0, 500.0), "activation": ("silu", "gelu_tanh")}),
    "swiglu": ((2, 3, 4), {"bias": (False, ("gate",), ("up",), ("down",), True),
                           "hidden": (1, 6), "activation": ("silu", "gelu_tanh")}),
    "cbow": ((4, 4), {"repeated": (False, True)}),
}


def grading_cases(spec: LayerSpec) -> tuple[EdgeCase, ...]:
    """The named edge cases, then every combination of GRIDS[spec.name] (named by their
    options; checked against numpy_tf's backward, which finite differences check on the
    named cases)."""
    if spec.name not in GRIDS:
        return spec.cases
    shape, grid = GRIDS[spec.name]
    combinations = []
    for values in itertools.product(*grid.values()):
        options = dict(zip(grid, values))
        if options.get("causal_offset") and not options.get("causal"):
            continue                            # the offset only moves the causal mask
        name = ", ".join(f"{key}={value!r}" for key, value in options.items()
                         if len(grid[key]) > 1)
        combinations.append(EdgeCase(name, shape, options, False))
    return spec.cases + tuple(combinations)


def layer(name: str) -> LayerSpec:
    """The table's entry for `name`; a ValueError lists the known layers."""
    if name not in LAYERS:
        raise ValueError(f"unknown layer {name!r}; known layers: {', '.join(LAYERS)}")
    return LAYERS[name]


def gradient_dict(spec: LayerSpec, grads) -> dict:
    """{forward argument: gradient} of what a backward returned (None entries dropped)."""
    grads = grads if isinstance(grads, (tuple, list)) else (grads,)
    return {name: g for name, g in zip(spec.grads, grads) if g is not None}


def check_layer(name: str, inputs: dict, seed: int = 0, title: str | None = None
                ) -> GradcheckReport:
    """numpy_tf's own backward of `name` against finite differences of its forward at `inputs`
    (copied to float64 by gradcheck)."""
    spec = layer(name)
    return gradcheck(lambda **kw: spec.call(spec.forward, kw),
                     lambda dout, cache: gradient_dict(spec, spec.backward(dout, cache)),
                     inputs, wrt=spec.differentiable(inputs), seed=seed, title=title or name)


def check_shape(spec: LayerSpec, shape: tuple) -> tuple:
    """`shape` as the legend asks ("x (B, T, C)": three sizes; "x (..., C)": at least one)."""
    axes = [axis.strip() for axis in spec.legend.split("(", 1)[1].rstrip(")").split(",")]
    named = [axis for axis in axes if axis and axis != "..."]
    exact = "..." not in axes
    if (exact and len(shape) != len(named)) or len(shape) < len(named) or \
            any(size < 1 for size in shape):
        raise ValueError(f"the shape of {spec.legend} must be {len(named)}"
                         f"{'' if exact else ' or more'} positive sizes; got {tuple(shape)}")
    return tuple(shape)


def dtype_problems(spec: LayerSpec, inputs: dict) -> list[str]:
    """Run numpy_tf's forward and backward in the inputs' own dtype: what did not keep it."""
    dtype = next(value.dtype for value in inputs.values()
                 if isinstance(value, np.ndarray) and value.dtype.kind == "f")
    out, cache = spec.call(spec.forward, inputs)
    dout = np.random.default_rng(0).standard_normal(np.shape(out)).astype(dtype)
    arrays = {"out": out, **{f"d{name}": g for name, g in
                             gradient_dict(spec, spec.backward(dout, cache)).items()}}
    return [f"{name} is {array.dtype}, not {dtype}" for name, array in arrays.items()
            if array.dtype != dtype]


def gradcheck_layer(name: str, shape: tuple | None = None, dtype="float64", case: int = 0,
                    seed: int = 0) -> tuple[GradcheckReport, list[str]]:
    """What `numpy-tf gradcheck` runs: edge case number `case` of the layer (its options; its
    shape unless `shape` is given), inputs drawn in `dtype`, then (report of the float64 finite
    difference check, dtype_problems in `dtype`). Bad arguments: ValueError."""
    spec = layer(name)
    if not 0 <= case < len(spec.cases):
        raise ValueError(f"case must be in [0, {len(spec.cases)}) for {spec.name}: "
                         + "; ".join(f"{i} {c.name}" for i, c in enumerate(spec.cases)))
    edge = spec.cases[case]
    shape = edge.shape if shape is None else check_shape(spec, shape)
    inputs = spec.inputs(shape, dtype, seed, **edge.options)
    problems = dtype_problems(spec, inputs)
    title = f"{spec.name} ({edge.name}), {spec.legend.split()[0]} {shape}, {np.dtype(dtype)}"
    return check_layer(spec.name, inputs, seed, title), problems
