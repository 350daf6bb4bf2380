"""Check a backward against finite differences of its own forward, in float64.

The check is a numerical vector-Jacobian product. For a forward `out = f(x1, x2, ...)` and a
random upstream gradient g (never all ones: LayerNorm's input gradient is then exactly zero),
the scalar L = <g, f(x1, x2, ...)> has gradient dL/dxk = J_k^T g, which is what backward(g, cache)
must return. Central differences estimate each element:

    dL/dx[i] ~ (L(x + h e_i) - L(x - h e_i)) / 2h                       ("full" mode)

with h = step max(1, |x[i]|), so that an entry of 1e4 is not perturbed below its rounding
(for a Module, each perturbed forward recomputes only what lies downstream of the perturbed
Parameter and reuses the unperturbed rest: see _Downstream; and an objective with copy_losses,
the models' losses, evaluates up to 32 elements' L(x + h e_i) and L(x - h e_i) in one forward
of 64 copies of the batch, each copy's Parameter perturbed on its own: see _Copies),

or, for a whole model at the cost of two forwards per direction, one random direction v over all
checked tensors at once:

    <J^T g, v> ~ (L(x + h v) - L(x - h v)) / 2h                          ("fast" mode)

Usage, from any script (a student's own functions work the same way):

    from numpy_tf import gradcheck, layernorm_forward, layernorm_backward
    report = gradcheck(layernorm_forward, layernorm_backward, {"x": x, "weight": w, "bias": b})
    print(report)            # one row per tensor: errors, worst index, verdict
    assert report.passed

`forward(**inputs)` must return (out, cache) and `backward(g, cache)` the gradients: one array,
a tuple whose i-th entry belongs to the i-th float array among the inputs (None entries are
skipped), or a dict {name: gradient}. Integer and boolean inputs (ids, masks) are passed through
unchanged and never differentiated.
"""
from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.table import format_table
from ..core.tolerances import FD_STEP, FINITE_DIFFERENCE


@dataclass
class GradcheckRow:
    name: str
    shape: tuple
    max_abs_error: float        # max |analytic - numerical|
    max_rel_error: float        # max |a - n| / |n| over elements with n != 0
    worst_index: tuple | None   # the element that is furthest outside the tolerance
    norm_rel_error: float       # ||a - n|| / ||n||
    passed: bool
    zero: bool = False          # n is at finite-difference noise level (a gradient that is 0,
                                # e.g. a key bias's): norm_rel_error compares noise with noise

    def to_dict(self) -> dict:
        row = asdict(self)
        row["shape"] = list(self.shape)
        row["worst_index"] = None if self.worst_index is None else list(self.worst_index)
        return row


@dataclass
class GradcheckReport:
    title: str
    mode: str                   # "full" or "fast"
    rows: list[GradcheckRow]
    step: float = FD_STEP       # the finite-difference step asked for

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def max_abs_error(self) -> float:
        return max((row.max_abs_error for row in self.rows), default=0.0)

    @property
    def max_norm_rel_error(self) -> float:
        """The largest ||a - n|| / ||n|| over the rows whose gradient is not zero (a zero
        gradient's rows pass or fail on the elementwise test alone)."""
        return max((row.norm_rel_error for row in self.rows if not row.zero), default=0.0)

    def to_dict(self) -> dict:
        return {"title": self.title, "mode": self.mode, "passed": self.passed,
                "rows": [row.to_dict() for row in self.rows]}

    def __str__(self) -> str:
        tol = FINITE_DIFFERENCE
        header = (f"gradcheck {self.title}: {self.mode} finite differences in float64, step "
                  f"{self.step:g}; pass if |a - n| <= {tol.rtol:g}|n| + {tol.atol:g} max(1, S), "
                  "S = max|n| over all tensors")
        columns = ("tensor", "shape", "max abs err", "max rel err", "worst index",
                   "norm rel err", "verdict")
        table = [
            (row.name, str(row.shape), f"{row.max_abs_error:.2e}", f"{row.max_rel_error:.2e}",
             "-" if row.worst_index is None else str(row.worst_index),
             f"{row.norm_rel_error:.2e}", "pass" if row.passed else "FAIL")
            for row in self.rows]
        verdict = "all passed" if self.passed else \
            f"{sum(not row.passed for row in self.rows)} FAILED"
        return "\n".join([header, format_table(columns, table), verdict])


