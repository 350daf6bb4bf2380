"""Training: steps of forward, loss, backward, clipping and an optimizer update, with
evaluation, a progress line, a loss history, and exact checkpoints.

One step: draw a batch with the Trainer's Generator, loss = objective(batch), stop if it is not
finite, zero the gradients, backward, stop if any gradient is not finite, clip the global norm,
set the learning rate of the schedule (linear warm-up, then cosine), optimizer step, stop if
any updated weight is not finite (a finite but absurd learning rate, 1e30, gets there; the
weights are put back as they were before the step). A stop raises TrainingStopped before
anything is saved, and `save` itself refuses weights that are not finite, so the last good
checkpoint stays intact and a checkpoint is only ever called good when it is. A save that is
interrupted removes its temporary file; one killed outright leaves it, and the next save to
the same path removes it (numpy_tf.core.npz).

Each history row also holds, per group of parameters (one group per block, e.g. "blocks.0";
one per other module, e.g. "tokens", "final_norm"), the norm of the group's gradient before
clipping, "grad_norm:<group>", and of the update the step applied to it, ||p_after -
p_before||, "update_norm:<group>": where a run's learning happens, layer by layer.

Everything random comes from the Trainer's Generator, whose state the checkpoint holds: 10
steps straight and 5 steps, save, load, 5 steps give bit-identical parameters and losses. The
checkpoint also holds the history so far (`history` (steps, columns) float64, the columns in
meta["history_columns"]), so a resumed run writes the whole run's history.
"""
from __future__ import annotations

import csv
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.npz import bad_file
from ..optim import AdamW, clip_grad_norm, decay_groups, grads_finite
from ..optim.optimizer import Optimizer
from ..optim.schedule import warmup_cosine
from .checkpoint import Checkpoint, save_checkpoint
from .split import BatchSplit


# the meta keys save_checkpoint and Trainer.save write themselves (the rest is extra_meta)
CHECKPOINT_META = ("format", "model", "step", "rng", "optimizer", "settings", "history_columns")


class TrainingStopped(RuntimeError):
    """A non-finite loss or gradient: training stopped, the last checkpoint untouched."""


@dataclass
class TrainSettings:
    """What a run does; every field is checked when the settings are made (a number must be
    finite, a count an integer: NumPy integers are accepted, a bool or 2.7 is not)."""
    steps: int = 1000
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 50
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    clip: float = 1.0
    eval_every: int = 100           # 0: never
    log_every: int = 10
    checkpoint_every: int = 0       # 0: only when asked (and at the end of run)
    seed: int = 0

    def __post_init__(self):
        count, positive = validate.non_negative_int, validate.positive_int
        validate.config_fields(self, {
            "steps": positive, "batch_size": positive, "lr": validate.bounded(low=0.0),
            "warmup": count, "weight_decay": validate.bounded(low=0.0),
            "clip": validate.bounded(low=0.0), "eval_every": count, "log_every": positive,
            "checkpoint_every": count, "seed": count})
        validate.config_fields(self, {"min_lr": validate.bounded(0.0, self.lr)})
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2); got {self.betas!r}")
        self.betas = tuple(validate.number(f"betas[{i}]", beta, low=0.0, high=1.0,
                                           high_open=True) for i, beta in enumerate(self.betas))


def make_optimizer(model: Module, settings: TrainSettings) -> Optimizer:
    """AdamW, no weight decay on 1-D parameters (norms, biases)."""
    return AdamW(decay_groups(model, settings.weight_decay), lr=settings.lr,
                 betas=settings.betas)


def parameter_groups(model: Module) -> dict[str, list[str]]:
    """{group: [parameter names]}, in the model's order. A name with a numbered part belongs to
    the block it numbers ("blocks.0.attention.qkv.weight" -> "blocks.0",
    "transformer.encoder.layers.1.linear1.bias" -> "transformer.encoder.layers.1"); any other
    name to its module ("final_norm.weight" -> "final_norm")."""
    groups: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        numbered = [i for i, part in enumerate(parts) if part.isdigit()]
        group = ".".join(parts[:numbered[0] + 1] if numbered else parts[:-1] or parts)
        groups.setdefault(group, []).append(name)
    return groups


