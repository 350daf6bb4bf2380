"""Grade a student's own versions of numpy_tf's pure layer functions.

    report = grade("homework.py")      # print(report), report.to_dict(), report.passed

The submission is a Python file defining some of `<layer>_forward(...)` / `<layer>_backward(dout,
cache)` with numpy_tf's names and signatures (the layers of numpy_tf.teaching.layer_table). It is
imported by path into a fresh module namespace; a function counts as the student's only if
the file itself defines it (one imported from numpy_tf is not graded).

Every graded function is run on the layer's edge cases in float64 (T = 1, size-1 axes, fully
masked attention rows, repeated embedding ids, ignored targets, rows of near-zero variance, ...)
and on its first case in float32. A case passes when

- the function returns what numpy_tf's returns: a tuple of the same length (None where numpy_tf
  gives None), arrays of the same shape and dtype, finite where numpy_tf's are;
- every array agrees with numpy_tf's within tolerances.TORCH["layer", dtype] (scale S = the
  largest |value| among numpy_tf's arrays of the case; tolerances.py says why);
- a backward leaves `dout` unchanged, and (float64) passes numpy_tf.gradcheck against finite
  differences of numpy_tf's own forward (the cache comes from the student's forward if the file
  defines one: a backward is checked together with the forward that feeds it).

Points: 1 per case passed. A syntax error or an exception while importing fails every function
the file defines with that one message; an exception, a wrong shape or dtype, or a NaN fails the
case it happens in and never stops the grader. Output the submission prints is swallowed. Each
call into the submission has a time limit (10 s by default; `numpy-tf grade --time-limit S`):
a call still running then fails its case ("still running after 10 s"), and the grader goes on.

The reference functions and their results are captured before the submission is imported, so
a file that rebinds numpy_tf's names cannot change the reference. This is not a sandbox: run
untrusted files inside one.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.machinery
import importlib.util
import io
import itertools
import re
import signal
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checking.finite_differences import gradcheck
from ..checking.fixtures import compare_arrays
from ..core.table import format_table
from ..core.tolerances import torch_tolerance
from .layer_table import LAYERS, EdgeCase, LayerSpec, gradient_dict

# captured when numpy_tf.grading is imported, before any submission: (spec, forward, backward)
_REFERENCE = {name: (spec, spec.forward, spec.backward) for name, spec in LAYERS.items()}
_SUBMISSIONS = itertools.count()


def _finite(value: float) -> float | None:
    """JSON has no inf: a case that could not be compared has None."""
    return float(value) if np.isfinite(value) else None


@dataclass
class CaseResult:
    case: str
    dtype: str
    passed: bool
    max_abs_error: float            # against numpy_tf's result (inf: could not compare)
    fd_norm_rel_error: float | None  # ||a - n|| / ||n|| of the finite-difference check, if run
    message: str = ""


@dataclass
class FunctionResult:
    function: str
    possible: int                   # one point per case
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None        # the whole file failed (syntax error, import exception)

    @property
    def points(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def passed(self) -> bool:
        return self.error is None and all(case.passed for case in self.cases)

    @property
    def first_failure(self) -> str:
        if self.error:
            return self.error
        failing = [case for case in self.cases if not case.passed]
        return f"{failing[0].case} ({failing[0].dtype}): {failing[0].message}" if failing else ""

    def to_dict(self) -> dict:
        return {"function": self.function, "passed": self.passed, "points": self.points,
                "possible": self.possible, "error": self.error,
                "cases": [{**case.__dict__, "max_abs_error": _finite(case.max_abs_error)}
                          for case in self.cases]}


@dataclass
class GradeReport:
    submission: str
    functions: list[FunctionResult]

    @property
    def passed(self) -> bool:
        return all(function.passed for function in self.functions)

    def to_dict(self) -> dict:
        return {"submission": self.submission, "passed": self.passed,
                "points": sum(f.points for f in self.functions),
                "possible": sum(f.possible for f in self.functions),
                "functions": [f.to_dict() for f in self.functions]}

    def __str__(self) -> str:
        total = self.to_dict()
        rows = []
        for f in self.functions:
            errors = [c.max_abs_error for c in f.cases if np.isfinite(c.max_abs_error)]
            fds = [c.fd_norm_rel_error for c in f.cases if c.fd_norm_rel_error is not None]
            rows.append((f.function, f"{f.points}/{f.possible}", str(f.points),
                         f"{max(errors):.1e}" if errors else "-",
                         f"{max(fds):.1e}" if fds else "-",
                         "pass" if f.passed else f"FAIL: {f.first_failure}"))
        failed = sum(not f.passed for f in self.functions)
        return "\n".join(
            [f"numpy-tf grade {self.submission}: 1 point per case passed",
             "worst error: max |yours - numpy_tf's|; finite-diff: max ||a - n|| / ||n|| of your "
             "backward against finite differences of numpy_tf's forward"]
            + [format_table(("function", "cases", "points", "worst error", "finite-diff",
                             "verdict"), rows)]
            + [f"{len(self.functions) - failed} passed, {failed} failed; "
               f"{total['points']}/{total['possible']} points"])


# -- running the student's code -------------------------------------------------------------
def _describe(error: BaseException, path: str) -> str:
    """`Type: message (line N)`, N the last line of the submission in the traceback."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno}); nothing in the file can run"
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename) == Path(path)]
    where = f" (line {lines[-1]})" if lines else ""
    message = f": {error}" if str(error) else ""
    return f"{type(error).__name__}{message}{where}"