def compare_gradients(name: str, analytic: np.ndarray, numerical: np.ndarray,
                      skip: np.ndarray | None = None, scale: float | None = None) -> GradcheckRow:
    """One report row: the analytic gradient against its finite-difference estimate, over the
    elements not in `skip`. `scale` is the largest |n| over every tensor checked together
    (default: this tensor's)."""
    analytic = np.asarray(analytic, dtype=np.float64)
    numerical = np.asarray(numerical, dtype=np.float64)
    if analytic.shape != numerical.shape:
        return GradcheckRow(name, numerical.shape, math.inf, math.inf, None, math.inf, False)
    if skip is not None:
        analytic, numerical = np.where(skip, 0.0, analytic), np.where(skip, 0.0, numerical)
    error = np.abs(analytic - numerical)
    magnitude = np.abs(numerical)
    if scale is None:
        scale = float(magnitude.max(initial=0.0))
    allowed = FINITE_DIFFERENCE.allowed(numerical, scale)
    excess = np.where(np.isfinite(error), error / allowed, np.inf)
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(excess), excess.shape)) \
        if excess.size else None
    nonzero = magnitude > 0
    max_rel = float((error[nonzero] / magnitude[nonzero]).max(initial=0.0))
    norm = float(np.linalg.norm(numerical))
    norm_rel = float(np.linalg.norm(analytic - numerical)) / norm if norm else \
        float(np.linalg.norm(analytic))
    passed = bool((error <= allowed).all()) and bool(np.isfinite(analytic).all())
    zero = norm <= FINITE_DIFFERENCE.atol * max(1.0, scale) * math.sqrt(max(numerical.size, 1))
    return GradcheckRow(name, numerical.shape, float(error.max(initial=0.0)), max_rel, worst,
                        norm_rel, passed, zero)


# -- the objective L = <g, f(...)> ----------------------------------------------------------
def _objective(g: np.ndarray, call: Callable) -> Callable[[], float]:
    """L() = <g, call()[0]> = sum(g * out) in float64, g converted once (for a scalar output,
    a loss, the sum of its one term is that term)."""
    g = np.asarray(g, dtype=np.float64)
    if g.ndim == 0:
        return lambda: float(g * np.asarray(call()[0], dtype=np.float64))
    return lambda: float(np.sum(g * np.asarray(call()[0], dtype=np.float64)))


def _central_difference(objective: Callable[[], float], array: np.ndarray, index: int,
                        step: float) -> float:
    flat = array.reshape(-1)
    original = flat[index]
    h = step * max(1.0, abs(float(original)))   # relative for large entries (logits of 1e4)
    flat[index] = original + h
    plus = objective()
    flat[index] = original - h
    minus = objective()
    flat[index] = original
    return (plus - minus) / (2.0 * h)


def _one_at_a_time(objective: Callable[[], float], array: np.ndarray, mask: np.ndarray | None,
                   step: float) -> np.ndarray:
    """Every element's central difference, 0 where `mask` (constant) is set."""
    return np.array([0.0 if mask is not None and mask.flat[i] else
                     _central_difference(objective, array, i, step)
                     for i in range(array.size)]).reshape(array.shape)


def _full_report(title: str, numericals: Mapping[str, np.ndarray],
                 analytic: Mapping[str, np.ndarray], skip: Mapping[str, np.ndarray],
                 step: float = FD_STEP):
    scale = max(float(np.abs(n).max(initial=0.0)) for n in numericals.values())
    rows = []
    for name, numerical in numericals.items():
        mask = skip.get(name)
        label = name if mask is None else f"{name} ({int(mask.sum())} constant skipped)"
        rows.append(compare_gradients(label, analytic[name], numerical, mask, scale))
    return GradcheckReport(title, "full", rows, step)


def _directional(objective: Callable[[], float], arrays: Sequence[np.ndarray],
                 originals: Sequence[np.ndarray], directions: Sequence[np.ndarray],
                 step: float) -> float:
    """(L(x + step v) - L(x - step v)) / (2 step), the arrays (copies in `originals`) set to
    each point in turn and restored."""
    moves = [v * step for v in directions]
    for array, original, move in zip(arrays, originals, moves):
        np.add(original, move, out=array)
    plus = objective()
    for array, original, move in zip(arrays, originals, moves):
        np.subtract(original, move, out=array)
    minus = objective()
    for array, original in zip(arrays, originals):
        np.copyto(array, original)
    return (plus - minus) / (2.0 * step)


