"""Compare two case files tensor by tensor and name the first place they part ways.

    result = compare_files("reference.npz", "theirs.npz")   # print(result); result.passed

Every key present in both files is compared with numpy_tf.checking.fixtures.compare_arrays under
tolerances.TORCH[level, dtype]: level from the reference's meta (a whole model: "model"),
dtype the less precise of the two files (a float32 implementation is held to float32's
tolerance even against a float64 reference). The absolute floor scales with the largest
|reference| of the tensor's group, as in `numpy-tf check`: the data (inputs, parameters,
upstream gradients), the forward (activations, outputs, loss), or the backward (gradients).

The first divergence is searched in this order, which follows the computation:

    1. input/*, param/*       the starting point: if these differ, nothing after can agree
    2. act/*                  activations, in forward call order (the reference file's order)
    3. output/*, loss
    4. grad_output/*          upstream gradients given to a layer case
    5. grad_act/*             activation gradients, in backward order (the reference's order)
    6. grad_input/*, grad/*   input and parameter gradients

so the named tensor is the earliest computation whose result disagrees: everything it read
agreed, and it is the place to look. When a known convention of another framework explains the
first divergence (JAX's float32 softmax, the mean of v that JAX gives a fully masked row:
numpy_tf.checking.conventions), the report says so instead of blaming it; the comparison still
does not pass.

A tensor of the reference with no counterpart in theirs fails the comparison (agreement on
the 2 tensors two files share says nothing of the 97 that were never compared); the report
lists them, and when their names differ from theirs by one consistent rename (`blocks` ->
`h`) it suggests it. `allow_missing=True` (`--allow-missing`) accepts a partial file on
purpose. Tensors only in theirs are listed, never failed. A tensor whose shape differs, or
whose kind of number differs (an integer or bool array where the reference holds floats, or
the other way), diverges; theirs must hold bool, integer or float arrays: complex values,
strings or records are refused (FileFormatError) before anything is compared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.npz import bad_file, from_json_array, load_npz
from ..core.table import format_table
from ..core.tolerances import Tolerance, torch_tolerance
from .case_file import NUMBER_KINDS, Case
from .conventions import Explanation, explain_first_divergence
from .fixtures import TensorComparison, compare_arrays

SEARCH_ORDER = ("input", "param", "act", "output", "loss", "grad_output", "grad_act",
                "grad_input", "grad")
GROUPS = {"input": "data", "param": "data", "grad_output": "data", "act": "forward",
          "output": "forward", "loss": "forward", "grad_act": "backward",
          "grad_input": "backward", "grad": "backward"}


def section(key: str) -> str:
    return key.split("/", 1)[0]


@dataclass
class Row:
    comparison: TensorComparison
    reference_shape: tuple
    their_shape: tuple
    problem: str = ""              # "shape (7,) for (8,)", "dtype int64 for float64": why the
                                   # values were not compared (the row diverges)

    def to_dict(self) -> dict:
        c = self.comparison
        finite = lambda value: value if np.isfinite(value) else None  # noqa: E731 (JSON)
        return {"key": c.key, "max_abs_error": finite(c.max_abs_error),
                "max_rel_error": finite(c.max_rel_error),
                "worst_index": None if c.worst_index is None else list(c.worst_index),
                "reference_shape": list(self.reference_shape),
                "their_shape": list(self.their_shape), "passed": c.passed,
                "problem": self.problem or None}


@dataclass
class Comparison:
    reference: str
    theirs: str
    dtype: str
    level: str
    tolerance: Tolerance
    rows: list[Row] = field(default_factory=list)      # in SEARCH_ORDER
    only_reference: list[str] = field(default_factory=list)
    only_theirs: list[str] = field(default_factory=list)
    explanation: Explanation | None = None              # of the first divergence, if known
    allow_missing: bool = False

    @property
    def first_divergence(self) -> Row | None:
        return next((row for row in self.rows if not row.comparison.passed), None)

    @property
    def missing(self) -> list[str]:
        """The reference's tensors without a counterpart that fail the comparison."""
        return [] if self.allow_missing else self.only_reference

    @property
    def passed(self) -> bool:
        return self.first_divergence is None and not self.missing

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {"reference": self.reference, "theirs": self.theirs, "dtype": self.dtype,
                "level": self.level, "rtol": self.tolerance.rtol, "atol": self.tolerance.atol,
                "passed": self.passed,
                "first_divergence": None if first is None else first.comparison.key,
                "explanation": None if self.explanation is None else
                self.explanation.to_dict(),
                "tensors": [row.to_dict() for row in self.rows],
                "only_in_reference": self.only_reference, "only_in_theirs": self.only_theirs,
                "allow_missing": self.allow_missing, "missing": self.missing,
                "suggested_rename": suggest_rename(self.only_reference, self.only_theirs)}

    def __str__(self) -> str:
        t = self.tolerance
        lines = [f"numpy-tf compare: {self.reference} (reference) vs {self.theirs}",
                 f"{len(self.rows)} shared tensors, {self.dtype} {self.level} tolerance: pass "
                 f"if |theirs - ref| <= {t.rtol:g} |ref| + {t.atol:g} max(1, S)"]
        table = []
        for row in self.rows:
            c = row.comparison
            shape = str(row.reference_shape) if row.reference_shape == row.their_shape else \
                f"{row.reference_shape} vs {row.their_shape}"
            verdict = "ok" if c.passed else f"DIVERGES ({row.problem})" if row.problem else \
                "DIVERGES"
            if row is self.first_divergence and self.explanation is not None:
                verdict = f"differs: explained ({self.explanation.convention})"
            table.append((c.key, shape, f"{c.max_abs_error:.1e}", f"{c.max_rel_error:.1e}",
                          "-" if c.worst_index is None else str(c.worst_index), verdict))
        lines.append(format_table(("tensor", "shape", "max abs err", "max rel err",
                                   "worst index", "verdict"), table))
        lines += one_sided_lines(self.only_reference, self.only_theirs)
        first = self.first_divergence
        if first is None and self.missing:
            shared = "the 1 shared tensor agrees" if len(self.rows) == 1 else \
                f"the {len(self.rows)} shared tensors agree"
            lines.append(f"{shared}, but that is not a pass:")
        elif first is None:
            lines.append("every shared tensor agrees" + (
                f"; {len(self.only_reference)} tensors of the reference were not compared "
                "(--allow-missing)" if self.only_reference else ""))
        else:
            failed = sum(not row.comparison.passed for row in self.rows)
            where = (f"first divergence: {first.comparison.key} (max abs error "
                     f"{first.comparison.max_abs_error:.1e} at {first.comparison.worst_index})")
            if self.explanation is None:
                lines.append(f"{where}: everything before it agrees, so look here first; "
                             f"{failed} of {len(self.rows)} tensors diverge")
            else:
                lines.append(f"{where}: everything before it agrees, and a known convention, "
                             f"not a bug, explains it ({self.explanation.convention}): "
                             f"{self.explanation.text}. {failed} of {len(self.rows)} tensors "
                             "differ")
        lines += missing_lines(self.missing, len(self.rows) + len(self.only_reference),
                               self.only_reference, self.only_theirs)
        return "\n".join(lines)


