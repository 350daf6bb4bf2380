"""Grade a student's own versions of numpy_tf's pure layer functions.

    report = grade("homework.py")      # print(report), report.to_dict(), report.passed
    book = grade_folder("submissions/") # book.csv(), one row per student

The submission is a Python file (or a Jupyter notebook: its code cells, magics left out)
defining some of `<layer>_forward(...)` / `<layer>_backward(dout, cache)` with numpy_tf's names
and signatures (the layers of numpy_tf.teaching.layer_table). A function counts as the
student's only if the file itself defines it (one imported from numpy_tf is not graded), and
by default only the backwards are graded: the forwards an assignment hands out complete earn
nothing unless `forwards=True` (`numpy-tf grade --forwards`). A student's forward still makes
the cache their backward is fed.

The file never runs in the grader's process. Each submission runs in a fresh interpreter
(numpy_tf.teaching.student_process) that receives the case inputs and sends back what each call
returned, as arrays in .npy format read with allow_pickle=False; numpy_tf's expected results
are computed here. So a submission that prints, writes to file descriptor 1, patches numpy or
numpy_tf, raises a BaseException, calls os._exit or never returns cannot touch this process,
its report or its --json output: a call still running after `time_limit` seconds ends the
child process (even inside one long C call), and a call that ends the process fails its case;
either way the rest of that function's cases are not run ("not run: ..."), and a new process
goes on with the other functions.

Every graded function runs on every edge case of its layer (layer_table: every option and
every combination of options, T = 1, size-1 axes, fully masked attention rows, repeated
embedding ids, ignored targets, rows of near-zero variance, logits large enough to overflow a
naive exp, ...) in float64 and in float32. A case passes when

- the function returns what numpy_tf's returns: a tuple of the same length (None where numpy_tf
  gives None), arrays of the same shape and dtype, finite where numpy_tf's are;
- every array agrees with numpy_tf's within tolerances.TORCH["layer", dtype] (scale S = the
  largest |value| among numpy_tf's arrays of the case; tolerances.py says why);
- a backward leaves `dout` and its cache unchanged, and (float64) its gradients pass
  numpy_tf.gradcheck against finite differences of numpy_tf's own forward.

Points: each graded function is worth `points` (10), earned in proportion to its cases passed.
A function that calls numpy_tf's own implementation of itself (its reference function, or any
kernel, by whatever name it was imported) is flagged and earns 0. A syntax error or an
exception while importing fails every function the file defines with that one message.

This is not a sandbox: the child process runs as the grader's user; run untrusted files inside
one (a container, a throwaway account).
"""
from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checking.finite_differences import gradcheck
from ..checking.fixtures import compare_arrays
from ..core.table import format_table
from ..core.tolerances import torch_tolerance
from .layer_table import LAYERS, EdgeCase, LayerSpec, gradient_dict, grading_cases
from .notebook import notebook_code

# captured when numpy_tf.grading is imported: (spec, forward, backward)
_REFERENCE = {name: (spec, spec.forward, spec.backward) for name, spec in LAYERS.items()}
POINTS = 10.0                       # what each graded function is worth
SETUP_SECONDS = 120.0               # the child's own work (starting, saving results) at most
GRADED = tuple(f"{name}_{kind}" for name in LAYERS for kind in ("forward", "backward"))


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
    excess: float = math.inf        # the worst error / what the tolerance allows there

    @property
    def label(self) -> str:
        return f"{self.case} ({self.dtype})"

    def to_dict(self) -> dict:
        return {"case": self.case, "dtype": self.dtype, "passed": self.passed,
                "max_abs_error": _finite(self.max_abs_error),
                "fd_norm_rel_error": self.fd_norm_rel_error, "message": self.message,
                "excess": _finite(self.excess)}