def _check(title: str, objective: Callable[[], float], tensors: Mapping[str, np.ndarray],
           analytic: Mapping[str, np.ndarray], fast: bool, directions: int, step: float,
           rng: np.random.Generator, skip: Mapping[str, np.ndarray],
           perturbing: Callable[[str], None] | None = None,
           buffer: np.ndarray | None = None) -> GradcheckReport:
    """Compare `analytic` with finite differences of `objective` over the float64 `tensors`
    (which the objective reads, and which are perturbed in place and restored bit for bit).
    Elements in `skip` (constant by definition) are neither perturbed nor compared.
    `perturbing(name)` is told which tensor the full mode is about to perturb. `buffer`, for
    the fast mode: the one array the tensors are views of, end to end in order
    (_laid_buffer), moved to each point with one operation instead of one per tensor."""
    if not fast:
        numericals = {}
        for name, array in tensors.items():
            if perturbing is not None:
                perturbing(name)
            numericals[name] = _one_at_a_time(objective, array, skip.get(name), step)
        return _full_report(title, numericals, analytic, skip, step)
    names = list(tensors)
    arrays = [tensors[name] for name in names]
    if buffer is not None:                  # one array to move: gradcheck_module laid them so
        arrays = [buffer]
    originals = [array.copy() for array in arrays]
    moved = step * max([1.0] + [float(np.abs(array).max(initial=0.0)) for array in arrays])
    # every tensor's direction is a piece of one draw (the same numbers as one draw per tensor,
    # in order), and <analytic, v> one dot product over the pieces laid end to end
    ends = np.cumsum([array.size for array in arrays])
    gradient = np.concatenate([np.asarray(analytic[name], dtype=np.float64).ravel()
                               for name in names])
    constant = np.concatenate([skip[name].ravel() if name in skip else
                               np.zeros(tensors[name].size, dtype=bool) for name in names])
    rows = []
    for k in range(directions):
        whole = rng.standard_normal(int(ends[-1]))
        whole[constant] = 0.0                           # skipped elements are not perturbed
        vs = [whole] if buffer is not None else \
            [piece.reshape(array.shape)
             for piece, array in zip(np.split(whole, ends[:-1]), arrays)]
        numerical = _directional(objective, arrays, originals, vs, moved)
        predicted = float(gradient @ whole)
        label = f"direction {k} over {len(names)} tensor{'s' * (len(names) != 1)}"
        rows.append(compare_gradients(label, np.array(predicted), np.array(numerical)))
    return GradcheckReport(title, "fast", rows, step)


