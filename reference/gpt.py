"""Fixtures for decoder-only models: the 7,232-parameter Pre-LN GPT (reproduced here as a torch
module with the same state_dict keys) and Hugging Face GPT2LMHeadModel built offline from a small
GPT2Config with random weights (never downloaded), tied and untied, with and without right
padding. Each case holds the logits, the mean next-token cross-entropy and every parameter
gradient of that loss.

Weights are drawn with a larger spread than the models' 0.02 initialisation (and LayerNorm
weights around 1) so attention is far from uniform and the comparison has teeth.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, generator, meta, normal, save_case, to_numpy

FILE = "gpt.py"


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.output = nn.Linear(width, width, bias=False)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for part in self.qkv(x).split(width, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return self.output((weights @ v).transpose(1, 2).reshape(batch, length, width))


class PreLNBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.feedforward = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                         nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.feedforward(self.norm2(x))


class TinyGPT(nn.Module):
    """The Pre-LN GPT decoder: token + learned positions, Pre-LN blocks, final LayerNorm,
    an output head without bias."""

    def __init__(self, vocab_size, max_context, width, heads, layers):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(max_context, width)
        self.blocks = nn.Sequential(*[PreLNBlock(width, heads) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(width)
        self.output = nn.Linear(width, vocab_size, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        return self.output(self.final_norm(self.blocks(x)))


def spread_weights(model: nn.Module, g: torch.Generator, dtype: str, std: float = 0.3):
    """Every weight N(0, std^2); every norm weight 1 + N(0, 0.2^2)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = normal(g, parameter.shape, dtype)
            is_norm = ".ln_" in name or "norm" in name.lower() or name.endswith("ln_f.weight")
            if is_norm and name.endswith("weight"):
                parameter.copy_(1.0 + 0.2 * noise)
            else:
                parameter.copy_(std * noise)


def next_token_loss(logits, ids, attention_mask=None):
    """Mean cross-entropy of predicting ids[t + 1] at position t, padded targets ignored."""
    labels = ids.clone()
    if attention_mask is not None:
        labels[attention_mask == 0] = -100
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           labels[:, 1:].reshape(-1), ignore_index=-100)


def hf_lm_loss(model, ids, attention_mask):
    """The logits of a Hugging Face causal LM and their next-token loss."""
    logits = model(input_ids=ids, attention_mask=attention_mask).logits
    return logits, next_token_loss(logits, ids, attention_mask)


def lm_case(path, model, ids, attention_mask, config, kind, seed, dtype, loss_fn,
            generator_file=FILE, conventions=None, extra_inputs=None):
    """A model-level case: the parameters, ids (and padding mask, and `extra_inputs` such as
    labels), logits, the loss of `loss_fn(model, ids, attention_mask)` and every parameter's
    gradient of it (zeros for a parameter the loss does not reach: torch leaves its grad None)."""
    logits, loss = loss_fn(model, ids, attention_mask)
    loss.backward()
    arrays = {f"param/{name}": to_numpy(p) for name, p in model.state_dict().items()}
    arrays["input/ids"] = to_numpy(ids)
    inputs = ["ids"]
    for name, value in (extra_inputs or {}).items():
        arrays[f"input/{name}"] = to_numpy(value)
        inputs.append(name)
    if attention_mask is not None:
        arrays["input/key_padding_mask"] = to_numpy(attention_mask == 0)
    arrays["output/logits"] = to_numpy(logits)
    arrays["loss"] = to_numpy(loss)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        grad = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
        arrays[f"grad/{name}"] = to_numpy(grad)
    extra = {"keyword_inputs": ["key_padding_mask"] if attention_mask is not None else [],
             "conventions": {"loss": "mean cross-entropy of ids[t+1] given ids[:t+1], padded "
                                     "targets ignored", "padding": "right padding, "
                                     "key_padding_mask True at padding", **(conventions or {})}}
    return save_case(path, meta(generator_file, kind, seed, dtype, config, inputs,
                                level="model", **extra), arrays)


def hf_config_dict(hf_config) -> dict:
    """The config as the case's meta keeps it (without the label maps and the version)."""
    return {k: v for k, v in hf_config.to_dict().items()
            if k not in ("id2label", "label2id", "transformers_version")}


def build(out_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    paths = []
    for dtype in DTYPES:
        torch_dtype = DTYPES[dtype]
        # the 7,232-parameter Pre-LN GPT
        g = generator(70)
        config = {"vocab_size": 20, "max_context": 8, "width": 16, "heads": 4, "layers": 2}
        model = TinyGPT(**config).to(torch_dtype)
        spread_weights(model, g, dtype)
        ids = torch.randint(0, 20, (2, 7), generator=g)
        paths.append(lm_case(
            out_dir / f"tiny_gpt_{dtype}.npz", model, ids, None, config, "tiny_gpt", 70, dtype,
            lambda m, i, a: (lambda logits: (logits, next_token_loss(logits, i)))(m(i))))

        # Hugging Face GPT-2, tied and untied, with and without right padding
        for index, (name, tied, padded) in enumerate([("gpt2_tied", True, False),
                                                      ("gpt2_untied", False, False),
                                                      ("gpt2_tied_padded", True, True)]):
            seed = 80 + index
            g = generator(seed)
            hf_config = GPT2Config(vocab_size=24, n_positions=10, n_embd=16, n_layer=2,
                                   n_head=4, tie_word_embeddings=tied, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                   eos_token_id=0, attn_implementation="eager")
            model = GPT2LMHeadModel(hf_config).to(torch_dtype).eval()
            spread_weights(model, g, dtype)
            ids = torch.randint(0, 24, (2, 9), generator=g)
            mask = None
            if padded:
                mask = torch.ones(2, 9, dtype=torch.long)
                mask[1, 6:] = 0
            paths.append(lm_case(out_dir / f"{name}_{dtype}.npz", model, ids, mask,
                                 hf_config_dict(hf_config), "hf_gpt2", seed, dtype, hf_lm_loss))
    return paths
