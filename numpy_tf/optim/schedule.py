"""Learning-rate schedules: pure functions of the step number.

`warmup_cosine` is a linear warm-up followed by a cosine decay to a minimum. The step s counts
optimizer updates from 0: s is the index of the update about to be taken, the value torch's
schedulers hold in `last_epoch` before the update (W = warmup_steps, T = total_steps):

    0 <= s < W:    lr = base_lr (s + 1) / (W + 1)
                   on the straight line from 0 (at s = -1) to base_lr (at s = W): the first
                   update already moves (lr > 0), and the peak is taken once, at s = W
    W <= s < T:    lr = min_lr + (base_lr - min_lr) (1 + cos(pi (s - W) / (T - W))) / 2
                   from base_lr at s = W down toward min_lr, reached at s = T
    s >= T:        lr = min_lr

So a run of T updates (s = 0 .. T-1) ends just above min_lr; with W = T there is no decay.
Errors: negative values, total_steps < 1, warmup_steps > total_steps, min_lr > base_lr.
torch builds the same curve as

    SequentialLR(optimizer, [LinearLR(optimizer, start_factor=1 / (W + 1), total_iters=W),
                             CosineAnnealingLR(optimizer, T_max=T - W, eta_min=min_lr)],
                 milestones=[W])

(for W >= 1 and s <= T; past T torch's cosine climbs again, this one stays at min_lr), or as
LambdaLR(optimizer, lambda s: warmup_cosine(s, ...) / base_lr). Use it per update:

    for group in optimizer.param_groups:
        group["lr"] = warmup_cosine(step, base_lr, warmup_steps, total_steps, min_lr)
    optimizer.step()
"""
from __future__ import annotations

import math

from ..core import validate


def warmup_cosine(step: int, base_lr: float, warmup_steps: int, total_steps: int,
                  min_lr: float = 0.0) -> float:
    """The learning rate of update `step` (counted from 0); see the module docstring."""
    step = validate.non_negative_int("step", step)
    warmup_steps = validate.non_negative_int("warmup_steps", warmup_steps)
    total_steps = validate.positive_int("total_steps", total_steps)
    base_lr = validate.number("base_lr", base_lr, low=0.0)
    min_lr = validate.number("min_lr", min_lr, low=0.0, high=base_lr)
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps must be <= total_steps; got warmup_steps "
                         f"{warmup_steps} > total_steps {total_steps}")
    if step < warmup_steps:
        return base_lr * (step + 1) / (warmup_steps + 1)
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