def _group_norms(prefix: str, arrays: dict[str, np.ndarray],
                 groups: dict[str, list[str]]) -> dict[str, float]:
    """{prefix + group: the 2-norm of the group's arrays together}, summed in float64."""
    return {prefix + group: math.sqrt(sum(float(np.sum(np.square(arrays[name], dtype=np.float64)))
                                          for name in names))
            for group, names in groups.items()}


class Trainer:
    """Trains `objective` (a Module whose forward(*batch) returns (loss, cache) and whose
    `.model` is the model) on batches from `sample_batch(rng)`."""

    def __init__(self, objective: Module, sample_batch: Callable[[np.random.Generator], tuple],
                 settings: TrainSettings, *, eval_batches: Sequence[tuple] = (),
                 checkpoint_path=None, extra_meta: dict | None = None,
                 extra_arrays: dict | None = None, optimizer: Optimizer | None = None,
                 rng: np.random.Generator | None = None, step: int = 0):
        if not isinstance(settings, TrainSettings):
            raise TypeError(f"settings must be a TrainSettings; got {type(settings).__name__}")
        if not callable(sample_batch):
            raise TypeError(f"sample_batch must be a function of a Generator returning a "
                            f"batch; got {type(sample_batch).__name__}")
        self.objective, self.model = objective, objective.model
        self.sample_batch, self.settings = sample_batch, settings
        self.eval_batches = list(eval_batches)
        self.checkpoint_path = checkpoint_path
        self.last_checkpoint_step: int | None = None
        self.extra_meta, self.extra_arrays = extra_meta or {}, extra_arrays or {}
        self.optimizer = optimizer or make_optimizer(self.model, settings)
        self.rng = rng or np.random.default_rng(settings.seed)
        self.step = validate.non_negative_int("step", step)
        self.history: list[dict] = []           # the rows of this Trainer's steps
        self.earlier_history: list[dict] = []   # a resumed run's rows before them
        self.groups = parameter_groups(self.model)
        self.step_objective = objective     # what each step runs (run_on_threads)

    def run_on_threads(self, threads: int) -> None:
        """Run each step's and each evaluation's batch in up to `threads` parts, one per
        thread (numpy_tf.training.split.BatchSplit); 1 runs it whole. The values then equal
        the whole batch's within a few ulps, and are the same bits from run to run at the
        same count."""
        validate.positive_int("threads", threads)
        self.step_objective = BatchSplit(self.objective, threads) if threads > 1 else \
            self.objective

    # -- one step -------------------------------------------------------------------------------
    def learning_rate(self, step: int) -> float:
        s = self.settings
        return warmup_cosine(step, s.lr, min(s.warmup, s.steps), s.steps, s.min_lr)

    def train_step(self) -> dict:
        batch = self.sample_batch(self.rng)
        with np.errstate(all="ignore"):     # overflow is caught below, with a clear message
            loss, cache = self.step_objective.forward(*batch)
            if not np.isfinite(loss):
                self._stop(f"the loss is {float(loss)}")
            self.optimizer.zero_grad()
            self.step_objective.backward(1.0, cache)
        parameters = self.model.parameters()
        if not grads_finite(parameters):
            bad = _not_finite(dict(self.model.named_parameters()), "grad")
            self._stop(f"the gradient of {', '.join(bad[:3])} is not finite")
        named = dict(self.model.named_parameters())
        grad_norms = _group_norms("grad_norm:", {n: p.grad for n, p in named.items()},
                                  self.groups)
        before = {name: p.data.copy() for name, p in named.items()}
        norm = clip_grad_norm(parameters, self.settings.clip) if self.settings.clip else \
            float("nan")
        lr = self.learning_rate(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with np.errstate(all="ignore"):     # an overflow is caught below, with a clear message
            self.optimizer.step()
        bad = _not_finite(named)
        if bad:
            for name, p in named.items():
                p.data[...] = before[name]
            self._stop(f"the updated weights of {', '.join(bad[:3])} are not finite (lr "
                       f"{lr:g}; the weights are put back as they were before this step)")
        self.step += 1
        updates = {name: p.data - before[name] for name, p in named.items()}
        tokens = int(np.prod(np.shape(batch[0])))
        return {"step": self.step, "loss": float(loss), "lr": lr, "grad_norm": float(norm),
                "tokens": tokens, **grad_norms,
                **_group_norms("update_norm:", updates, self.groups)}

    def _stop(self, what: str):
        where = (f"the last good checkpoint, {self.checkpoint_path} (step "
                 f"{self.last_checkpoint_step}), is intact" if self.last_checkpoint_step
                 is not None else "no checkpoint was written")
        raise TrainingStopped(f"step {self.step + 1}: {what}; training stopped and {where}")

    def evaluate(self) -> float:
        """Mean loss over the held-out batches, each weighted by its number of targets."""
        total, count = 0.0, 0
        for batch in self.eval_batches:
            with np.errstate(all="ignore"):     # a diverging run shows nan here, not warnings
                loss, cache = self.step_objective.forward(*batch)
            kept = int(cache.loss.count) if hasattr(cache, "loss") else \
                int(getattr(cache, "count", 1))             # a BatchSplit's SplitCache
            total += float(loss) * kept
            count += kept
        return total / count if count else float("nan")

    # -- the loop -------------------------------------------------------------------------------
    def run(self, steps: int | None = None, log: Callable[[str], None] | None = None) -> list:
        """Train until `steps` (default settings.steps) have been taken in all; returns the
        history rows added."""
        log = log or _terminal_log
        s = self.settings
        until = s.steps if steps is None else steps
        started, rows = time.perf_counter(), []
        first = self.step
        while self.step < until:
            step_started = time.perf_counter()
            row = self.train_step()
            row["seconds"] = time.perf_counter() - step_started
            if s.eval_every and self.eval_batches and (self.step % s.eval_every == 0
                                                       or self.step == until):
                row["eval_loss"] = self.evaluate()
            self.history.append(row)
            rows.append(row)
            if s.checkpoint_every and self.checkpoint_path and self.step % s.checkpoint_every \
                    == 0:
                self.save()
            if self.step % s.log_every == 0 or self.step == until or "eval_loss" in row:
                elapsed = time.perf_counter() - started
                rate = sum(r["tokens"] for r in rows) / max(elapsed, 1e-9)
                left = elapsed / (self.step - first) * (until - self.step)
                log(progress_line(row, until, rate, left))
        if self.checkpoint_path:
            self.save()
        return rows

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path=None) -> None:
        """Write the checkpoint (model, optimizer, step, Generator, settings, history). Weights
        that are not finite are never saved: that raises TrainingStopped, and the file on
        disk stays the last good one."""
        path = path or self.checkpoint_path
        bad = _not_finite(dict(self.model.named_parameters()))
        if bad:
            self._stop(f"the weights of {', '.join(bad[:3])} are not finite, so they are not "
                       "saved")
        columns, rows = self._history_table()
        meta = {"settings": asdict(self.settings), "history_columns": columns,
                **self.extra_meta}
        save_checkpoint(path, self.model, self.optimizer, self.step, self.rng, meta,
                        {**self.extra_arrays, "history": rows})
        if path == self.checkpoint_path:
            self.last_checkpoint_step = self.step

    def _history_table(self) -> tuple[list[str], np.ndarray]:
        """The history so far as (columns, (steps, columns) float64; NaN where a row has no
        value, e.g. the steps without an evaluation)."""
        rows = self.earlier_history + self.history
        columns = list(dict.fromkeys(key for row in rows for key in row))
        table = np.array([[float(row.get(key, np.nan)) for key in columns] for row in rows],
                         dtype=np.float64).reshape(len(rows), len(columns))
        return columns, table

    @classmethod
    def resume(cls, checkpoint: Checkpoint, objective_of: Callable[[Module], Module],
               sample_batch: Callable[[np.random.Generator], tuple], **kwargs) -> "Trainer":
        """A Trainer that continues exactly where `checkpoint` stopped: its model, optimizer
        state, step, settings and Generator."""
        settings = _saved_settings(checkpoint)
        bad = _not_finite(dict(checkpoint.model.named_parameters()))
        if bad:
            raise ValueError(f"the checkpoint's weights of {', '.join(bad[:3])} are not "
                             "finite; it cannot be resumed")
        objective = objective_of(checkpoint.model)
        optimizer = make_optimizer(checkpoint.model, settings)
        checkpoint.restore_optimizer(optimizer)
        extra = {key: value for key, value in checkpoint.arrays.items()
                 if not key.startswith(("param/", "optim/")) and key != "history"}
        kwargs.setdefault("extra_arrays", extra)
        kwargs.setdefault("extra_meta", {key: value for key, value in checkpoint.meta.items()
                                         if key not in CHECKPOINT_META})
        trainer = cls(objective, sample_batch, settings, optimizer=optimizer,
                      rng=checkpoint.generator(), step=checkpoint.step, **kwargs)
        trainer.last_checkpoint_step = checkpoint.step
        table = checkpoint.arrays.get("history")
        columns = checkpoint.meta.get("history_columns", [])
        if table is not None and table.shape == (table.shape[0], len(columns)):
            trainer.earlier_history = [
                {key: (int(value) if key in ("step", "tokens") else float(value))
                 for key, value in zip(columns, row) if value == value}
                for row in table if row[0] <= checkpoint.step]
        return trainer

    def write_history(self, path) -> None:
        """The loss history as CSV: step, loss, lr, grad_norm, tokens, seconds, eval_loss, then
        grad_norm:<group> and update_norm:<group> for every parameter group."""
        columns = ["step", "loss", "lr", "grad_norm", "tokens", "seconds", "eval_loss"]
        columns += [f"{kind}:{group}" for kind in ("grad_norm", "update_norm")
                    for group in self.groups]
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            for row in self.earlier_history + self.history:
                writer.writerow({key: row.get(key, "") for key in columns})


