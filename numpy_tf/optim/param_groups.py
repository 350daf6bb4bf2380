"""Parameter groups: which parameters get weight decay."""
from __future__ import annotations

from ..core import validate
from ..core.module import Module
from ..layers.embedding import Embedding


def decay_groups(model: Module, weight_decay: float, *,
                 exclude_embeddings: bool = False) -> list[dict]:
    """Two parameter groups for `model`: `weight_decay` on the matrices, 0 on the parameters
    with fewer than 2 dimensions (biases, norm weights) and, with `exclude_embeddings`, on the
    weights of Embedding modules too. Each group carries "param_names" from
    model.named_parameters() (a tied weight once, under its first name); an empty group is
    left out.

        AdamW(decay_groups(model, 0.1), lr=3e-4)
    """
    validate.module("model", model)
    weight_decay = validate.number("weight_decay", weight_decay, low=0.0)
    validate.flag("exclude_embeddings", exclude_embeddings)
    embedding_weights = {id(module.weight) for _, module in model.named_modules()
                         if isinstance(module, Embedding)} if exclude_embeddings else set()
    decay = {"params": [], "param_names": [], "weight_decay": weight_decay}
    no_decay = {"params": [], "param_names": [], "weight_decay": 0.0}
    for name, parameter in model.named_parameters():
        exempt = parameter.data.ndim < 2 or id(parameter) in embedding_weights
        group = no_decay if exempt else decay
        group["params"].append(parameter)
        group["param_names"].append(name)
    return [group for group in (decay, no_decay) if group["params"]]
