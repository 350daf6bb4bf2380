"""Fixtures for attention: torch.nn.functional.scaled_dot_product_attention (every mask, a fully
masked row, grouped-query heads), torch.nn.MultiheadAttention (self and cross, key padding, bool
float and 3-D masks), and a grouped-query attention written after HF Llama's repeat_kv.

Masks are saved with numpy_tf's meaning (bool True = blocked, as nn.MultiheadAttention); the
SDPA wrapper below inverts them, because SDPA's boolean mask means True = allowed.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, generator, meta, normal, randomize, run_module_case, save_case

FILE = "attention.py"


class SDPA(nn.Module):
    """scaled_dot_product_attention with numpy_tf's mask meaning (True = blocked)."""

    def __init__(self, is_causal: bool = False, gqa: bool = False):
        super().__init__()
        self.is_causal, self.gqa = is_causal, gqa

    def forward(self, q, k, v, attn_mask=None, key_padding_mask=None):
        tq, tk = q.shape[-2], k.shape[-2]
        allowed, bias = None, None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                allowed = ~attn_mask
            else:
                bias = attn_mask
        if key_padding_mask is not None:
            keep = ~key_padding_mask[:, None, None, :]
            allowed = keep if allowed is None else allowed & keep
        if self.is_causal:
            causal = torch.ones(tq, tk, dtype=torch.bool).tril()
            allowed = causal if allowed is None else allowed & causal
        if bias is not None and allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf"))
            allowed = None
        mask = bias if bias is not None else allowed
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.gqa)


