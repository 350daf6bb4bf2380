"""Optimizers with torch.optim's exact semantics, gradient clipping, parameter groups and the
learning-rate schedule."""
from .adam import Adam, AdamW, adam_update
from .clipping import clip_grad_norm, grads_finite
from .optimizer import Optimizer
from .param_groups import decay_groups
from .schedule import warmup_cosine
from .sgd import SGD, sgd_update