def one_sided_lines(only_reference: list[str], only_theirs: list[str]) -> list[str]:
    return [f"{label} ({len(keys)}): {', '.join(keys)}" for label, keys in
            (("only in the reference", only_reference), ("only in theirs", only_theirs)) if keys]


def missing_lines(missing: list[str], total: int, only_reference: list[str],
                  only_theirs: list[str]) -> list[str]:
    """The verdict on the reference's tensors that theirs lacks: a failure unless allowed."""
    if not missing:
        return []
    lines = [f"FAILED: {len(missing)} of the reference's {total} tensors have no counterpart "
             "in theirs, so they were never compared; a partial file passes only with "
             "--allow-missing (allow_missing=True)"]
    rename = suggest_rename(only_reference, only_theirs)
    if rename is not None:
        lines.append(f"their names look like the reference's with {rename['from']!r} -> "
                     f"{rename['to']!r} ({rename['matches']} of the {len(only_reference)} "
                     f"unmatched, e.g. {rename['example'][0]} is their "
                     f"{rename['example'][1]}): rename them in your file")
    return lines


def _rename_of(ours: str, theirs: str) -> tuple[str, str]:
    """(a, b) with ours = p + a + s and theirs = p + b + s, p and s as long as possible."""
    start = len(os.path.commonprefix([ours, theirs]))
    end = len(os.path.commonprefix([ours[start:][::-1], theirs[start:][::-1]]))
    return ours[start:len(ours) - end], theirs[start:len(theirs) - end]


def suggest_rename(only_reference: list[str], only_theirs: list[str],
                   limit: int = 300) -> dict | None:
    """The one substring rename (blocks -> h, "" -> model.) that turns the most unmatched
    reference names into names theirs holds, within each section; None unless it explains at
    least two. {"from", "to", "matches", "example": (ours, theirs)}."""
    by_section: dict[str, list[str]] = {}
    for key in only_theirs[:limit]:
        by_section.setdefault(section(key), []).append(key)
    counts: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for ours in only_reference[:limit]:
        seen = set()
        for theirs in by_section.get(section(ours), []):
            rename = _rename_of(ours, theirs)
            if rename not in seen:
                seen.add(rename)
                counts.setdefault(rename, []).append((ours, theirs))
    if not counts:
        return None
    (old, new), pairs = max(counts.items(), key=lambda item: len(item[1]))
    if len(pairs) < 2:
        return None
    return {"from": old, "to": new, "matches": len(pairs), "example": pairs[0]}


