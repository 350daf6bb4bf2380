"""Pictures of a training run, from the history.csv a Trainer writes (`numpy-tf train --out DIR`
writes DIR/history.csv): the loss, on the training batches and held out, and each parameter
group's gradient and update norms, step by step.

    history = read_history("numpy_tf_run")           # {column: (steps,) float array}
    plot_loss(history, path="loss.png")
    plot_norms(history, path="norms.png")
"""
from __future__ import annotations

import csv
import os

import numpy as np

from ..core.npz import bad_file, file_path
from .figure import check_path, finish, new_figure

GROUP_KINDS = ("grad_norm", "update_norm")


def read_history(path) -> dict[str, np.ndarray]:
    """{column: float array, one entry per step} from a history.csv, or from the run folder
    that holds one; an empty cell (a step without evaluation) reads as NaN."""
    path = file_path(path)
    if path.is_dir():
        path = path / "history.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no history file at {path} (numpy-tf train --out DIR writes "
                                "DIR/history.csv)")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as error:
        raise bad_file(path, f"not a CSV text file ({error})") from None
    if "step" not in columns or "loss" not in columns:
        raise bad_file(path, "not a training history: it has no step and loss columns",
                       "step, loss, ...", ", ".join(columns) or "no columns")
    if not rows:
        raise bad_file(path, "holds no steps", "one row per step", "none")
    if any(None in row for row in rows):
        line = next(number for number, row in enumerate(rows, 2) if None in row)
        raise bad_file(path, f"line {line} has more cells than the header",
                       f"{len(columns)} cells", "more")
    try:
        return {column: np.array([float(row[column]) if row[column] not in ("", None)
                                  else np.nan for row in rows]) for column in columns}
    except ValueError as error:
        raise bad_file(path, f"a cell is not a number ({error})") from None


def _history(history, needs: tuple = ("step", "loss")) -> dict[str, np.ndarray]:
    """read_history's dict (or one like it: a 1-D array of numbers per column, the columns
    `needs` among them, all of one length), or the history.csv or run folder it reads."""
    if not isinstance(history, dict):
        if not isinstance(history, (str, os.PathLike)):
            raise TypeError("history must be read_history's dict, a history.csv or a run "
                            f"folder; got {type(history).__name__}")
        return read_history(history)
    if any(column not in history for column in needs):
        raise ValueError(f"history must hold the columns {' and '.join(needs)} "
                         f"(read_history's dict); got "
                         f"{', '.join(map(repr, history)) or 'no columns'}")
    columns = {}
    for column, values in history.items():
        try:
            columns[column] = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"history[{column!r}] must be numbers, one per step; got "
                            f"{type(values).__name__}") from None
    steps = columns["step"].shape
    for column, values in columns.items():
        if values.ndim != 1 or values.shape != steps:
            raise ValueError(f"history[{column!r}] must be one number per step, as step "
                             f"{steps}; got shape {values.shape}")
    return columns


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the `window` values centred on each one (fewer at the two ends), so the
    curve does not lag behind the values it summarises."""
    sums = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(len(values))
    starts = np.maximum(0, index - window // 2)
    ends = np.minimum(len(values), index - window // 2 + window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def plot_loss(history, *, path=None, title: str = "training run"):
    """The training loss at every step (thin), its centred running mean, and the held-out loss
    at the evaluation steps, against the step. `history`: read_history's dict, a history.csv
    or a run folder. Returns the Figure (one axes); saves it to `path` if given (.png or
    .svg)."""
    path = check_path(path)
    history = _history(history)
    steps, loss = history["step"], history["loss"]
    figure = new_figure(7.0, 4.2)
    axes = figure.add_subplot()
    window = max(1, len(steps) // 25)
    axes.plot(steps, loss, color="tab:blue", alpha=0.3, linewidth=0.8,
              label="training batch" if window > 1 else "training")
    if window > 1:
        axes.plot(steps, smoothed(loss, window), color="tab:blue", linewidth=1.8,
                  label=f"training, mean of {window} steps around each")
    held_out = history.get("eval_loss")
    if held_out is not None and np.isfinite(held_out).any():
        kept = np.isfinite(held_out)
        axes.plot(steps[kept], held_out[kept], "o-", color="tab:orange", linewidth=1.8,
                  markersize=4, label="held out")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss (nats per token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    return finish(figure, path)


def group_columns(history: dict, kind: str) -> dict[str, np.ndarray]:
    """{group: column} for the columns "<kind>:<group>" (kind grad_norm or update_norm)."""
    return {column.split(":", 1)[1]: values for column, values in history.items()
            if column.startswith(kind + ":")}


def _is_block(group: str) -> bool:
    return any(part.isdigit() for part in group.split("."))


def _colors(groups: list[str]) -> dict:
    """Blocks from dark (first) to light (last) along viridis; the other groups apart."""
    from matplotlib import colormaps              # present: a figure has been made

    blocks = [group for group in groups if _is_block(group)]
    shades = np.linspace(0.0, 0.85, len(blocks)) if len(blocks) > 1 else [0.4]
    others = ["black", "tab:red", "tab:brown", "tab:pink", "tab:gray", "tab:olive"]
    colors = {group: colormaps["viridis"](x) for group, x in zip(blocks, shades)}
    rest = [group for group in groups if not _is_block(group)]
    colors.update({group: others[i % len(others)] for i, group in enumerate(rest)})
    return colors


def plot_norms(history, *, path=None):
    """Each parameter group's gradient norm (before clipping) and update norm
    ||p_after - p_before|| against the step, one line per group, on log scales: a block whose
    gradients vanish or explode, or that stops moving, stands out. `history` as in plot_loss.
    Returns the Figure (two axes); saves it to `path` if given (.png or .svg)."""
    path = check_path(path)
    history = _history(history, needs=("step",))
    found = {kind: group_columns(history, kind) for kind in GROUP_KINDS}
    if not found["grad_norm"] or not found["update_norm"]:
        raise ValueError("the history has no grad_norm:<group> and update_norm:<group> "
                         "columns (a history written before they were recorded); train again "
                         "to record them")
    groups = list(found["grad_norm"])
    figure = new_figure(9.0, 6.0)
    top = figure.add_subplot(2, 1, 1)
    bottom = figure.add_subplot(2, 1, 2, sharex=top)
    colors = _colors(groups)
    for axes, kind, label in ((top, "grad_norm", "gradient norm (before clipping)"),
                              (bottom, "update_norm", "update norm ||p' - p||")):
        for group, values in found[kind].items():
            axes.plot(history["step"], values, color=colors.get(group, "black"), linewidth=1.2,
                      linestyle="-" if _is_block(group) else "--", label=group)
        axes.set_yscale("log")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3, which="both")
    top.set_title("per parameter group (solid: blocks, from first to last; dashed: the rest)")
    bottom.set_xlabel("step")
    top.legend(loc="center left", bbox_to_anchor=(1.01, 0.0), fontsize=8, frameon=False)
    return finish(figure, path)
