"""An error budget for low precision: how far may a model computed in bf16, fp16 or fp32 (with
float32 accumulation) drift from numpy_tf's float64 case, tensor by tensor, before the
difference says "bug" rather than "rounding"?

    result = precision_compare("case.npz", "theirs_bf16.npz", "bf16")   # print(result)
    numpy-tf compare case.npz theirs_bf16.npz --precision bf16

The budget is measured, not assumed: numpy_tf runs the reference case's own model (meta model
and config, as `numpy-tf export` writes them) in float32 with its weights, its float inputs,
every module's output and every gradient passed between modules rounded to the format (round
to nearest, ties to even), once per seed:

- seed 0 rounds the case's values as they are;
- seed s > 0 first multiplies every value it rounds by (1 + e), e drawn uniformly from
  [-u, u] (u the format's unit roundoff, 2^-8 for bf16), so that values near a rounding
  boundary fall either way, as they do in an implementation that rounds at other points
  (inside its attention, at each residual sum) or accumulates in another order.

For each tensor the budget is FACTOR times the largest error of those runs against the float64
reference, separately for the largest elementwise error and for the root mean square error, and
at least FLOOR_ULPS units in the last place of the format at the tensor's largest value (for
the max) or at its root mean square (for the rms): a tensor of a few elements gives the runs
too few samples of rounding to bound it, and a value an implementation rounds once or twice
more than the emulation does (inside a fused operation) lands up to an ulp away. The loss, a
mean the emulation takes in float32 and rounds once, has LOSS_FLOOR_ULPS: an implementation
that takes it in the format rounds each term's log-softmax, the sum and the quotient too
(measured: torch's bf16 cross-entropy of bf16 logits lands up to 2.75 ulps from the exact
mean, over 300 draws each of 12, 100 and 1,000 terms; in the tiny GPT's case below, 2.6).
Their tensor is within the budget when both of its errors are; the first tensor in compare's
order (forward, then backward) beyond it is where a bug most likely is: everything before it
drifted no more than the format explains. A bug whose effect is smaller than the format's
rounding cannot be seen this way, and is not: eps 1e-3 instead of 1e-5 in a LayerNorm whose
input has variance 6 changes its output by 8e-5 relative, 50 times below bf16's unit roundoff.

Measured on torch runs of the tiny GPT (GPTConfig.tiny(); reference/gpt.py's TinyGPT through
run_torch(dtype=...)), 18 cases (seeds 0-5, the export's default weights, init_std 0.1 and
GPTConfig's own 0.02): a correct bf16 run is within budget in every tensor of every case (the
worst at 0.66 of its budget, the loss; every other tensor below 0.43), as are fp16 (worst 0.57)
and float32 runs against fp32 (0.63; with 4 seeds and a factor of 2 two of the 18 float32
runs had failed, at 1.2 times). With eps 1e-3 in blocks.1.norm1 at init_std 0.02 (that
LayerNorm's input has variance about 1e-3, so its output moves by about 30 %), act/blocks.1.norm1
is the first tensor beyond the budget in all 6 seeds, at 11 to 14 times it.

Rounding is exact, in NumPy: bf16 by rounding the float64 bit pattern's significand to 8 bits
(no double rounding through float32), with the float32 exponent range and its subnormals;
fp16 by NumPy's float16 conversion; fp32 by float32's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.module import Module, record_activations
from .case_file import Case
from ..core.table import format_table
from .compare import (GROUPS, kind_problem, missing_lines, one_sided_lines, read_theirs,
                      search_order, section)
from .export import EXPORTS, model_config

SEEDS = 8
FACTOR = 3.0        # how far beyond the worst emulated run a correct implementation may land
FLOOR_ULPS = 2.0    # and never less than this many units in the last place (see the text)
LOSS_FLOOR_ULPS = 4.0   # the loss: a mean taken in the format rounds three times more


def round_to_bfloat16(x) -> np.ndarray:
    """x rounded to bfloat16 (8 significant bits, float32's exponent range), round to nearest
    even, returned as float32 (every bfloat16 value is a float32 value)."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond 2^128: inf; NaN stays NaN
        x = np.asarray(x, dtype=np.float64)
        bits = x.view(np.uint64)
        dropped = np.uint64(45)                         # 52 - 7 stored significand bits
        lowest_kept = (bits >> dropped) & np.uint64(1)
        half = np.uint64((1 << 44) - 1)                 # a tie rounds up only to an even value
        rounded = ((bits + half + lowest_kept) & ~np.uint64((1 << 45) - 1)).view(np.float64)
        subnormal = np.abs(x) < 2.0 ** -126             # spacing 2^-133 below 2^-126
        rounded = np.where(subnormal, np.round(x * 2.0 ** 133) * 2.0 ** -133, rounded)
        rounded = np.where(np.isnan(x), np.nan, rounded)   # a NaN payload could clear to inf
        return rounded.astype(np.float32)


def round_to_float16(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float32)


def round_to_float32(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


@dataclass(frozen=True)
class Format:
    name: str
    round: Callable[[np.ndarray], np.ndarray]
    unit_roundoff: float                # half the spacing of the values just above 1

    def ulp(self, value: float) -> float:
        """The spacing of the format's values at |value| (normal range): 2^e 2u for
        2^e <= |value| < 2^(e+1); 0 at 0."""
        if value == 0.0 or not np.isfinite(value):
            return 0.0
        _, exponent = np.frexp(abs(value))                 # |value| = m 2^exponent, m in [1/2, 1)
        return float(np.ldexp(2.0 * self.unit_roundoff, int(exponent) - 1))


FORMATS = {"bf16": Format("bf16", round_to_bfloat16, 2.0 ** -8),
           "fp16": Format("fp16", round_to_float16, 2.0 ** -11),
           "fp32": Format("fp32", round_to_float32, 2.0 ** -24)}


def _rounder(fmt: Format, seed: int) -> Callable:
    """value -> value rounded to the format (seed > 0: after the random relative nudge)."""
    g = np.random.default_rng(seed)

    def to_format(value):
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
            return value
        if seed:
            value = value * (1.0 + fmt.unit_roundoff * g.uniform(-1.0, 1.0, value.shape))
        return fmt.round(value)
    return to_format


class rounding_every_module:
    """with rounding_every_module(model, to_format): every module's forward output, the
    gradient each backward receives and every array it returns pass through to_format.
    `kinds` limits it to forward or backward; wrappers nest (each restores what it found)."""

    def __init__(self, model: Module, to_format: Callable, kinds=("forward", "backward")):
        self.model, self.to_format, self.kinds = model, to_format, tuple(kinds)
        self._before: list[tuple[Module, str, object]] = []

    def _forward(self, method):
        def forward(*args, **kwargs):
            out, cache = method(*args, **kwargs)
            return self.to_format(out), cache
        return forward

    def _backward(self, method):
        def backward(dout, *args, **kwargs):
            grads = method(self.to_format(dout), *args, **kwargs)
            if isinstance(grads, tuple):
                return tuple(self.to_format(g) for g in grads)
            return self.to_format(grads)
        return backward

    def __enter__(self):
        for _, module in self.model.named_modules():
            for kind in self.kinds:
                if hasattr(module, kind):
                    self._before.append((module, kind, vars(module).get(kind)))
                    wrap = self._forward if kind == "forward" else self._backward
                    setattr(module, kind, wrap(getattr(module, kind)))
        return self

    def __exit__(self, *exc) -> None:
        for module, kind, before in reversed(self._before):
            if before is None:
                del vars(module)[kind]
            else:
                setattr(module, kind, before)
        self._before.clear()


def _case_model(case: Case, dtype: np.dtype) -> tuple[Module, Module]:
    """(model, objective) of a case written by export_case, built from its meta in `dtype`
    (weights still to be loaded)."""
    family, config = model_config(case.meta["model"], case.meta["config"])
    network = family.model_class(config, dtype=dtype)
    return network, (EXPORTS[family.name].objective or family.objective)(network)


def emulate(case: Case, fmt: Format, seed: int = 0) -> dict[str, np.ndarray]:
    """The case's model run in float32 with every value rounded to `fmt` (see the module
    text): {key: array} under the case's keys (param/, input/, act/, output/logits, loss,
    grad_act/, grad/)."""
    model = case.meta.get("model")
    if case.meta.get("level") != "model" or model is None:
        raise ValueError("the precision budget reruns the reference case's model from its meta "
                         "(model, config): give a case written by `numpy-tf export`; this one "
                         f"has kind {case.meta.get('kind')!r}, level {case.meta.get('level')!r}")
    network, objective = _case_model(case, np.dtype(np.float32))
    to_format = _rounder(fmt, seed)
    params = {name: to_format(value) for name, value in case.section("param").items()}
    network.load_state_dict(params)
    inputs = {name: to_format(value) for name, value in case.section("input").items()}
    # the recorder sees each output after it is rounded, and each gradient as its module
    # receives it (rounded): forward rounding inside the recorder, backward rounding outside
    with rounding_every_module(network, to_format, ["forward"]), \
            record_activations(network) as recorder, \
            rounding_every_module(network, to_format, ["backward"]):
        loss, cache = objective.forward(**inputs)
        network.zero_grad()
        objective.backward(1.0, cache)
    arrays = {f"param/{name}": value for name, value in params.items()}
    arrays.update({f"input/{name}": value for name, value in inputs.items()})
    arrays.update({f"act/{name}": value for name, value in recorder.activations.items()})
    arrays["output/logits"] = to_format(cache.logits)
    arrays["loss"] = to_format(np.asarray(loss))
    arrays.update({f"grad_act/{name}": value for name, value in recorder.gradients.items()})
    arrays.update({f"grad/{name}": to_format(value) for name, value in
                   network.grad_dict().items()})
    return arrays


def _max_rms(values: np.ndarray) -> tuple[float, float]:
    """(largest |value|, root mean square) in float64; (0, 0) for an empty array."""
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return 0.0, 0.0
    return float(np.abs(values).max()), float(np.sqrt(np.mean(values ** 2)))


def _errors(values: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(largest |values - reference|, root mean square of values - reference)."""
    return _max_rms(np.asarray(values, np.float64) - np.asarray(reference, np.float64))


@dataclass
class BudgetRow:
    key: str
    shape: tuple
    max_error: float                    # theirs against the float64 reference
    rms_error: float
    max_budget: float                   # FACTOR x the worst emulated run
    rms_budget: float
    within: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__, shape=list(self.shape))


@dataclass
class PrecisionComparison:
    reference: str
    theirs: str
    format: str
    seeds: int
    factor: float
    rows: list[BudgetRow] = field(default_factory=list)       # in compare's search order
    only_reference: list[str] = field(default_factory=list)
    only_theirs: list[str] = field(default_factory=list)
    allow_missing: bool = False

    @property
    def first_beyond(self) -> BudgetRow | None:
        return next((row for row in self.rows if not row.within), None)

    @property
    def missing(self) -> list[str]:
        """The reference's tensors without a counterpart that fail the comparison."""
        return [] if self.allow_missing else self.only_reference

    @property
    def passed(self) -> bool:
        return self.first_beyond is None and not self.missing

    def to_dict(self) -> dict:
        first = self.first_beyond
        return {"reference": self.reference, "theirs": self.theirs, "precision": self.format,
                "seeds": self.seeds, "factor": self.factor, "passed": self.passed,
                "first_beyond_budget": None if first is None else first.key,
                "tensors": [row.to_dict() for row in self.rows],
                "only_in_reference": self.only_reference, "only_in_theirs": self.only_theirs,
                "allow_missing": self.allow_missing, "missing": self.missing}

    def __str__(self) -> str:
        lines = [f"numpy-tf compare --precision {self.format}: {self.reference} (float64 "
                 f"reference) vs {self.theirs}",
                 f"budget per tensor: {self.factor:g} x the largest error of numpy_tf run with "
                 f"every value rounded to {self.format} ({self.seeds} seeds), at least "
                 f"{FLOOR_ULPS:g} ulps; within if both the max and the rms error are"]
        table = []
        for row in self.rows:
            table.append((row.key, str(row.shape), f"{row.max_error:.1e}",
                          f"{row.max_budget:.1e}", f"{row.rms_error:.1e}",
                          f"{row.rms_budget:.1e}",
                          "within" if row.within else "BEYOND (likely a bug)"))
        lines.append(format_table(("tensor", "shape", "max err", "budget", "rms err", "budget",
                                   "verdict"), table))
        lines += one_sided_lines(self.only_reference, self.only_theirs)
        first = self.first_beyond
        if first is None:
            lines.append(f"every shared tensor is within what {self.format} rounding explains"
                         + (", but that is not a pass:" if self.missing else ""))
        else:
            beyond = sum(not row.within for row in self.rows)
            lines.append(f"first beyond the budget: {first.key} (max error {first.max_error:.1e}"
                         f", budget {first.max_budget:.1e}; rms {first.rms_error:.1e}, budget "
                         f"{first.rms_budget:.1e}): everything before it drifted no more than "
                         f"{self.format} explains, so a bug most likely starts here; {beyond} "
                         f"of {len(self.rows)} tensors are beyond their budget")
        lines += missing_lines(self.missing, len(self.rows) + len(self.only_reference),
                               self.only_reference, self.only_theirs)
        return "\n".join(lines)


def precision_compare(reference, theirs, precision: str, seeds: int = SEEDS,
                      factor: float = FACTOR, *, allow_missing: bool = False
                      ) -> PrecisionComparison:
    """Judge the case file `theirs` (an implementation computing in `precision`) against the
    float64 case `reference` by the measured budget (see the module text). As in
    compare_files, a reference tensor theirs lacks fails unless `allow_missing`."""
    if precision not in FORMATS:
        raise ValueError(f"precision must be one of {', '.join(FORMATS)}; got {precision!r}")
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer; got {seeds!r}")
    reference_case = Case.load(reference)
    if reference_case.meta.get("dtype") != "float64":
        raise ValueError(f"the reference must be a float64 case (numpy-tf export --dtype "
                         f"float64); {reference} is {reference_case.meta.get('dtype')}")
    _, their_arrays = read_theirs(theirs)
    fmt = FORMATS[precision]
    runs = [emulate(reference_case, fmt, seed) for seed in range(seeds)]
    ours = reference_case.arrays
    shared = search_order([key for key in ours if key in their_arrays and
                           section(key) in GROUPS], list(ours))
    result = PrecisionComparison(str(reference), str(theirs), precision, seeds, factor,
                                 allow_missing=allow_missing)
    for key in shared:
        if kind_problem(ours[key], their_arrays[key]):                # shape or int vs float
            result.rows.append(BudgetRow(key, np.shape(ours[key]), np.inf, np.inf, 0.0, 0.0,
                                         False))
            continue
        emulated = [_errors(run[key], ours[key]) for run in runs if key in run]
        largest, rms = _max_rms(ours[key])
        ulps = LOSS_FLOOR_ULPS if key == "loss" else FLOOR_ULPS
        max_budget = max(factor * max((e[0] for e in emulated), default=0.0),
                         ulps * fmt.ulp(largest))
        rms_budget = max(factor * max((e[1] for e in emulated), default=0.0),
                         ulps * fmt.ulp(rms))
        max_error, rms_error = _errors(their_arrays[key], ours[key])
        within = max_error <= max_budget and rms_error <= rms_budget
        result.rows.append(BudgetRow(key, np.shape(ours[key]), max_error, rms_error,
                                     max_budget, rms_budget, bool(within)))
    result.only_reference = [key for key in ours if key not in their_arrays]
    result.only_theirs = [key for key in their_arrays if key not in ours]
    return result
