"""Fixtures for the encoder-decoder Transformer: torch.nn.Transformer(batch_first=True) itself,
Post-LN and Pre-LN, ReLU and GELU, with key padding on both sides, the causal target mask, the
memory padding mask, every other mask (float, per-head 3-D, memory_mask), a left-padded target
(fully masked query rows: torch's SDPA path gives them a zero attention output, no NaN), and a
sequence-to-sequence model around it (embeddings, sinusoidal positions, nn.Transformer, an
output head) with its teacher-forced cross-entropy.

Weights are spread wider than torch's initialisation (LayerNorm weights around 1) so attention
is far from uniform. Dropout is 0 and the modules stay in training mode with gradients on, so
torch takes its standard path (not the inference-only nested-tensor fast path).
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, generator, meta, normal, run_module_case, save_case, to_numpy
from gpt import spread_weights
from positions import SinusoidalPositions

FILE = "transformer.py"
SMALL = {"d_model": 8, "nhead": 2, "num_encoder_layers": 2, "num_decoder_layers": 2,
         "dim_feedforward": 16, "dropout": 0.0, "batch_first": True}


def padding(real_lengths, length, left=False):
    """(B, length) bool, True at padding: after the real tokens, or before them (left)."""
    mask = torch.zeros(len(real_lengths), length, dtype=torch.bool)
    for row, real in enumerate(real_lengths):
        if left:
            mask[row, :length - real] = True
        else:
            mask[row, real:] = True
    return mask


def causal(length):
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def per_head_mask(g, batch_heads, length):
    """(B * H, T, T) bool: causal, plus random blocks; each query keeps its own position."""
    blocked = torch.rand(batch_heads, length, length, generator=g, dtype=torch.float64) < 0.3
    blocked |= causal(length)
    blocked &= ~torch.eye(length, dtype=torch.bool)
    return blocked


def memory_mask(g, targets, sources):
    """(T, S) bool with random blocks; every query keeps source position 0."""
    blocked = torch.rand(targets, sources, generator=g, dtype=torch.float64) < 0.3
    blocked[:, 0] = False
    return blocked


def quietly(build):
    """build() without torch's notices (the nested-tensor fast path being off; bool key padding
    next to a float mask), which say nothing about the numbers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def transformer_case(out_dir, name, seed, dtype, config, masks, batch=2, sources=5, targets=4):
    """nn.Transformer(**config) with spread weights; src (B, S, C) and tgt (B, T, C) normal;
    `masks(g)` gives the keyword masks, saved with the case."""
    g = generator(seed)
    module = quietly(lambda: nn.Transformer(**config).to(DTYPES[dtype]))
    spread_weights(module, g, dtype, std=0.4)
    width = config["d_model"]
    inputs = {"src": normal(g, (batch, sources, width), dtype),
              "tgt": normal(g, (batch, targets, width), dtype)}
    keyword = masks(g)
    arrays = quietly(lambda: run_module_case(module, inputs, g, dtype, keyword=keyword))
    extra = {"keyword_inputs": list(keyword),
             "conventions": {"masks": "bool True = blocked, float added; key padding True at "
                                      "padding", "fully_masked_rows": "zero attention output"}}
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "transformer", seed, dtype, config, list(inputs), level="model",
                          **extra), arrays)


class Seq2Seq(nn.Module):
    """Token embeddings (times sqrt(d_model) if scale_embeddings), sinusoidal positions,
    nn.Transformer with a causal target mask and the source padding as the memory's, and an
    output head to the target vocabulary."""

    def __init__(self, src_vocab_size, tgt_vocab_size, d_model, scale_embeddings, **kwargs):
        super().__init__()
        self.scale = math.sqrt(d_model) if scale_embeddings else 1.0
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        self.positions = SinusoidalPositions(d_model)
        self.transformer = nn.Transformer(d_model=d_model, batch_first=True, **kwargs)
        self.output = nn.Linear(d_model, tgt_vocab_size)

    def forward(self, src_ids, tgt_ids, src_key_padding_mask, tgt_key_padding_mask):
        x = self.positions(self.src_embedding(src_ids) * self.scale, 0)
        y = self.positions(self.tgt_embedding(tgt_ids) * self.scale, 0)
        h = self.transformer(x, y, tgt_mask=causal(tgt_ids.shape[1]),
                             src_key_padding_mask=src_key_padding_mask,
                             tgt_key_padding_mask=tgt_key_padding_mask,
                             memory_key_padding_mask=src_key_padding_mask)
        return self.output(h)