class TimeLimitExceeded(BaseException):
    """A call into the submission ran past the time limit. A BaseException, so that a
    submission's own `except Exception` cannot swallow it."""


STUDENT_ERRORS = (Exception, SystemExit, TimeLimitExceeded)   # what a submission may raise


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise TimeLimitExceeded in the code running inside after `seconds` (and every 0.1 s
    after that, until it leaves), through SIGALRM: on the main thread of a Unix process only;
    elsewhere, and with None, there is no limit. A single NumPy call cannot be interrupted:
    the limit strikes when it returns."""
    usable = seconds is not None and hasattr(signal, "setitimer") and \
        threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TimeLimitExceeded(f"still running after {seconds:g} s (the time limit of each "
                                "call; an endless loop?)")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.1)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _student(time_limit: float | None):
    """Around every call into the submission: its prints and NumPy warnings do not reach the
    report (or break --json), and it has `time_limit` seconds."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), \
            np.errstate(all="ignore"), _time_limit(time_limit):
        warnings.simplefilter("ignore")
        yield


def load_submission(path, time_limit: float | None = None) -> tuple[object | None, str | None]:
    """(module, None), or (None, the message) when the file cannot be imported (within
    `time_limit` seconds)."""
    path = str(Path(path).resolve())
    name = f"numpy_tf_submission_{next(_SUBMISSIONS)}"
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    module.__file__ = path
    sys.modules[name] = module              # dataclasses and typing look their module up
    try:
        with _student(time_limit):
            loader.exec_module(module)
    except STUDENT_ERRORS as error:
        return None, _describe(error, path)
    finally:
        sys.modules.pop(name, None)
    return module, None


def _names_in(text: str) -> list[str]:
    """The graded functions a file defines, read from its text (for a file that cannot run)."""
    known = {f"{layer}_{kind}" for layer in _REFERENCE for kind in ("forward", "backward")}
    return [name for name in re.findall(r"^def\s+(\w+)\s*\(", text, re.M) if name in known]


# -- checking one case ------------------------------------------------------------------------
@dataclass
class _Prepared:
    """One case with numpy_tf's results, computed before the submission is imported."""
    edge: EdgeCase
    dtype: np.dtype
    inputs: dict
    out: np.ndarray
    cache: tuple
    dout: np.ndarray
    grads: object


def _prepare(spec: LayerSpec, forward, backward) -> list[_Prepared]:
    prepared = []
    plan = [(edge, np.dtype(np.float64)) for edge in spec.cases]
    plan.append((spec.cases[0], np.dtype(np.float32)))
    for index, (edge, dtype) in enumerate(plan):
        inputs = spec.case_inputs(edge, dtype, seed=index)
        out, cache = spec.call(forward, copy.deepcopy(inputs))
        dout = np.random.default_rng(1000 + index).standard_normal(np.shape(out)).astype(dtype)
        grads = backward(dout.copy(), copy.deepcopy(cache))
        prepared.append(_Prepared(edge, dtype, inputs, out, cache, dout, grads))
    return prepared


def _check_arrays(expected, got, dtype: np.dtype, names: tuple[str, ...]) -> tuple[float, str]:
    """(max abs error, "" or the first problem) of what a function returned."""
    tolerance = torch_tolerance(dtype, "layer")
    expected_t = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(expected, tuple) and not isinstance(got, (tuple, list)):
        return np.inf, f"must return a tuple of {len(expected)} ({', '.join(names)}); got " \
                       f"{type(got).__name__}"
    got_t = tuple(got) if isinstance(expected, tuple) else (got,)
    if len(got_t) != len(expected_t):
        return np.inf, f"must return {len(expected_t)} values; got {len(got_t)}"
    scale = max((float(np.abs(e).max(initial=0.0)) for e in expected_t if e is not None),
                default=0.0)
    worst = 0.0
    for name, e, g in zip(names, expected_t, got_t):
        if e is None or g is None:
            if (e is None) != (g is None):
                return np.inf, f"{name} must be {'None' if e is None else 'an array'}; got " \
                               f"{'None' if g is None else type(g).__name__}"
            continue
        if not isinstance(g, np.ndarray):
            return np.inf, f"{name} must be a numpy array; got {type(g).__name__}"
        if g.shape != e.shape:
            return np.inf, f"{name} has shape {g.shape}; expected {e.shape}"
        if g.dtype != e.dtype:
            return np.inf, f"{name} has dtype {g.dtype}; expected {e.dtype} (dtype in = dtype out)"
        if not np.isfinite(g[np.isfinite(e)]).all():
            position = tuple(int(i) for i in np.argwhere(~np.isfinite(g) & np.isfinite(e))[0])
            return np.inf, f"{name} is {g[position]} at {position}"
        result = compare_arrays(name, g, e, tolerance, scale)
        worst = max(worst, result.max_abs_error)
        if not result.passed:
            return worst, f"{name} differs from numpy_tf's by {result.max_abs_error:.1e} at " \
                          f"{result.worst_index}"
    return worst, ""


