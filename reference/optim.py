"""Fixtures for the optimizers, gradient clipping and the warm-up + cosine schedule, from
torch.optim (single-tensor code, foreach=False), torch.nn.utils.clip_grad_norm_ and
torch.optim.lr_scheduler, float64 and float32.

An optimizer case holds the initial parameters (param/<name>), the gradient given at each step
(input/grad_<step>/<name>, drawn, not computed from a loss), the parameters after the last step
(output/<name>), the optimizer state then (output/<state key>/<name>) and, with a schedule,
the learning rate of each group at each step (output/lr/<group>).
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

from common import DTYPES, generator, meta, normal, save_case, to_numpy

FILE = "optim.py"
STEPS = 5
# name -> (shape, standard deviation of its gradients): a small-gradient parameter shows
# Adam's eps at work
PARAMETERS = {"linear.weight": ((3, 4), 1.0), "linear.bias": ((3,), 1.0),
              "norm.weight": ((4,), 1e-3)}
STATE_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
OPTIMIZERS = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int,
                         min_ratio: float) -> float:
    """lr / base_lr of a linear warm-up from 0 (at step -1) to 1 (at step W), then a cosine
    to min_ratio at step T, min_ratio after; steps counted from 0."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if step >= total_steps:
        return min_ratio
    cosine = 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps)))
    return min_ratio + (1.0 - min_ratio) * cosine


def _optimizer_case(out_dir, name, seed, dtype, optimizer, hyperparameters, groups=None,
                    schedule=None):
    g = generator(seed)
    params = {key: normal(g, shape, dtype).requires_grad_(True)
              for key, (shape, _) in PARAMETERS.items()}
    grads = [{key: normal(g, shape, dtype, std) for key, (shape, std) in PARAMETERS.items()}
             for _ in range(STEPS)]
    arrays = {f"param/{key}": to_numpy(value) for key, value in params.items()}
    torch_groups = list(params.values()) if groups is None else [
        {**group, "params": [params[key] for key in group["params"]]} for group in groups]
    opt = OPTIMIZERS[optimizer](torch_groups, foreach=False, **hyperparameters)
    scheduler = None if schedule is None else LambdaLR(opt, lambda step: warmup_cosine_factor(
        step, schedule["warmup_steps"], schedule["total_steps"], schedule["min_lr_ratio"]))
    lrs = [[] for _ in opt.param_groups]
    for step, step_grads in enumerate(grads):
        for key, value in params.items():
            value.grad = step_grads[key].clone()
            arrays[f"input/grad_{step}/{key}"] = to_numpy(step_grads[key])
        for number, group in enumerate(opt.param_groups):
            lrs[number].append(group["lr"])
        opt.step()
        if scheduler is not None:
            scheduler.step()
    for key, value in params.items():
        arrays[f"output/{key}"] = to_numpy(value)
    for key, value in params.items():
        for state_key in STATE_KEYS:
            if opt.state[value].get(state_key) is not None:
                arrays[f"output/{state_key}/{key}"] = to_numpy(opt.state[value][state_key])
    if schedule is not None:
        for number, values in enumerate(lrs):
            arrays[f"output/lr/{number}"] = torch.tensor(values, dtype=DTYPES[dtype]).numpy()
    config = {"optimizer": optimizer, "hyperparameters": hyperparameters, "groups": groups,
              "steps": STEPS, "schedule": schedule}
    inputs = [key[len("input/"):] for key in arrays if key.startswith("input/")]
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "optimizer", seed, dtype, config, inputs,
                          conventions={"optimizer": "torch.optim, foreach=False; every "
                                                    "parameter gets a gradient at every step"}),
                     arrays)


def _clip_case(out_dir, name, seed, dtype, max_norm, norm_type):
    g = generator(seed)
    grads = {key: normal(g, shape, dtype, 2.0) for key, (shape, _) in PARAMETERS.items()}
    params = {key: torch.zeros(value.shape, dtype=DTYPES[dtype], requires_grad=True)
              for key, value in grads.items()}
    for key, value in params.items():
        value.grad = grads[key].clone()
    total = torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm, norm_type,
                                           foreach=False)
    arrays = {f"input/{key}": to_numpy(value) for key, value in grads.items()}
    arrays.update({f"output/{key}": to_numpy(value.grad) for key, value in params.items()})
    arrays["output/total_norm"] = to_numpy(total)
    config = {"max_norm": max_norm, "norm_type": "inf" if math.isinf(norm_type) else norm_type}
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "clip_grad_norm", seed, dtype, config, list(grads)), arrays)


