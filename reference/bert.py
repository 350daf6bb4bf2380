"""Fixtures for the encoder-only model: Hugging Face BertForMaskedLM built offline from small
BertConfigs with random weights (never downloaded), tied and untied, with segments and with
right padding; and a torch mirror of numpy_tf's options that BERT lacks (Pre-LN with a final
LayerNorm, ReLU, no segment table, no position table, an untied decoder), built from
nn.TransformerEncoderLayer, nn.Embedding and an MLM head. Each case holds the logits, the
masked-LM loss (mean cross-entropy at the chosen positions, -100 elsewhere) and every parameter
gradient of that loss.

HF BERT has no float32 islands in a float64 model (nn.LayerNorm, nn.functional.gelu, and an
eager softmax in the scores' dtype), so the float64 cases are HF as it ships.

In transformers 5 an untied BertForMaskedLM ties neither the decoder's weight nor its bias, and
its forward uses `cls.predictions.decoder.bias`: `cls.predictions.bias` takes no part. It stays
zero here (HF initialises it so and nothing updates it) and its gradient, None in torch, is
stored as zeros.

Weights are spread as in gpt.py (N(0, 0.3^2), norm weights 1 + N(0, 0.2^2)) so attention is far
from uniform.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, generator
from gpt import hf_config_dict, lm_case, spread_weights

FILE = "bert.py"
MASK_ID = 3


class Embeddings(nn.Module):
    """LayerNorm(word[ids] + token_type[segments] + position[0 .. T-1]); either table may be
    left out."""

    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"],
                                            padding_idx=c["pad_token_id"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"],
                                                c["hidden_size"]) \
            if c["position_embeddings"] else None
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"]) \
            if c["type_vocab_size"] else None
        self.norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, ids, token_type_ids):
        x = self.word_embeddings(ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(ids.shape[1]))
        return self.norm(x)


class MaskedLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.activation = nn.GELU() if c["hidden_act"] == "gelu" else nn.ReLU()
        self.norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.decoder = nn.Linear(c["hidden_size"], c["vocab_size"])

    def forward(self, h):
        return self.decoder(self.norm(self.activation(self.dense(h))))


class TorchBert(nn.Module):
    """The encoder-only model with numpy_tf's state_dict keys: embeddings, a
    nn.TransformerEncoder (with a final LayerNorm when Pre-LN), the MLM head."""

    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        layer = nn.TransformerEncoderLayer(
            c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], dropout=0.0,
            activation=c["hidden_act"], layer_norm_eps=c["layer_norm_eps"], batch_first=True,
            norm_first=c["norm_first"])
        norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"]) \
            if c["norm_first"] else None
        self.encoder = nn.TransformerEncoder(layer, c["num_hidden_layers"], norm,
                                             enable_nested_tensor=False)
        self.mlm_head = MaskedLMHead(c)
        if c["tie_word_embeddings"]:
            self.mlm_head.decoder.weight = self.embeddings.word_embeddings.weight

    def forward(self, ids, attention_mask=None, token_type_ids=None):
        padding = None if attention_mask is None else attention_mask == 0
        hidden = self.encoder(self.embeddings(ids, token_type_ids), src_key_padding_mask=padding)
        return self.mlm_head(hidden)


def mlm_inputs(g, vocab_size, batch, length, real_lengths, pad_id):
    """(inputs, labels, attention_mask): random ids, right padding (pad_id there, when given),
    about 30 % of the real tokens chosen (the first always) and replaced by MASK_ID in the
    inputs; labels the original ids there, -100 elsewhere."""
    ids = torch.randint(0, vocab_size, (batch, length), generator=g)
    attention_mask = (torch.arange(length) < torch.tensor(real_lengths)[:, None]).long()
    real = attention_mask == 1
    if pad_id is not None:
        ids[~real] = pad_id
    chosen = (torch.rand(batch, length, generator=g, dtype=torch.float64) < 0.3) & real
    chosen[:, 0] = True
    labels = torch.where(chosen, ids, -100)
    return torch.where(chosen, MASK_ID, ids), labels, attention_mask


def segments(batch, length, first):
    """token_type_ids: 0 for the first `first` positions, 1 after."""
    return (torch.arange(length) >= first).long().expand(batch, length).clone()


def mlm_loss(labels, token_type_ids, hugging_face):
    """loss_fn(model, ids, attention_mask) -> (logits, mean cross-entropy at the labels)."""
    def run(model, ids, attention_mask):
        if hugging_face:
            out = model(input_ids=ids, attention_mask=attention_mask,
                        token_type_ids=token_type_ids, labels=labels)
            return out.logits, out.loss
        logits = model(ids, attention_mask, token_type_ids)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return run


def mlm_case(path, model, g, config, kind, seed, dtype, padded, token_types, hugging_face):
    vocab = config["vocab_size"]
    real_lengths = [9, 6] if padded else [9, 9]
    ids, labels, attention_mask = mlm_inputs(g, vocab, 2, 9, real_lengths,
                                             config["pad_token_id"])
    token_type_ids = segments(2, 9, 4) if token_types else None
    extra = {"labels": labels} | ({"token_type_ids": token_type_ids} if token_types else {})
    conventions = {"loss": "mean cross-entropy of the labels (the original ids at the chosen "
                           "positions), -100 ignored; the inputs have MASK_ID there",
                   "token_type_ids": "given as input/token_type_ids when the model has them"}
    return lm_case(path, model, ids, attention_mask if padded else None, config, kind, seed,
                   dtype, mlm_loss(labels, token_type_ids, hugging_face), FILE, conventions,
                   extra)


# name, seed, BertConfig changes, right padding
HF_CASES = [
    ("bert_tied", 110, {"tie_word_embeddings": True}, False),
    ("bert_untied", 111, {"tie_word_embeddings": False}, False),
    ("bert_tied_padded", 112, {"tie_word_embeddings": True}, True),
]
HF_SMALL = dict(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=24, max_position_embeddings=12, type_vocab_size=2,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                attn_implementation="eager")
# numpy_tf BertConfig's keys, every one given
MIRROR_BASE = {"vocab_size": 20, "hidden_size": 12, "num_hidden_layers": 2,
               "num_attention_heads": 3, "intermediate_size": 20, "hidden_act": "gelu",
               "max_position_embeddings": 10, "type_vocab_size": 3, "layer_norm_eps": 1e-12,
               "norm_first": False, "tie_word_embeddings": True, "position_embeddings": True,
               "pad_token_id": 0, "initializer_range": 0.02, "dropout": 0.0}
MIRROR_CASES = [
    ("bert_mirror_post_ln", 113, {}, True),
    ("bert_mirror_pre_ln", 114, {"hidden_act": "relu", "norm_first": True,
                                 "tie_word_embeddings": False, "position_embeddings": False,
                                 "type_vocab_size": 0, "pad_token_id": None,
                                 "layer_norm_eps": 1e-5}, True),
]


def build(out_dir):
    from transformers import BertConfig, BertForMaskedLM

    paths = []
    for dtype in DTYPES:
        for name, seed, changes, padded in HF_CASES:
            g = generator(seed)
            hf_config = BertConfig(**HF_SMALL, **changes)
            model = BertForMaskedLM(hf_config).to(DTYPES[dtype]).eval()
            spread_weights(model, g, dtype)
            if not hf_config.tie_word_embeddings:
                with torch.no_grad():
                    model.cls.predictions.bias.zero_()      # unused by HF: stays as initialised
            paths.append(mlm_case(out_dir / f"{name}_{dtype}.npz", model, g,
                                  hf_config_dict(hf_config), "hf_bert", seed, dtype, padded,
                                  True, True))
        for name, seed, changes, padded in MIRROR_CASES:
            g = generator(seed)
            config = {**MIRROR_BASE, **changes}
            model = TorchBert(config).to(DTYPES[dtype])
            spread_weights(model, g, dtype)
            paths.append(mlm_case(out_dir / f"{name}_{dtype}.npz", model, g, config, "bert",
                                  seed, dtype, padded, bool(config["type_vocab_size"]), False))
    return paths