def _grade_forward(spec, function, case: _Prepared, path: str,
                   time_limit: float | None) -> CaseResult:
    label = (case.edge.name, case.dtype.name)
    try:
        with _student(time_limit):
            result = spec.call(function, copy.deepcopy(case.inputs))
    except STUDENT_ERRORS as error:
        return CaseResult(*label, False, np.inf, None, _describe(error, path))
    if not isinstance(result, tuple) or len(result) != 2:
        return CaseResult(*label, False, np.inf, None, "must return (out, cache)")
    error, problem = _check_arrays(case.out, result[0], case.dtype, ("out",))
    return CaseResult(*label, not problem, error, None, problem)


def _pair_forward(spec: LayerSpec, student_forward):
    """numpy_tf's output with the cache the student's backward reads: the student's forward's
    if the file defines one, else numpy_tf's."""
    _, reference_forward, _ = _REFERENCE[spec.name]
    if student_forward is None:
        return lambda **inputs: spec.call(reference_forward, inputs)
    return lambda **inputs: (spec.call(reference_forward, inputs)[0],
                             spec.call(student_forward, inputs)[1])


def _grade_backward(spec, function, student_forward, case: _Prepared, path: str,
                    time_limit: float | None) -> CaseResult:
    label = (case.edge.name, case.dtype.name)
    cache = copy.deepcopy(case.cache)
    if student_forward is not None:
        try:
            with _student(time_limit):
                cache = spec.call(student_forward, copy.deepcopy(case.inputs))[1]
        except STUDENT_ERRORS as error:
            return CaseResult(*label, False, np.inf, None,
                              f"the forward that feeds it raised {_describe(error, path)}")
    dout = case.dout.copy()
    try:
        with _student(time_limit):
            grads = function(dout, cache)
    except STUDENT_ERRORS as error:
        return CaseResult(*label, False, np.inf, None, _describe(error, path))
    error, problem = _check_arrays(case.grads, grads, case.dtype,
                                   tuple(f"d{name}" for name in spec.grads))
    if not problem and not np.array_equal(dout, case.dout):
        problem = "changed dout in place (a backward must not modify its inputs)"
    fd = None
    if not problem and case.dtype == np.float64 and case.edge.finite_differences:
        try:
            with _student(time_limit):
                report = gradcheck(_pair_forward(spec, student_forward),
                                   lambda g, c: gradient_dict(spec, function(g, c)),
                                   copy.deepcopy(case.inputs),
                                   wrt=spec.differentiable(case.inputs))
        except STUDENT_ERRORS as exc:
            return CaseResult(*label, False, error, None, _describe(exc, path))
        fd = report.max_norm_rel_error
        if not report.passed:
            row = next(row for row in report.rows if not row.passed)
            problem = f"finite differences of numpy_tf's forward disagree for {row.name}: " \
                      f"max abs error {row.max_abs_error:.1e} at {row.worst_index}"
    return CaseResult(*label, not problem, error, fd, problem)


# -- the whole file -----------------------------------------------------------------------------
def grade(path, time_limit: float | None = 10.0) -> GradeReport:
    """Grade every numpy_tf function the file at `path` defines (see the module text), each
    call into it (the import, each case) given `time_limit` seconds (None: no limit). Raises
    FileNotFoundError for a missing file and ValueError for a file that defines none of them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such submission file: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    prepared = {name: _prepare(*entry) for name, entry in _REFERENCE.items()}
    module, error = load_submission(path, time_limit)
    if error is not None:
        names = _names_in(text)
        return GradeReport(str(path), [
            FunctionResult(name, len(prepared[name.rsplit("_", 1)[0]]), error=error)
            for name in names] or [FunctionResult(path.name, 1, error=error)])
    results = []
    for name, (spec, _, _) in _REFERENCE.items():
        own = {kind: function for kind in ("forward", "backward")
               if callable(function := getattr(module, f"{name}_{kind}", None))
               and getattr(function, "__module__", None) == module.__name__}
        if "forward" in own:
            results.append(FunctionResult(f"{name}_forward", len(prepared[name]), [
                _grade_forward(spec, own["forward"], case, str(path.resolve()), time_limit)
                for case in prepared[name]]))
        if "backward" in own:
            results.append(FunctionResult(f"{name}_backward", len(prepared[name]), [
                _grade_backward(spec, own["backward"], own.get("forward"), case,
                                str(path.resolve()), time_limit) for case in prepared[name]]))
    if not results:
        raise ValueError(f"{path} defines none of numpy_tf's layer functions (known: "
                         + ", ".join(f"{name}_forward/_backward" for name in _REFERENCE) + ")")
    return GradeReport(str(path), results)