@dataclass
class FunctionResult:
    function: str
    possible: float                 # the points the function is worth
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None        # the whole file failed (syntax error, import exception)
    delegated: list[str] = field(default_factory=list)   # numpy_tf's code it called

    @property
    def flag(self) -> str | None:
        if not self.delegated:
            return None
        return f"calls {', '.join(self.delegated)}: no points for numpy_tf's own implementation"

    @property
    def cases_passed(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def points(self) -> float:
        if self.error or self.flag or not self.cases:
            return 0.0
        return self.possible * self.cases_passed / len(self.cases)

    @property
    def passed(self) -> bool:
        return self.error is None and not self.flag and bool(self.cases) and \
            all(case.passed for case in self.cases)

    @property
    def first_failure(self) -> str:
        if self.error:
            return self.error
        failing = [case for case in self.cases if not case.passed]
        if failing:
            return f"{failing[0].label}: {failing[0].message}"
        return self.flag or ""

    @property
    def worst_case(self) -> CaseResult | None:
        """The failing case furthest from passing (one that could not be compared at all
        first), else the passing case closest to its tolerance; ties: the first."""
        if not self.cases:
            return None
        return max(self.cases, key=lambda case: (not case.passed, case.excess))

    def verdict(self) -> str:
        if self.error:
            return f"FAIL: {self.error}"
        worst = self.worst_case
        if self.flag:
            return f"FLAGGED: {self.flag}"
        if worst is None:
            return "FAIL: no case ran"
        if not worst.passed:
            return f"FAIL: {worst.label}: {worst.message}"
        return f"pass (closest: {worst.label}, {worst.excess:.0%} of the tolerance)"

    def to_dict(self) -> dict:
        return {"function": self.function, "passed": self.passed, "points": self.points,
                "possible": self.possible, "cases_passed": self.cases_passed,
                "cases_total": len(self.cases), "error": self.error, "flag": self.flag,
                "worst_case": None if self.worst_case is None else self.worst_case.to_dict(),
                "cases": [case.to_dict() for case in self.cases]}


@dataclass
class GradeReport:
    submission: str
    functions: list[FunctionResult]

    @property
    def passed(self) -> bool:
        return all(function.passed for function in self.functions)

    @property
    def points(self) -> float:
        return sum(function.points for function in self.functions)

    @property
    def possible(self) -> float:
        return sum(function.possible for function in self.functions)

    def to_dict(self) -> dict:
        return {"submission": self.submission, "passed": self.passed,
                "points": self.points, "possible": self.possible,
                "functions": [f.to_dict() for f in self.functions]}

    def results_json(self) -> dict:
        """Gradescope's autograder format: a test per function."""
        return {"score": round(self.points, 4),
                "tests": [{"name": f.function, "score": round(f.points, 4),
                           "max_score": f.possible,
                           "output": f"{f.cases_passed}/{len(f.cases)} cases; {f.verdict()}"}
                          for f in self.functions]}

    def __str__(self) -> str:
        rows = []
        for f in self.functions:
            worst = f.worst_case
            fds = [c.fd_norm_rel_error for c in f.cases if c.fd_norm_rel_error is not None]
            if worst is None:
                error = "-"
            elif np.isfinite(worst.max_abs_error):
                error = f"{worst.max_abs_error:.1e}"
            else:
                error = "n/a"               # it raised, or its shape or dtype was wrong
            rows.append((f.function, f"{f.cases_passed}/{len(f.cases)}",
                         f"{f.points:.4g}/{f.possible:g}", error,
                         f"{max(fds):.1e}" if fds else "-", f.verdict()))
        failed = sum(not f.passed for f in self.functions)
        return "\n".join(
            [f"numpy-tf grade {self.submission}: each function's points in proportion to its "
             "cases passed",
             "worst error: max |yours - numpy_tf's| in the worst case (n/a: it raised, or a "
             "shape or dtype was wrong); finite-diff: max ||a - n|| / ||n|| of your backward "
             "against finite differences of numpy_tf's forward"]
            + [format_table(("function", "cases", "points", "worst error", "finite-diff",
                             "verdict (the worst case)"), rows)]
            + [f"{len(self.functions) - failed} passed, {failed} failed; "
               f"{self.points:.4g}/{self.possible:g} points"])


# -- the submission's text ----------------------------------------------------------------------
@dataclass
class Submission:
    path: Path
    source: str
    cells: list[tuple[int, int]] | None     # a notebook's (cell, line) of each source line

    def where(self, message: str) -> str:
        """A notebook's `(line N)` as `(cell C, line L)`."""
        if self.cells is None:
            return message

        def cell(match):
            line = int(match.group(1))
            if 1 <= line <= len(self.cells):
                return "(cell {}, line {})".format(*self.cells[line - 1])
            return match.group(0)
        return re.sub(r"\(line (\d+)\)", cell, message)


def read_submission(path) -> Submission:
    """The source of a .py file, or the code cells of a .ipynb (FileNotFoundError, ValueError
    for an unreadable notebook)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such submission file: {path}")
    if path.suffix == ".ipynb":
        source, cells = notebook_code(path)
        return Submission(path, source, cells)
    return Submission(path, path.read_text(encoding="utf-8", errors="replace"), None)


def _names_in(text: str) -> list[str]:
    """The graded functions a file defines, read from its text (for a file that cannot run)."""
    return [name for name in re.findall(r"^def\s+(\w+)\s*\(", text, re.M) if name in GRADED]


def _candidates(text: str) -> list[str]:
    """Every graded name the text mentions, in the table's order: what the child looks for."""
    words = set(re.findall(r"\w+", text))
    return [name for name in GRADED if name in words]


# -- numpy_tf's side of each case ---------------------------------------------------------------
@dataclass
class _Prepared:
    """One case with numpy_tf's results, computed in this process."""
    id: str
    edge: EdgeCase
    dtype: np.dtype
    seed: int                       # of dout: gradcheck(seed=...) draws the same first
    inputs: dict
    out: np.ndarray
    dout: np.ndarray
    grads: object


def check_time_limit(time_limit) -> float | None:
    """None (no limit) for None or 0; a positive finite number of seconds; else ValueError."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or \
            not math.isfinite(time_limit) or time_limit < 0:
        raise ValueError(f"time_limit must be a finite number of seconds >= 0 (0 or None: no "
                         f"limit); got {time_limit!r}")
    return float(time_limit) or None


_PREPARED: dict = {}                # (layer, forward, backward) -> its cases, computed once


def _prepare(name: str) -> list[_Prepared]:
    """numpy_tf's side of every case of a layer (kept for the next submission)."""
    spec, forward, backward = _REFERENCE[name]
    key = (name, forward, backward)
    if key not in _PREPARED:
        _PREPARED[key] = _prepare_cases(spec, forward, backward)
    return _PREPARED[key]


def _prepare_cases(spec: LayerSpec, forward, backward) -> list[_Prepared]:
    name = spec.name
    prepared = []
    for index, edge in enumerate(grading_cases(spec)):
        for dtype in (np.dtype(np.float64), np.dtype(np.float32)):
            inputs = spec.case_inputs(edge, dtype, seed=index)
            out, cache = spec.call(forward, copy.deepcopy(inputs))
            seed = 1000 + index
            dout = np.random.default_rng(seed).standard_normal(np.shape(out)).astype(dtype)
            grads = backward(dout.copy(), copy.deepcopy(cache))
            prepared.append(_Prepared(f"{name}-{index}-{dtype.name}", edge, dtype, seed, inputs,
                                      out, dout, grads))
    return prepared


def _check_arrays(expected, got, dtype: np.dtype, names: tuple[str, ...]
                  ) -> tuple[float, float, str]:
    """(max abs error, worst error / allowed, "" or the first problem) of what a function
    returned (`got` as decoded from the child: arrays, None, tuples, or _Foreign)."""
    tolerance = torch_tolerance(dtype, "layer")
    expected_t = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(expected, tuple) and not isinstance(got, (tuple, list)):
        return np.inf, np.inf, f"must return a tuple of {len(expected)} ({', '.join(names)}); " \
                               f"got {_type_name(got)}"
    got_t = tuple(got) if isinstance(expected, tuple) else (got,)
    if len(got_t) != len(expected_t):
        return np.inf, np.inf, f"must return {len(expected_t)} values; got {len(got_t)}"
    scale = max((float(np.abs(e).max(initial=0.0)) for e in expected_t if e is not None),
                default=0.0)
    worst = excess = 0.0
    for name, e, g in zip(names, expected_t, got_t):
        if e is None or g is None:
            if (e is None) != (g is None):
                return np.inf, np.inf, f"{name} must be {'None' if e is None else 'an array'}; " \
                                       f"got {'None' if g is None else _type_name(g)}"
            continue
        if not isinstance(g, np.ndarray):
            return np.inf, np.inf, f"{name} must be a numpy array; got {_type_name(g)}"
        if g.shape != e.shape:
            return np.inf, np.inf, f"{name} has shape {g.shape}; expected {e.shape}"
        if g.dtype != e.dtype:
            return np.inf, np.inf, f"{name} has dtype {g.dtype}; expected {e.dtype} " \
                                   "(dtype in = dtype out)"
        if not np.isfinite(g[np.isfinite(e)]).all():
            position = tuple(int(i) for i in np.argwhere(~np.isfinite(g) & np.isfinite(e))[0])
            return np.inf, np.inf, f"{name} is {g[position]} at {position}"
        result = compare_arrays(name, g, e, tolerance, scale)
        worst = max(worst, result.max_abs_error)
        if e.size:
            allowed = tolerance.allowed(np.where(np.isfinite(e), e, 0.0), scale)
            with np.errstate(invalid="ignore"):
                ratio = np.where(g == e, 0.0, np.abs(g.astype(np.float64) - e) / allowed)
            excess = max(excess, float(np.nanmax(ratio)) if np.isfinite(e).any() else 0.0)
        if not result.passed:
            return worst, excess, f"{name} differs from numpy_tf's by " \
                                  f"{result.max_abs_error:.1e} at {result.worst_index}"
    return worst, excess, ""


class _Foreign:
    """What the child described but could not send: a value of another type."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def _type_name(value) -> str:
    return value.type_name if isinstance(value, _Foreign) else type(value).__name__


def _decode(description, stream):
    """What the child described, its arrays read from `stream` (the child's results.npy)
    with allow_pickle=False; ValueError if it cannot be read."""
    kind = description.get("kind") if isinstance(description, dict) else None
    if kind == "none":
        return None
    if kind == "array":
        offset = description.get("offset")
        if not isinstance(offset, int) or offset < 0:
            raise ValueError("no offset")
        stream.seek(offset)
        return np.lib.format.read_array(stream, allow_pickle=False)
    if kind in ("tuple", "list"):
        items = [_decode(item, stream) for item in description["items"]]
        return tuple(items) if kind == "tuple" else items
    return _Foreign(str(description.get("type", "an unknown value")))


def _finite_differences(spec: LayerSpec, case: _Prepared, grads) -> tuple[float, str]:
    """(max ||a - n|| / ||n||, "" or the problem) of the student's gradients against finite
    differences of numpy_tf's own forward, with the case's dout (gradcheck's first draw)."""
    _, forward, _ = _REFERENCE[spec.name]

    def student_backward(g, cache):
        assert np.array_equal(g, case.dout), "the case's dout is gradcheck's own draw"
        return gradient_dict(spec, grads)

    report = gradcheck(lambda **inputs: spec.call(forward, inputs), student_backward,
                       copy.deepcopy(case.inputs), wrt=spec.differentiable(case.inputs),
                       seed=case.seed)
    if report.passed:
        return report.max_norm_rel_error, ""
    row = next(row for row in report.rows if not row.passed)
    return report.max_norm_rel_error, \
        f"finite differences of numpy_tf's forward disagree for {row.name}: max abs error " \
        f"{row.max_abs_error:.1e} at {row.worst_index}"


def _judge(spec: LayerSpec, kind: str, case: _Prepared, event: dict, stream) -> CaseResult:
    """One case from the child's event and the arrays it appended to `stream`."""
    label = (case.edge.name, case.dtype.name)
    if event.get("error"):
        return CaseResult(*label, False, np.inf, None, str(event["error"]))
    try:
        got = _decode(event.get("returned"), stream)
    except (ValueError, OSError, KeyError, TypeError, EOFError):
        return CaseResult(*label, False, np.inf, None, "what it returned could not be read "
                          "back from the process that ran it")
    with np.errstate(all="ignore"):         # a student's values may be anything (1e308)
        return _judge_values(spec, kind, case, event, got)


def _judge_values(spec: LayerSpec, kind: str, case: _Prepared, event: dict,
                  got) -> CaseResult:
    label = (case.edge.name, case.dtype.name)
    if kind == "forward":
        error, excess, problem = _check_arrays(case.out, got, case.dtype, ("out",))
        return CaseResult(*label, not problem, error, None, problem, excess)
    error, excess, problem = _check_arrays(case.grads, got, case.dtype,
                                           tuple(f"d{name}" for name in spec.grads))
    if not problem and event.get("changed_dout"):
        problem = "changed dout in place (a backward must not modify its inputs)"
    if not problem and event.get("changed_cache"):
        problem = "changed its cache in place (a backward must not modify its inputs)"
    fd = None
    if not problem and case.dtype == np.float64 and case.edge.finite_differences:
        fd, problem = _finite_differences(spec, case, got)
    return CaseResult(*label, not problem, error, fd, problem, excess)


# -- the child process ------------------------------------------------------------------------
class _Child:
    """One run of numpy_tf.teaching.student_process, read event by event."""

    def __init__(self, job_dir: Path):
        read, write = os.pipe()
        environment = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        environment["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in [environment.get("PYTHONPATH")] if p])
        for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            environment.setdefault(variable, "1")           # tiny arrays: no thread pools
        self.stdout = open(job_dir / "stdout.txt", "wb")
        self.stderr = open(job_dir / "stderr.txt", "wb")
        self.job_dir = job_dir
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "numpy_tf.teaching.student_process", str(job_dir),
                 str(write)], stdin=subprocess.DEVNULL, stdout=self.stdout, stderr=self.stderr,
                pass_fds=(write,), cwd=job_dir, env=environment, start_new_session=True)
        finally:
            os.close(write)
        self.pipe = read
        self.buffer = b""

    def next_event(self, timeout: float | None) -> dict | None:
        """The next event, or None when the child ended (closed the pipe) or `timeout`
        seconds passed (then `self.timed_out`)."""
        self.timed_out = False
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.pipe], [], [], wait)
            if not ready:
                self.timed_out = True
                return None
            chunk = os.read(self.pipe, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        return event if isinstance(event, dict) else {"event": "garbage"}

    def end(self) -> str:
        """Stop the child and everything it started; what it wrote on stderr, last line."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        status = self.process.wait()
        os.close(self.pipe)
        self.stdout.close()
        self.stderr.close()
        lines = (self.job_dir / "stderr.txt").read_bytes().decode("utf-8", "replace") \
            .strip().splitlines()
        self.status = status
        return lines[-1][:200] if lines else ""


@dataclass
class _Outcome:
    owned: list[str] | None = None
    import_error: str | None = None
    results: dict = field(default_factory=dict)          # function -> its "case" events
    faults: dict = field(default_factory=dict)           # function -> (message, what ran)


def _write_job(job_dir: Path, submission: Submission, candidates: list[str],
               prepared: dict[str, list[_Prepared]], forwards: bool, skip: list[str]) -> None:
    arrays, cases = {}, {}
    for name, layer_cases in prepared.items():
        cases[name] = []
        for case in layer_cases:
            inputs = {}
            for argument, value in case.inputs.items():
                if isinstance(value, np.ndarray):
                    arrays[f"{case.id}/{argument}"] = value
                    inputs[argument] = {"array": f"{case.id}/{argument}"}
                else:
                    inputs[argument] = {"value": value}
            arrays[f"{case.id}/dout"] = case.dout
            cases[name].append({"id": case.id, "inputs": inputs, "dout": f"{case.id}/dout"})
    np.savez(job_dir / "inputs.npz", **arrays)
    (job_dir / "job.json").write_text(json.dumps({
        "source": submission.source, "filename": str(submission.path.resolve()),
        "module": f"numpy_tf_submission_{submission.path.stem}", "candidates": candidates,
        "cases": cases, "forwards": forwards, "skip": skip}), encoding="utf-8")


def _run_child(job_dir: Path, time_limit: float | None, outcome: _Outcome) -> str | None:
    """Run the child once, filling `outcome`; the function it was in when it ended early
    (timed out, exited, sent garbage), with the message in outcome.faults; None if it
    finished."""
    child = _Child(job_dir)
    in_call, what = False, None
    try:
        while True:
            limit = time_limit if in_call else (None if time_limit is None else
                                                max(SETUP_SECONDS, time_limit))
            event = child.next_event(limit)
            kind = None if event is None else event.get("event")
            if kind == "call":
                in_call, what = True, event.get("what")
            elif kind == "return":
                in_call = False
            elif kind == "owned":
                outcome.owned = [name for name in event.get("names", []) if name in GRADED]
            elif kind == "import_error":
                outcome.import_error = str(event.get("message"))
            elif kind == "case":
                outcome.results.setdefault(str(event.get("function")), []).append(event)
            elif kind == "end":
                return None
            elif kind == "ready":
                pass
            else:                                   # ended, timed out or garbage
                break
        timed_out = child.timed_out
    finally:
        last_words = child.end()
    if timed_out and in_call:
        message = f"TimeLimitExceeded: still running after {time_limit:g} s (the time limit " \
                  "of each call; an endless loop?)"
    elif timed_out:
        message = "the grader's process for this file stopped answering (did the file " \
                  "patch numpy?)"
    elif event is not None:
        message = "the grader's process for this file sent something it cannot read"
    else:
        message = f"the process running the file ended (exit status {child.status}) " \
                  f"{'during a call into it' if in_call else 'between calls into it'}" \
                  + (f"; its last words: {last_words}" if last_words else "")
    if outcome.owned is None:
        outcome.import_error = message
        return None
    done = set(outcome.results)
    current = _current_function(outcome, done, job_dir)
    outcome.faults[current] = (message, what)
    return current


def _current_function(outcome: _Outcome, done: set, job_dir: Path) -> str:
    """The function the child was running when it stopped: the first owned one without all
    its results (the child runs them in the table's order)."""
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    for name in outcome.owned:
        if name in job["skip"] or name in outcome.faults:
            continue
        layer, kind = name.rsplit("_", 1)
        if kind == "forward" and not job["forwards"]:
            continue
        if len(outcome.results.get(name, [])) < len(job["cases"][layer]):
            return name
    return outcome.owned[-1]


def _run(job_dir: Path, submission: Submission, candidates: list[str], prepared: dict,
         forwards: bool, time_limit: float | None) -> _Outcome:
    """Run the child until it has been through every function (a new one after each fault)."""
    outcome = _Outcome()
    (job_dir / "results.npy").touch()
    skip: list[str] = []
    while True:
        _write_job(job_dir, submission, candidates, prepared, forwards, skip)
        stopped = _run_child(job_dir, time_limit, outcome)
        if stopped is None or outcome.import_error is not None or stopped in skip:
            return outcome                  # finished, or no further progress to make
        skip = sorted(set(outcome.results) | set(outcome.faults))


# -- the whole file -----------------------------------------------------------------------------
def grade(path, time_limit: float | None = 10.0, forwards: bool = False,
          points: float = POINTS) -> GradeReport:
    """Grade the numpy_tf functions the file at `path` (.py or .ipynb) defines (see the module
    text): the backwards, and the forwards too with `forwards=True`; each call into the file
    (its import, each case) given `time_limit` seconds (0 or None: no limit; negative or not
    finite: ValueError). Raises FileNotFoundError for a missing file and ValueError for a file
    that defines none of them."""
    time_limit = check_time_limit(time_limit)
    submission = read_submission(path)
    try:
        compile(submission.source, str(submission.path.resolve()), "exec")
    except SyntaxError as error:
        return _failed_file(submission, f"SyntaxError: {error.msg} (line {error.lineno}); "
                            "nothing in the file can run", forwards, points)
    candidates = _candidates(submission.source)
    layers = list(dict.fromkeys(name.rsplit("_", 1)[0] for name in candidates))
    prepared = {layer: _prepare(layer) for layer in layers}
    with tempfile.TemporaryDirectory(prefix="numpy_tf_grade_") as directory:
        job_dir = Path(directory)
        outcome = _run(job_dir, submission, candidates, prepared, forwards, time_limit)
        with open(job_dir / "results.npy", "rb") as stream:
            return _report(submission, outcome, prepared, stream, forwards, points)


def _report(submission: Submission, outcome: _Outcome, prepared: dict, stream,
            forwards: bool, points: float) -> GradeReport:
    if outcome.import_error is not None:
        return _failed_file(submission, outcome.import_error, forwards, points)
    graded = [name for name in outcome.owned if forwards or name.endswith("_backward")]
    if not graded:
        raise ValueError(_none_defined(submission.path) + (
            "" if not outcome.owned else
            f"; it defines {', '.join(outcome.owned)}: pass forwards=True (--forwards) to "
            "grade forwards"))
    results = []
    for name in graded:
        layer, kind = name.rsplit("_", 1)
        spec = LAYERS[layer]
        result = FunctionResult(name, points)
        events = {event.get("case"): event for event in outcome.results.get(name, [])}
        for number, case in enumerate(prepared[layer]):
            event = events.get(number)
            if event is None:
                message, what = outcome.faults.get(name, ("not run", None))
                result.cases.append(CaseResult(case.edge.name, case.dtype.name, False, np.inf,
                                               None, _fault_message(message, result, what)))
                continue
            for label in event.get("delegated", []):
                if label not in result.delegated:
                    result.delegated.append(str(label))
            judged = _judge(spec, kind, case, event, stream)
            judged.message = submission.where(judged.message)
            result.cases.append(judged)
        results.append(result)
    return GradeReport(str(submission.path), results)


def _failed_file(submission: Submission, message: str, forwards: bool,
                 points: float) -> GradeReport:
    """Every function the file defines fails with the one message (a file that cannot run)."""
    message = submission.where(message)
    names = [name for name in _names_in(submission.source)
             if forwards or name.endswith("_backward")]
    return GradeReport(str(submission.path), [FunctionResult(name, points, error=message)
                                              for name in names] or
                       [FunctionResult(submission.path.name, points, error=message)])


def _fault_message(message: str, result: FunctionResult, what: str | None) -> str:
    """The case a fault struck carries it; the cases after it were not run."""
    struck = [case for case in result.cases if case.message.startswith(message)]
    if not struck:
        return message + (f" (in {what})" if what not in (None, "backward", "forward") else "")
    return f"{message}, on {struck[0].label}; this function's later cases were not run"


def _none_defined(path: Path) -> str:
    return (f"{path} defines none of numpy_tf's layer functions (known: "
            + ", ".join(f"{name}_forward/_backward" for name in LAYERS) + ")")


# -- a folder of submissions ------------------------------------------------------------------
@dataclass
class Gradebook:
    folder: str
    reports: dict[str, GradeReport | str]        # student (the file's stem) -> report or error

    @property
    def functions(self) -> list[str]:
        """Every function graded in any submission, in the table's order."""
        seen = {f.function for report in self.reports.values() if isinstance(report, GradeReport)
                for f in report.functions}
        return [name for name in GRADED if name in seen]

    def rows(self) -> list[dict]:
        functions = self.functions
        possible = {f.function: f.possible for report in self.reports.values()
                    if isinstance(report, GradeReport) for f in report.functions}
        rows = []
        for student, report in self.reports.items():
            row = {"student": student}
            scores = {} if isinstance(report, str) else \
                {f.function: f.points for f in report.functions}
            for name in functions:
                row[name] = round(scores.get(name, 0.0), 2)
            row["total"] = round(sum(row[name] for name in functions), 2)
            row["max"] = round(sum(possible[name] for name in functions), 2)
            notes = [report] if isinstance(report, str) else \
                [f"{f.function}: {f.flag or f.error}" for f in report.functions
                 if f.flag or f.error]
            row["notes"] = "; ".join(notes + [f"{name}: not defined" for name in functions
                                              if name not in scores and
                                              not isinstance(report, str)])
            rows.append(row)
        return rows

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, ["student", *self.functions, "total", "max", "notes"],
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows())
        return out.getvalue()

    def to_dict(self) -> dict:
        return {"folder": self.folder, "students": {
            student: report if isinstance(report, str) else report.to_dict()
            for student, report in self.reports.items()}}

    def __str__(self) -> str:
        rows = [(row["student"], f"{row['total']:g}/{row['max']:g}", row["notes"] or "-")
                for row in self.rows()]
        return f"numpy-tf grade {self.folder}: {len(rows)} submissions\n" + \
            format_table(("student", "points", "notes"), rows)


def submissions_in(folder) -> list[Path]:
    """The .py and .ipynb files directly in `folder`, by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder of submissions: {folder}")
    return sorted(path for path in folder.iterdir()
                  if path.is_file() and path.suffix in (".py", ".ipynb"))


def grade_folder(folder, time_limit: float | None = 10.0, forwards: bool = False,
                 points: float = POINTS) -> Gradebook:
    """Grade every .py and .ipynb file in `folder`, one fresh process each; a file that defines
    no graded function gets a row with that note."""
    time_limit = check_time_limit(time_limit)
    paths = submissions_in(folder)
    if not paths:
        raise ValueError(f"{folder} holds no .py or .ipynb submissions")
    stems = [path.stem for path in paths]
    reports: dict[str, GradeReport | str] = {}
    for path in paths:
        student = path.stem if stems.count(path.stem) == 1 else path.name
        try:
            reports[student] = grade(path, time_limit, forwards, points)
        except ValueError as error:
            reports[student] = str(error).split(" (known:")[0]
    return Gradebook(str(folder), reports)


def write_text_safely(path, text: str) -> None:
    """Write through a temporary file in the same folder, so an interrupted write leaves the
    old file whole."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
