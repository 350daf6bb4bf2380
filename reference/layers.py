"""Fixtures for the first layers: Linear, Embedding, ReLU, GELU (both variants), SiLU, softmax,
log_softmax and cross-entropy, each from the torch module itself, float64 and float32."""
from __future__ import annotations

import torch
from torch import nn

from common import DTYPES, float_case, normal

FILE = "layers.py"


class ClassLastCrossEntropy(nn.Module):
    """nn.CrossEntropyLoss with the classes on the last axis (numpy_tf's layout): logits
    (..., C) are flattened to (N, C) and targets (...) to (N,), which torch defines the same."""

    def __init__(self, **kwargs):
        super().__init__()
        self.loss = nn.CrossEntropyLoss(**kwargs)

    def forward(self, logits, targets):
        return self.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _float_case(out_dir, name, kind, seed, dtype, module, config, inputs, **extra):
    return float_case(out_dir, FILE, name, kind, seed, dtype, module, config, inputs, **extra)


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        x = lambda shape, std=1.0: (lambda g: normal(g, shape, dtype, std))  # noqa: E731
        paths.append(_float_case(out_dir, "linear", "linear", 1, dtype, nn.Linear(4, 5),
                                 {"in_features": 4, "out_features": 5, "bias": True},
                                 {"x": x((2, 3, 4))}))
        paths.append(_float_case(out_dir, "linear_nobias", "linear", 2, dtype,
                                 nn.Linear(6, 3, bias=False),
                                 {"in_features": 6, "out_features": 3, "bias": False},
                                 {"x": x((5, 6))}))
        # ids with repeats (row 3 three times) and the padding row 0 looked up twice
        ids = torch.tensor([[3, 1, 3, 0, 6], [0, 3, 5, 2, 2]])
        paths.append(_float_case(out_dir, "embedding", "embedding", 3, dtype,
                                 nn.Embedding(7, 4),
                                 {"num_embeddings": 7, "embedding_dim": 4, "padding_idx": None},
                                 {"ids": lambda g: ids}))
        paths.append(_float_case(out_dir, "embedding_padding", "embedding", 4, dtype,
                                 nn.Embedding(7, 4, padding_idx=0),
                                 {"num_embeddings": 7, "embedding_dim": 4, "padding_idx": 0},
                                 {"ids": lambda g: ids}))
        paths.append(_float_case(out_dir, "relu", "relu", 5, dtype, nn.ReLU(), {},
                                 {"x": x((3, 7), 2.0)}))
        for approximate in ("none", "tanh"):
            paths.append(_float_case(out_dir, f"gelu_{approximate}", "gelu", 6, dtype,
                                     nn.GELU(approximate=approximate),
                                     {"approximate": approximate}, {"x": x((4, 9), 3.0)},
                                     conventions={"gelu": f"approximate={approximate!r}"}))
        paths.append(_float_case(out_dir, "silu", "silu", 7, dtype, nn.SiLU(), {},
                                 {"x": x((4, 9), 4.0)}))
        paths.append(_float_case(out_dir, "softmax", "softmax", 8, dtype, nn.Softmax(dim=-1),
                                 {"dim": -1}, {"x": x((2, 3, 6), 2.0)}))
        paths.append(_float_case(out_dir, "log_softmax", "log_softmax", 9, dtype,
                                 nn.LogSoftmax(dim=-1), {"dim": -1}, {"x": x((2, 3, 6), 2.0)}))
        targets = torch.tensor([[1, 4, -100, 0], [6, -100, 2, 2]])
        for name, config, seed, std in [
                ("cross_entropy", {"reduction": "mean"}, 10, 2.0),
                ("cross_entropy_smoothing", {"reduction": "mean", "label_smoothing": 0.1}, 11,
                 2.0),
                ("cross_entropy_sum", {"reduction": "sum", "label_smoothing": 0.25}, 12, 2.0),
                ("cross_entropy_large_logits", {"reduction": "mean"}, 13, 1e4)]:
            config = {"ignore_index": -100, "label_smoothing": 0.0, **config}
            paths.append(_float_case(
                out_dir, name, "cross_entropy", seed, dtype, ClassLastCrossEntropy(**config),
                config, {"logits": x((2, 4, 7), std), "targets": lambda g: targets},
                conventions={"cross_entropy": "classes on the last axis; mean over targets "
                                              "that are not ignore_index"}))
    return paths