def repeat_kv(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """(B, G, T, d) -> (B, G * repeats, T, d), each key/value head repeated `repeats` times in a
    row (HF Llama's repeat_kv)."""
    batch, groups, length, width = x.shape
    return x[:, :, None].expand(batch, groups, repeats, length, width).reshape(
        batch, groups * repeats, length, width)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with q_proj/k_proj/v_proj/o_proj and num_kv_heads key/value heads,
    written the way HF Llama's eager attention computes it (without RoPE)."""

    def __init__(self, width, num_heads, num_kv_heads, bias):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = width // num_heads
        self.q_proj = nn.Linear(width, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, width, bias=bias)

    def forward(self, x, key_padding_mask=None):
        batch, length, _ = x.shape
        split = lambda t, h: t.view(batch, length, h, self.head_dim).transpose(1, 2)  # noqa
        q = split(self.q_proj(x), self.num_heads)
        k = repeat_kv(split(self.k_proj(x), self.num_kv_heads), self.num_heads // self.num_kv_heads)
        v = repeat_kv(split(self.v_proj(x), self.num_kv_heads), self.num_heads // self.num_kv_heads)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        blocked = torch.ones(length, length, dtype=torch.bool).triu(1)
        if key_padding_mask is not None:
            blocked = blocked | key_padding_mask[:, None, None, :]
        probs = scores.masked_fill(blocked, float("-inf")).softmax(dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.o_proj(out)


def _save(out_dir, name, kind, seed, dtype, module, config, inputs, keyword=None, call=None,
          forward_kwargs=None, std=0.5):
    g = generator(seed)
    module = randomize(module.to(DTYPES[dtype]), g, dtype, std)
    drawn = {key: value(g) for key, value in inputs.items()}
    keyword = {key: value(g) for key, value in (keyword or {}).items()}
    arrays = run_module_case(module, drawn, g, dtype, call=call, keyword=keyword)
    extra = {"keyword_inputs": list(keyword), "forward_kwargs": forward_kwargs or {},
             "conventions": {"attention": "softmax(q k^T / sqrt(d) + float mask), blocked "
                                          "scores -inf; fully blocked rows give 0"}}
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, kind, seed, dtype, config, list(inputs), **extra), arrays)


def _padding(batch, length, real_lengths):
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, real in enumerate(real_lengths):
        mask[row, real:] = True
    return mask


def _random_blocked(g, shape, p=0.4):
    blocked = torch.rand(shape, generator=g, dtype=torch.float64) < p
    blocked[..., 0] = False     # every query keeps at least key 0
    return blocked


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        x = lambda *shape, std=1.0: (lambda g: normal(g, shape, dtype, std))  # noqa: E731
        const = lambda value: (lambda g: value)  # noqa: E731
        qkv = {"q": x(2, 3, 5, 4), "k": x(2, 3, 5, 4), "v": x(2, 3, 5, 4)}
        sdpa = lambda causal, gqa=False: (SDPA(causal, gqa), {"is_causal": causal})  # noqa
        for index, (name, (module, config), inputs, keyword) in enumerate([
                ("sdpa_causal", sdpa(True), qkv, {}),
                ("sdpa_bool_mask", sdpa(False), qkv,
                 {"attn_mask": lambda g: _random_blocked(g, (2, 1, 5, 5)),
                  "key_padding_mask": const(_padding(2, 5, [5, 3]))}),
                ("sdpa_float_mask", sdpa(True), qkv, {"attn_mask": x(5, 5, std=2.0)}),
                ("sdpa_cross", sdpa(False), {"q": x(2, 2, 3, 4), "k": x(2, 2, 6, 4),
                                             "v": x(2, 2, 6, 3)},
                 {"key_padding_mask": const(_padding(2, 6, [6, 2]))}),
                ("sdpa_fully_masked", sdpa(False), qkv,
                 {"attn_mask": const(torch.zeros(5, 5, dtype=torch.bool).index_fill(0, torch.tensor([1]), True)),
                  "key_padding_mask": const(_padding(2, 5, [5, 0]))}),
                ("sdpa_gqa", sdpa(True, gqa=True), {"q": x(2, 4, 5, 4), "k": x(2, 2, 5, 4),
                                                    "v": x(2, 2, 5, 4)}, {})]):
            paths.append(_save(out_dir, name, "sdpa", 20 + index, dtype, module, config,
                               inputs, keyword))

        def mha_call(module, query, key, value, **masks):
            return module(query, key, value, need_weights=False, **masks)[0]

        for index, (name, config, lengths, keyword) in enumerate([
                ("mha_self", {"embed_dim": 8, "num_heads": 2, "bias": True}, (5, 5),
                 {"key_padding_mask": const(_padding(2, 5, [5, 4])),
                  "attn_mask": const(torch.ones(5, 5, dtype=torch.bool).triu(1))}),
                ("mha_cross", {"embed_dim": 8, "num_heads": 4, "bias": True}, (4, 6),
                 {"key_padding_mask": const(_padding(2, 6, [6, 3]))}),
                ("mha_float_mask", {"embed_dim": 6, "num_heads": 3, "bias": False}, (4, 5),
                 {"attn_mask": x(4, 5, std=1.5)}),
                ("mha_3d_mask", {"embed_dim": 8, "num_heads": 2, "bias": True}, (5, 5),
                 {"attn_mask": lambda g: _random_blocked(g, (4, 5, 5))})]):
            tq, tk = lengths
            e = config["embed_dim"]
            inputs = {"query": x(2, tq, e), "key": x(2, tk, e)}
            if tq == tk and name == "mha_self":
                shared = {}
                inputs = {"query": lambda g: shared.setdefault("x", normal(g, (2, tq, e), dtype)),
                          "key": lambda g: shared["x"], "value": lambda g: shared["x"]}
            else:
                inputs["value"] = x(2, tk, e)
            module = nn.MultiheadAttention(e, config["num_heads"], bias=config["bias"],
                                           batch_first=True)
            paths.append(_save(out_dir, name, "multihead_attention", 40 + index, dtype,
                               module, {**config, "dropout": 0.0, "batch_first": True}, inputs,
                               keyword, call=mha_call))

        for index, (name, heads, kv_heads, bias) in enumerate([
                ("gqa_kv2", 4, 2, False), ("gqa_mqa", 4, 1, True), ("gqa_mha", 4, 4, False)]):
            module = GroupedQueryAttention(16, heads, kv_heads, bias)
            config = {"width": 16, "num_heads": heads, "num_kv_heads": kv_heads, "bias": bias}
            paths.append(_save(out_dir, name, "gqa_attention", 60 + index, dtype, module,
                               config, {"x": x(2, 5, 16)},
                               {"key_padding_mask": const(_padding(2, 5, [5, 3]))},
                               forward_kwargs={"is_causal": True}))
    return paths