def _laid_buffer(laid: Sequence[np.ndarray], arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The one buffer of `laid` (what _lay_end_to_end made) if `arrays` are those very views,
    in that order; else None (a module that put arrays of its own in place of its Parameters'
    is checked tensor by tensor)."""
    if not laid or len(laid) != len(arrays):
        return None
    buffer = laid[0].base
    if buffer is None or any(array is not view or view.base is not buffer
                             for array, view in zip(arrays, laid)):
        return None
    return buffer


def _lay_end_to_end(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Copies of the float64 `arrays` as views of one buffer, end to end in order: the fast
    check then moves them all to a point with one operation instead of one per tensor (a
    model's few dozen Parameters: 0.3 to 0.4 ms of a 4 to 7 ms check of the tiny GPT)."""
    buffer = np.concatenate([array.reshape(-1) for array in arrays]) if arrays else None
    views, start = [], 0
    for array in arrays:
        views.append(buffer[start:start + array.size].reshape(array.shape))
        start += array.size
    return views


def _gradients_by_name(grads, float_names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(grads, Mapping):
        return dict(grads)
    if isinstance(grads, np.ndarray) or grads is None:
        grads = (grads,)
    if not isinstance(grads, (tuple, list)):
        raise TypeError("backward must return the inputs' gradients: an array, a tuple or list "
                        "of them (one per float input, in order) or a dict by name; got "
                        f"{validate.kind_of(grads)}")
    return {name: g for name, g in zip(float_names, grads) if g is not None}


def _settings(seed, fast, directions, step) -> tuple[int, bool, int, float]:
    """A check's settings, each refused by name unless it is what it must be (a check of no
    direction would compare nothing and print 'all passed'; a step of 0 divides by zero)."""
    return (validate.non_negative_int("seed", seed), validate.flag("fast", fast),
            validate.positive_int("directions", directions),
            validate.number("step", step, low=0.0, low_open=True))


def _forward_result(result, title: str):
    """(out, cache) of a forward's first call, or a TypeError saying what it returned."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"{title}: forward must return a pair (out, cache); got "
                        f"{validate.kind_of(result)}")
    out = result[0]
    if not (_is_float(out) or isinstance(out, (float, np.floating))):
        raise TypeError(f"{title}: forward must return (out, cache) with out a float array or "
                        f"number; got out of {validate.kind_of(out)}"
                        + (f" (dtype {out.dtype})" if isinstance(out, np.ndarray) else ""))
    return result


def gradcheck(forward: Callable, backward: Callable, inputs, *, wrt: Sequence[str] | None = None,
              seed: int = 0, fast: bool = False, directions: int = 3, step: float = FD_STEP,
              title: str | None = None) -> GradcheckReport:
    """Check `backward` against finite differences of `forward` at `inputs` (a dict of keyword
    arguments, or a list of positional ones named input0, input1, ...).

    Float arrays are copied to float64 first; `wrt` restricts the check to some of them
    (e.g. not a float mask). Returns a GradcheckReport: print it, or test `.passed`.
    """
    seed, fast, directions, step = _settings(seed, fast, directions, step)
    positional = not isinstance(inputs, Mapping)
    named = {f"input{i}": v for i, v in enumerate(inputs)} if positional else dict(inputs)
    arguments = {name: value.astype(np.float64) if _is_float(value) else value
                 for name, value in named.items()}
    float_names = [name for name, value in named.items() if _is_float(value)]
    wrt = list(float_names if wrt is None else wrt)
    for name in wrt:
        if name not in float_names:
            raise ValueError(f"wrt names {name!r}, which is not a float array among the inputs "
                             f"({', '.join(float_names) or 'none'})")
    if not wrt:
        given = ", ".join(f"{name} {validate.kind_of(value)[2:]}" for name, value in named.items())
        raise ValueError("nothing to check: no float array among the inputs, or wrt is empty "
                         f"(got {given or 'no inputs'})")

    def call():
        return forward(*arguments.values()) if positional else forward(**arguments)

    rng = np.random.default_rng(seed)
    name = title or getattr(forward, "__name__", "forward")
    out, cache = _forward_result(call(), name)
    dout = rng.standard_normal(np.shape(out))
    grads = _gradients_by_name(backward(dout, cache), float_names)
    missing = [name for name in wrt if name not in grads]
    if missing:
        raise ValueError(f"backward returned no gradient for {', '.join(missing)}")
    objective = _objective(dout, call)
    return _check(name, objective, {n: arguments[n] for n in wrt}, grads, fast, directions,
                  step, rng, {})


_PLAIN = (type(None), bool, int, float, str, np.integer, np.floating)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, dtype and bytes (-0.0 is not 0.0, a NaN equals the same NaN). Numbers in
    contiguous arrays are compared as unsigned integers of their size, in place; anything else
    through a copy of its bytes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "biuf" and a.flags.c_contiguous and b.flags.c_contiguous:
        as_integers = np.dtype(f"u{a.dtype.itemsize}")
        return bool(np.array_equal(a.reshape(-1).view(as_integers),
                                   b.reshape(-1).view(as_integers)))
    return a.tobytes() == b.tobytes()


def _same_arguments(given: tuple, recorded: tuple, by_value: bool = True) -> bool:
    """The same inputs: arrays identical (the very object) or, if `by_value`, equal bit for
    bit; plain values (None, numbers, strings) equal. Anything else (a Generator) never
    matches."""
    if len(given) != len(recorded):
        return False
    for a, b in zip(given, recorded):
        if a is b and not isinstance(a, np.random.Generator):
            continue
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            if not by_value or not _same_bits(a, b):
                return False
        elif not (isinstance(a, _PLAIN) and type(a) is type(b) and a == b):
            return False
    return True


class _Downstream:
    """Evaluates a Module's forward only downstream of the perturbed tensor.

    Perturbing one Parameter changes the output of the modules that hold it and of those that
    read what they produce, nothing upstream. So a first, unperturbed forward records every
    module's (inputs, result); afterwards, a module that does not hold the perturbed Parameter
    and is called with the recorded inputs (the very arrays an upstream module returned again,
    or equal values) returns its recorded result without computing. Every objective value is
    still a real forward: the reused parts are the ones the perturbation cannot reach. This
    assumes what every Module here does: a forward reads only its inputs and its own
    Parameters, is deterministic, and its callers do not write into its output (recorded
    outputs are made read-only, so one that did would fail loudly instead of silently).

    Comparing a module's inputs with the record costs a pass over them. A module whose inputs
    are the recorded arrays themselves is reused at once; once a module's inputs differ in value
    for one element of a Parameter, the module lies downstream of that Parameter and is not
    compared again for the Parameter's other elements, only recomputed (computing is always
    right; only reuse needs the proof of equal inputs). A module holding the perturbed
    Parameter whose output comes out equal to the record (a row of an embedding that no id
    reads) returns the recorded output itself, so the modules downstream see their recorded
    inputs again."""

    def __init__(self, root: Module, parameters: Mapping[str, object]):
        self.parameters = parameters                # tensor name -> Parameter (inputs absent)
        self.root = root
        self.modules = [module for _, module in root.named_modules()
                        if callable(getattr(module, "forward", None))]
        self.recorded: dict[int, list] = {id(m): [] for m in self.modules}
        self.parents: dict[int, set[int]] = {}      # module -> the modules it is a child of
        for module in self.modules:
            for child in vars(module).values():
                if isinstance(child, Module):
                    self.parents.setdefault(id(child), set()).add(id(module))
        self.held: dict[int, set[int]] = {}         # Parameter -> the modules holding it
        for module in self.modules:
            for parameter in module.parameters():
                self.held.setdefault(id(parameter), set()).add(id(module))
        self.holding: set[int] = {id(m) for m in self.modules}   # hold the perturbed tensor
        self.compared: set[int] = set()     # not holding it, inputs not yet seen to differ
        self.direct: set[int] = set()       # hold it as an attribute of their own
        self.recording = True
        self.copies: _Copies | None = None  # set: the holders run each copy on its own

    def perturbing(self, name: str) -> None:
        """A Parameter's name, or an input's: an input is perturbed in place, the very array
        the record saw, so while one is perturbed nothing is reused."""
        parameter = self.parameters.get(name)
        everything = {id(m) for m in self.modules}
        self.holding = everything if parameter is None else self.held.get(id(parameter), set())
        self.compared = everything - self.holding
        self.direct = set() if parameter is None else {    # the modules it is an attribute of
            id(m) for m in self.modules if any(v is parameter for v in vars(m).values())}

    def _wrap(self, module: Module):
        # the class's own forward, under core's activation-recording wrapper (no recorder is
        # active during a check, and the wrapper's call counts at these sizes)
        method = type(module).forward
        forward, key = getattr(method, "__wrapped__", method).__get__(module), id(module)
        records = self.recorded[key]    # (inputs, keyword names, result, holds a Generator?)

        def replayed(*args, **kwargs):
            if self.recording:
                result = forward(*args, **kwargs)
                if isinstance(result, tuple) and result and isinstance(result[0], np.ndarray):
                    result[0].flags.writeable = False
                given = args + tuple(kwargs.values())
                records.append((given, tuple(kwargs), result, any(
                    isinstance(a, np.random.Generator) for a in given)))
                return result
            given = args + tuple(kwargs.values()) if kwargs else args
            if key not in self.holding:
                names = tuple(kwargs)
                for inputs, recorded_names, result, generator in records:
                    if not generator and len(given) == len(inputs) and \
                            all(map(operator.is_, given, inputs)) and names == recorded_names:
                        return result                   # the recorded arrays themselves
                if key in self.compared:
                    for inputs, recorded_names, result, _ in records:
                        if names == recorded_names and _same_arguments(given, inputs):
                            return result
                    self.compared.discard(key)  # downstream: recompute, no more comparing
                return forward(*args, **kwargs)
            if self.copies is not None and key in self.copies.units and \
                    not self.copies.running:
                result = self.copies.run(key, forward, args, kwargs)
            else:
                result = forward(*args, **kwargs)
            if key in self.direct and isinstance(result, tuple) and result and \
                    isinstance(result[0], np.ndarray):
                for _, _, recorded, _ in records:
                    if _same_arguments((result[0],), (recorded[0],)):
                        return recorded             # the perturbation did not reach the output
            return result
        return replayed

    def __enter__(self) -> "_Downstream":
        for module in self.modules:
            module.forward = self._wrap(module)             # an instance attribute
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            del module.forward                              # the class's forward again


class _NotBatchable(Exception):
    """Copies that cannot give the one-at-a-time numbers: a module that runs once per copy
    and cannot be cut, or an objective that is not a mean per copy."""


class _Copies:
    """`count` copies of the batch stacked on axis 0, copy k with its own element index[k] of
    one Parameter set to values[k] (-1: none).

    Every module sees `count` times the rows; upstream of the Parameter, _Downstream replays
    the stacked record. A module among `units` (those holding the Parameter) runs once per
    copy, on that copy's rows, with the copy's element set; its outputs, stacked again, are
    what `count` separate forwards would have fed downstream, and the objective's copy_losses
    gives the `count` objective values at once. While the copies run, the Parameter holds NaN
    everywhere else: a forward that reads it outside its units (a parent reading its child's
    weight into a fused kernel) gives NaN, not a wrong number."""

    def __init__(self, count: int, units: set[int], parameter):
        self.count = count
        self.units = units                  # the modules that run once per copy
        self.parameter = parameter
        self.real = parameter.data
        self.flat = self.real.reshape(-1)           # a view: the Parameter's own array
        self.poison = np.full_like(self.real, np.nan)
        self.index = np.full(count, -1)
        self.values = np.zeros(count)
        self.ran: set[int] = set()          # the units that have run
        self.running = False                # inside one: its children run as they are

    def __enter__(self) -> "_Copies":
        self.parameter.data = self.poison
        return self

    def __exit__(self, *exc) -> None:
        self.parameter.data = self.real

    def run(self, key: int, forward: Callable, args: tuple, kwargs: dict):
        arrays = [a for a in args + tuple(kwargs.values())
                  if isinstance(a, np.ndarray) and a.ndim]
        if not arrays or arrays[0].shape[0] % self.count:
            raise _NotBatchable
        rows = arrays[0].shape[0]                   # the first array input's rows are the batch
        size = rows // self.count

        def pieces(a):                              # the copies' rows, or `a` for every copy
            if isinstance(a, np.ndarray) and a.ndim and a.shape[0] == rows:
                return [a[k:k + size] for k in range(0, rows, size)]
            return [a] * self.count
        names, positional = tuple(kwargs), len(args)
        calls = zip(*map(pieces, args + tuple(kwargs.values()))) if args or kwargs \
            else [()] * self.count
        self.ran.add(key)
        flat, outputs = self.flat, []
        for index, value, call in zip(self.index.tolist(), self.values.tolist(), calls):
            self.parameter.data = self.real
            if index >= 0:
                original, flat[index] = flat[index], value
            self.running = True
            try:
                result = forward(*call) if not names else \
                    forward(*call[:positional], **dict(zip(names, call[positional:])))
            finally:
                self.running = False
                if index >= 0:
                    flat[index] = original
                self.parameter.data = self.poison
            if not (isinstance(result, tuple) and len(result) == 2 and
                    isinstance(result[0], np.ndarray) and result[0].ndim):
                raise _NotBatchable
            outputs.append(result[0])
        return np.concatenate(outputs), result[1]

    def climb(self, parents: Mapping[int, set], root: Module) -> bool:
        """Replace the units that never ran by their parents (SwiGLU for its Linears, which
        it does not call); False if every unit ran, or only the root is above."""
        stale = self.units - self.ran
        above = set().union(*(parents.get(unit, set()) for unit in stale))
        if not stale or not above or id(root) in above:
            return False
        self.units = (self.units - stale) | above
        self.ran.clear()
        return True


def _stacked(copies: int, inputs: Sequence, kwargs: Mapping):
    """`copies` copies of every array among the inputs that has the first one's batch on axis
    0, stacked on that axis; None if an input is a Generator (each forward draws anew)."""
    values = list(inputs) + list(kwargs.values())
    if any(isinstance(v, np.random.Generator) for v in values):
        return None
    batched = [v for v in values if isinstance(v, np.ndarray) and v.ndim]
    if not batched:
        return None
    batch = batched[0].shape[0]

    def stack(v):
        return np.concatenate([v] * copies) if isinstance(v, np.ndarray) and v.ndim and \
            v.shape[0] == batch else v
    return [stack(v) for v in inputs], {name: stack(v) for name, v in kwargs.items()}


def _agrees(values, reference: float, relative: float = 1e-12) -> bool:
    """Equal up to the rounding of a forward on more rows (1e-12 relative: a wrong cut of
    the copies moves the loss by far more)."""
    values = np.asarray(values, dtype=np.float64)
    return bool(np.all(np.abs(values - reference) <= relative * max(1.0, abs(reference))))


class _CopiesObjective:
    """The objective g * loss of `count` stacked copies of the batch at once, through the
    root's copy_losses: a (count,) array."""

    def __init__(self, root: Module, g, inputs: Sequence, kwargs: Mapping, count: int):
        self.root, self.g, self.count = root, float(g), count
        self.inputs, self.kwargs = _stacked(count, inputs, kwargs)

    @classmethod
    def for_module(cls, root: Module, g, inputs, kwargs, count: int | None = None
                   ) -> "_CopiesObjective | None":
        """None unless the root is an objective with copy_losses, its output a scalar, and
        no input a Generator. `count` by default: up to 32 elements' pairs, about 4096 input
        elements in all (a tiny model: 64 copies; a big one: 2)."""
        copy_losses = getattr(root, "copy_losses", None)
        if not callable(copy_losses) or np.ndim(g) or _stacked(2, inputs, kwargs) is None:
            return None
        if count is None:
            size = next(v for v in list(inputs) + list(kwargs.values())
                        if isinstance(v, np.ndarray) and v.ndim).size
            count = 2 * max(1, min(32, 2048 // max(size, 1)))
        return cls(root, g, inputs, kwargs, count)

    def __call__(self) -> np.ndarray:
        losses = self.root.copy_losses(self.count, *self.inputs, **self.kwargs)
        if np.shape(losses) != (self.count,):
            raise _NotBatchable                     # an objective that is not a mean per copy
        return self.g * np.asarray(losses, dtype=np.float64)


def _cut(copies: _Copies, objective: _CopiesObjective, replay: "_Downstream",
         reference: float) -> bool:
    """Make every copy's value, unperturbed, the batch's: the units climb past those that
    never ran while the Parameter is read outside them (a NaN) or the copies disagree."""
    while True:
        try:
            if _agrees(objective(), reference):
                return True
        except Exception:   # noqa: BLE001 - one at a time is always right
            pass
        if not copies.climb(replay.parents, replay.root):
            return False


def _differences_by_copies(objective: _CopiesObjective, replay: "_Downstream", name: str,
                           elements: np.ndarray, step: float, reference: float):
    """Central differences of the Parameter `name` at `elements`, two copies per element
    (+h, -h) and up to objective.count // 2 elements per forward; None if copies cannot
    give them (then the caller perturbs one element at a time)."""
    copies = _Copies(objective.count, set(replay.direct), replay.parameters[name])
    replay.copies = copies
    try:
        with copies:
            if not _cut(copies, objective, replay, reference):
                return None
            flat = copies.flat
            numerical = np.empty(len(elements))
            pairs = objective.count // 2
            for start in range(0, len(elements), pairs):
                chunk = elements[start:start + pairs]
                original = flat[chunk]
                h = step * np.maximum(1.0, np.abs(original))
                used = slice(0, 2 * len(chunk))
                copies.index[:] = -1
                copies.index[used] = np.repeat(chunk, 2)
                copies.values[0:2 * len(chunk):2] = original + h
                copies.values[1:2 * len(chunk):2] = original - h
                values = objective()[used]
                numerical[start:start + len(chunk)] = (values[0::2] - values[1::2]) / (2.0 * h)
            return numerical
    except Exception:       # noqa: BLE001 - a holder refusing its copy's rows, or one that
        return None         # cannot be cut (_NotBatchable): one at a time is always right
    finally:
        replay.copies = None


def gradcheck_module(module: Module, *inputs, wrt_inputs: bool = True, parameters: bool = True,
                     seed: int = 0, fast: bool = False, directions: int = 3,
                     step: float = FD_STEP, forward_kwargs: Mapping | None = None,
                     title: str | None = None) -> GradcheckReport:
    """Check a Module's backward for its float inputs and all its Parameters at once.

    The module is copied to float64 (the original is untouched). Input gradients are what
    backward returns (one array, or a tuple aligned with the float inputs); parameter gradients
    are read from Parameter.grad after zero_grad().
    """
    if not isinstance(module, Module):
        raise TypeError(f"module must be a numpy_tf Module; got {validate.kind_of(module)}")
    seed, fast, directions, step = _settings(seed, fast, directions, step)
    validate.flag("wrt_inputs", wrt_inputs)
    validate.flag("parameters", parameters)
    module = module.astype(np.float64)
    arguments = [value.astype(np.float64) if _is_float(value) else value for value in inputs]
    kwargs = dict(forward_kwargs or {})
    float_positions = [i for i, value in enumerate(arguments) if _is_float(value)]
    named = list(module.named_parameters()) if parameters else []
    if not named and not (wrt_inputs and float_positions):
        raise ValueError(f"nothing to check: {type(module).__name__} has no Parameter and no "
                         "float input among those chosen (wrt_inputs, parameters)")
    rng = np.random.default_rng(seed)
    if fast:            # the copies' arrays, in the order the check lists them, in one buffer
        moved = ([arguments[i] for i in float_positions] if wrt_inputs else []) + \
            [parameter.data for _, parameter in named]
        laid = _lay_end_to_end(moved)
        views = iter(laid)
        if wrt_inputs:
            for i in float_positions:
                arguments[i] = next(views)
        for _, parameter in named:
            parameter.data = next(views)

    def call():
        return module.forward(*arguments, **kwargs)

    out, cache = _forward_result(call(), title or type(module).__name__)
    dout = rng.standard_normal(np.shape(out))
    dinputs = module.backward(dout, cache)          # into the copy's fresh (zero) gradients
    if isinstance(dinputs, np.ndarray) or dinputs is None:
        dinputs = (dinputs,)
    tensors: dict[str, np.ndarray] = {}
    analytic: dict[str, np.ndarray] = {}
    if wrt_inputs:
        for k, position in enumerate(float_positions):
            name = f"input{position}"
            gradient = dinputs[k] if k < len(dinputs) else None
            if gradient is None:
                raise ValueError(f"{type(module).__name__}.backward returned no gradient for "
                                 f"float input {position}")
            tensors[name], analytic[name] = arguments[position], gradient.copy()
    for name, parameter in named:
        tensors[name], analytic[name] = parameter.data, parameter.grad.copy()
    objective = _objective(dout, call)
    skip = module.constant_elements() if parameters else {}
    title = title or type(module).__name__
    if fast:
        return _check(title, objective, tensors, analytic, fast, directions, step, rng, skip,
                      buffer=_laid_buffer(laid, list(tensors.values())))
    copies = _CopiesObjective.for_module(module, dout, arguments, kwargs) if parameters \
        else None
    return _full_module_check(title, module, objective, tensors, analytic, step, rng, skip,
                              copies=copies)


def _full_module_check(title, module, objective, tensors, analytic, step, rng, skip,
                       downstream: bool = True,
                       copies: _CopiesObjective | None = None) -> GradcheckReport:
    """The full mode on a Module, each perturbation evaluated downstream of its tensor only
    (_Downstream); with downstream=False, or if some caller writes into a module's output
    (the unperturbed record then fails on a read-only array), every perturbation runs the
    whole forward. With `copies`, the Parameters' elements are perturbed many at a time
    (_CopiesObjective), each Parameter for which that is shown to give its numbers."""
    if downstream:
        with _Downstream(module, dict(module.named_parameters())) as replay:
            try:
                reference = objective()                     # the unperturbed record
            except ValueError as error:
                if "read-only" not in str(error):
                    raise
            else:
                if copies is not None and not _records_copies(copies, reference):
                    copies = None
                replay.recording = False
                if copies is None:
                    return _check(title, objective, tensors, analytic, False, 0, step, rng,
                                  skip, replay.perturbing)
                numericals = {}
                for name, array in tensors.items():
                    replay.perturbing(name)
                    numericals[name] = _by_copies(copies, replay, objective, name, array,
                                                  skip.get(name), step, reference)
                return _full_report(title, numericals, analytic, skip, step)
    return _check(title, objective, tensors, analytic, False, 0, step, rng, skip)


def _records_copies(copies: _CopiesObjective, reference: float) -> bool:
    """Record the stacked unperturbed forward; True if every copy's value is the batch's.
    Any failure (an input check of the model refusing the stacked batch, an objective that
    is not a mean per copy) only means the elements are perturbed one at a time."""
    try:
        return _agrees(copies(), reference)
    except Exception:       # noqa: BLE001 - perturbing one at a time is always right
        return False


def _by_copies(copies: _CopiesObjective, replay: _Downstream, objective: Callable[[], float],
               name: str, array: np.ndarray, mask: np.ndarray | None, step: float,
               reference: float) -> np.ndarray:
    """One tensor's central differences, by copies where its holders allow it and where two
    of its elements (the largest difference, and the middle element) come out the same when
    computed again one at a time (up to the rounding of the objective: 1e-9 relative to
    max(1, the difference)); otherwise every element one at a time."""
    if name not in replay.parameters:                   # an input: one at a time
        return _one_at_a_time(objective, array, mask, step)
    elements = np.arange(array.size) if mask is None else np.flatnonzero(~mask.reshape(-1))
    numerical = _differences_by_copies(copies, replay, name, elements, step, reference)
    if numerical is None or not elements.size:
        return _one_at_a_time(objective, array, mask, step)
    for k in {int(np.argmax(np.abs(numerical))), len(elements) // 2}:
        single = _central_difference(objective, array, int(elements[k]), step)
        if not abs(numerical[k] - single) <= 1e-9 * max(1.0, abs(single)):
            return _one_at_a_time(objective, array, mask, step)
    full = np.zeros(array.size)
    full[elements] = numerical
    return full.reshape(array.shape)


def _is_float(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"