def digit_reversal(g, lengths, max_length):
    """The digit-reversal task (digits 0-9, PAD 10, BOS 11, EOS 12): source, decoder input
    BOS + reversed digits, target reversed digits + EOS (-100 at padding), and both masks."""
    count = len(lengths)
    digits = torch.randint(0, 10, (count, max_length), generator=g)
    source = torch.full((count, max_length), 10)
    decoder_input = torch.full((count, max_length + 1), 10)
    decoder_input[:, 0] = 11
    target = torch.full((count, max_length + 1), -100)
    for row, length in enumerate(lengths):
        source[row, :length] = digits[row, :length]
        reversed_digits = digits[row, :length].flip(0)
        decoder_input[row, 1:length + 1] = reversed_digits
        target[row, :length] = reversed_digits
        target[row, length] = 12
    return (source, decoder_input, target, padding(lengths, max_length),
            padding([length + 1 for length in lengths], max_length + 1))


def seq2seq_case(out_dir, name, seed, dtype, config):
    g = generator(seed)
    model = quietly(lambda: Seq2Seq(**config).to(DTYPES[dtype]))
    spread_weights(model, g, dtype, std=0.4)
    source, decoder_input, target, source_padding, target_padding = digit_reversal(g, [4, 2], 4)
    logits = model(source, decoder_input, source_padding, target_padding)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=-100)
    loss.backward()
    arrays = {f"param/{key}": to_numpy(p) for key, p in model.state_dict().items()}
    for key, value in [("src_ids", source), ("tgt_ids", decoder_input), ("target", target),
                       ("src_key_padding_mask", source_padding),
                       ("tgt_key_padding_mask", target_padding)]:
        arrays[f"input/{key}"] = to_numpy(value)
    arrays["output/logits"] = to_numpy(logits)
    arrays["loss"] = to_numpy(loss)
    for key, parameter in model.named_parameters():
        arrays[f"grad/{key}"] = to_numpy(parameter.grad)
    extra = {"keyword_inputs": ["src_key_padding_mask", "tgt_key_padding_mask"],
             "conventions": {"loss": "mean cross-entropy of target given BOS + target "
                                     "(teacher forcing), -100 ignored",
                             "positions": "sinusoidal, added after the (scaled) embedding"}}
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "seq2seq", seed, dtype, config, ["src_ids", "tgt_ids", "target"],
                          level="model", **extra), arrays)


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        def padded(g, tgt_left=False):
            return {"tgt_mask": causal(4),
                    "src_key_padding_mask": padding([5, 3], 5),
                    "tgt_key_padding_mask": padding([4, 2], 4, left=tgt_left),
                    "memory_key_padding_mask": padding([5, 3], 5)}

        def every_mask(g):
            return {"src_mask": normal(g, (5, 5), dtype, std=1.5),
                    "tgt_mask": per_head_mask(g, 2 * 3, 4),
                    "memory_mask": memory_mask(g, 4, 5),
                    "src_key_padding_mask": padding([4, 5], 5),
                    "tgt_key_padding_mask": padding([4, 3], 4),
                    "memory_key_padding_mask": padding([5, 2], 5)}

        for index, (name, config, masks) in enumerate([
                ("transformer_post_relu", {**SMALL, "norm_first": False, "activation": "relu"},
                 padded),
                ("transformer_pre_gelu", {**SMALL, "norm_first": True, "activation": "gelu"},
                 padded),
                ("transformer_left_padded", {**SMALL, "norm_first": False,
                                             "activation": "relu"},
                 lambda g: padded(g, tgt_left=True)),
                ("transformer_every_mask", {**SMALL, "d_model": 12, "nhead": 3,
                                            "norm_first": True, "activation": "gelu",
                                            "bias": False, "layer_norm_eps": 1e-6},
                 every_mask)]):
            paths.append(transformer_case(out_dir, name, 90 + index, dtype, config, masks))

        base = {"src_vocab_size": 13, "tgt_vocab_size": 13, "d_model": 8, "nhead": 2,
                "num_encoder_layers": 2, "num_decoder_layers": 2, "dim_feedforward": 16,
                "dropout": 0.0, "activation": "relu", "layer_norm_eps": 1e-5,
                "norm_first": False, "bias": True, "scale_embeddings": False}
        for index, (name, changes) in enumerate([
                ("seq2seq", {}),
                ("seq2seq_scaled_pre_ln", {"scale_embeddings": True, "norm_first": True,
                                           "activation": "gelu"})]):
            paths.append(seq2seq_case(out_dir, name, 100 + index, dtype, {**base, **changes}))
    return paths