def _not_finite(named: dict, attribute: str = "data") -> list[str]:
    """The names of the parameters whose `attribute` (data or grad) holds an inf or NaN."""
    return [name for name, parameter in named.items()
            if not np.isfinite(getattr(parameter, attribute)).all()]


def progress_line(row: dict, total: int, tokens_per_second: float, seconds_left: float) -> str:
    line = (f"step {row['step']:>5}/{total}  loss {row['loss']:.4f}  lr {row['lr']:.2e}  "
            f"{tokens_per_second:,.0f} tok/s  {_duration(seconds_left)} left")
    if "eval_loss" in row:
        line += f"  eval {row['eval_loss']:.4f}"
    return line


def _duration(seconds: float) -> str:
    seconds = max(0, int(math.ceil(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _terminal_log(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def _saved_settings(checkpoint: Checkpoint) -> TrainSettings:
    """The TrainSettings a Trainer saved in `checkpoint`; a checkpoint without them (written by
    save_checkpoint alone) or with settings this version cannot take is a FileFormatError
    naming the file."""
    where = checkpoint.path or "checkpoint"
    saved = checkpoint.meta.get("settings")
    if not isinstance(saved, dict):
        raise bad_file(where, "meta holds no training settings to resume with",
                       "meta['settings'], as Trainer.save writes it",
                       type(saved).__name__)
    try:
        return TrainSettings(**saved)
    except (TypeError, ValueError) as error:
        raise bad_file(where, f"meta['settings'] are not TrainSettings ({error})") from None