def _schedule_case(out_dir, name, dtype, base_lr, warmup_steps, total_steps, min_lr):
    """The learning rate at steps 0..T from LambdaLR with the formula, and from torch's own
    composition: SequentialLR(LinearLR, CosineAnnealingLR), or CosineAnnealingLR alone
    without warm-up."""
    def run(make):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
        scheduler, values = make(opt), []
        for _ in range(total_steps + 1):
            values.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
        return torch.tensor(values, dtype=DTYPES[dtype]).numpy()

    def composed(opt):
        cosine = CosineAnnealingLR(opt, T_max=total_steps - warmup_steps, eta_min=min_lr)
        if warmup_steps == 0:
            return cosine
        warmup = LinearLR(opt, start_factor=1 / (warmup_steps + 1), end_factor=1.0,
                          total_iters=warmup_steps)
        return SequentialLR(opt, [warmup, cosine], milestones=[warmup_steps])

    arrays = {"output/lambda_lr": run(lambda opt: LambdaLR(opt, lambda step: warmup_cosine_factor(
                  step, warmup_steps, total_steps, min_lr / base_lr))),
              "output/composed_lr": run(composed)}
    config = {"base_lr": base_lr, "warmup_steps": warmup_steps, "total_steps": total_steps,
              "min_lr": min_lr}
    return save_case(out_dir / f"{name}_{dtype}.npz",
                     meta(FILE, "lr_schedule", 0, dtype, config, [],
                          conventions={"lr_schedule": "the lr of update s, s counted from 0 "
                                                      "(torch's last_epoch before the step)"}),
                     arrays)


def build(out_dir):
    paths = []
    for dtype in DTYPES:
        for name, seed, optimizer, hyperparameters in [
                ("sgd", 20, "SGD", {"lr": 0.1}),
                ("sgd_nesterov", 21, "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True,
                                             "weight_decay": 0.01}),
                ("sgd_dampening_maximize", 22, "SGD", {"lr": 0.1, "momentum": 0.8,
                                                       "dampening": 0.3, "weight_decay": 0.05,
                                                       "maximize": True}),
                ("adam", 23, "Adam", {"lr": 0.01}),
                ("adam_l2_amsgrad", 24, "Adam", {"lr": 0.02, "betas": [0.8, 0.99],
                                                 "eps": 1e-6, "weight_decay": 0.1,
                                                 "amsgrad": True}),
                ("adamw", 25, "AdamW", {"lr": 0.01, "weight_decay": 0.1})]:
            paths.append(_optimizer_case(out_dir, name, seed, dtype, optimizer,
                                         hyperparameters))
        groups = [{"params": ["linear.weight"], "weight_decay": 0.1},
                  {"params": ["linear.bias", "norm.weight"], "weight_decay": 0.0, "lr": 0.02}]
        paths.append(_optimizer_case(out_dir, "adamw_groups_schedule", 26, dtype, "AdamW",
                                     {"lr": 0.01, "amsgrad": True}, groups,
                                     {"warmup_steps": 2, "total_steps": 4,
                                      "min_lr_ratio": 0.1}))
        paths.append(_clip_case(out_dir, "clip_grad_norm", 27, dtype, 1.0, 2.0))
        paths.append(_clip_case(out_dir, "clip_grad_norm_inf", 28, dtype, 0.5, math.inf))
        paths.append(_clip_case(out_dir, "clip_grad_norm_p3_unclipped", 29, dtype, 100.0, 3.0))
        paths.append(_schedule_case(out_dir, "warmup_cosine", dtype, 0.1, 5, 20, 0.01))
        paths.append(_schedule_case(out_dir, "warmup_cosine_no_warmup", dtype, 3e-4, 0, 12,
                                    0.0))
    return paths