def read_theirs(path) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta or {}, arrays) of the file compared with a reference; it need not have a meta,
    but every array must hold bool, integers or floats (FileFormatError otherwise: a complex
    array would otherwise be compared by its real part alone)."""
    arrays = load_npz(path)
    has_meta = "meta" in arrays
    meta = from_json_array(arrays.pop("meta"), path, "meta", dict) if has_meta else {}
    if not arrays:
        raise bad_file(path, "holds no tensors to compare", "param/..., act/..., grad/...",
                       "meta alone" if has_meta else "an empty archive")
    for key, array in arrays.items():
        if array.dtype.kind not in NUMBER_KINDS:
            what = "complex values are refused" if array.dtype.kind == "c" else \
                "it does not hold numbers compare can judge"
            raise bad_file(path, f"{key}: {what}", "bool, integer or float",
                           f"dtype {array.dtype}")
    return meta, arrays


def kind_problem(reference: np.ndarray, theirs: np.ndarray) -> str:
    """Why two tensors cannot be compared ("" if they can): their shapes differ, or one holds
    floats and the other integers or bools."""
    if reference.shape != theirs.shape:
        return f"shape {theirs.shape} for {reference.shape}"
    if (reference.dtype.kind == "f") != (theirs.dtype.kind == "f"):
        return f"dtype {theirs.dtype} for {reference.dtype}"
    return ""


def _search_key(key: str, position: int) -> tuple:
    name = section(key)
    rank = SEARCH_ORDER.index(name) if name in SEARCH_ORDER else len(SEARCH_ORDER)
    return rank, position


def search_order(keys: list[str], reference_keys: list[str]) -> list[str]:
    """`keys` in the order the first divergence is searched: by section (SEARCH_ORDER), then
    by position in the reference file."""
    return sorted(keys, key=lambda key: _search_key(key, reference_keys.index(key)))


def _dtype(*array_sets: dict[str, np.ndarray]) -> str:
    floats = {a.dtype for arrays in array_sets for a in arrays.values() if a.dtype.kind == "f"}
    return "float32" if np.dtype(np.float32) in floats or not floats else "float64"


def compare_files(reference, theirs, level: str | None = None, *,
                  allow_missing: bool = False) -> Comparison:
    """Compare the case file `theirs` with the case file `reference` (see the module text).
    With allow_missing, tensors of the reference that theirs lacks are listed, not failed."""
    if not Path(reference).is_file() or not Path(theirs).is_file():
        missing = reference if not Path(reference).is_file() else theirs
        raise FileNotFoundError(f"no such case file: {missing}")
    reference_case = Case.load(reference)
    their_meta, their_arrays = read_theirs(theirs)
    reference_arrays = reference_case.arrays
    level = level or reference_case.meta.get("level", "model")
    dtype = _dtype(reference_arrays, their_arrays)
    tolerance = torch_tolerance(dtype, level)
    shared = search_order([key for key in reference_arrays if key in their_arrays],
                          list(reference_arrays))
    scales: dict[str, float] = {}
    for key in shared:
        group = GROUPS.get(section(key), "other")
        magnitude = np.abs(reference_arrays[key].astype(np.float64))
        value = magnitude[np.isfinite(magnitude)].max(initial=0.0)     # -inf: a row max
        scales[group] = max(scales.get(group, 0.0), float(value))
    result = Comparison(str(reference), str(theirs), dtype, level, tolerance,
                        allow_missing=allow_missing)
    for key in shared:
        ours, theirs_array = reference_arrays[key], their_arrays[key]
        problem = kind_problem(ours, theirs_array)
        if problem:
            comparison = TensorComparison(key, float("inf"), float("inf"), None, False)
        else:
            comparison = compare_arrays(key, theirs_array, ours, tolerance,
                                        scales[GROUPS.get(section(key), "other")])
        result.rows.append(Row(comparison, ours.shape, theirs_array.shape, problem))
    result.only_reference = [key for key in reference_arrays if key not in their_arrays]
    result.only_theirs = [key for key in their_arrays if key not in reference_arrays]
    if not shared:
        raise ValueError(f"{reference} and {theirs} share no tensor names; is {theirs} a case "
                         "file written for this reference (param/..., act/..., grad/...)?")
    result.explanation = explain_first_divergence(
        result.rows, reference_case.meta, reference_arrays, their_meta, their_arrays, dtype,
        tolerance, lambda key: scales[GROUPS.get(section(key), "other")])
    return result
