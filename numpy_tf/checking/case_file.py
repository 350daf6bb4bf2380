"""A case: one .npz file holding everything needed to check one computation (SPEC §7).

Keys (each a .npy member of the zip; npz needs no framework to read):

    meta                 0-d string: JSON with generator, torch version, seed, dtype, kind,
                         config and the conventions the numbers follow
    param/<name>         parameters, torch state_dict names
    input/<name>         forward inputs, in the order meta["inputs"] lists
    output/<name>        forward outputs
    grad_output/<name>   the upstream gradient fed to backward for each output
    grad/<name>          parameter gradients
    grad_input/<name>    gradients of the float inputs
    act/<name>           intermediate activations, in forward order (optional)
    grad_act/<name>      their gradients (optional)
    loss                 0-d (optional)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.npz import bad_file, from_json_array, json_array, load_npz, save_npz

SECTIONS = ("param", "input", "output", "grad_output", "grad", "grad_input", "act", "grad_act")
CASE_DTYPES = ("float64", "float32", "bfloat16", "float16")   # bf16/fp16: run_torch's dtype=
NUMBER_KINDS = {"b": "bool", "i": "integer", "u": "integer", "f": "float"}


def check_case_arrays(path, arrays: dict[str, np.ndarray]) -> None:
    """Every key of a case file (but meta) is `loss` or `<section>/<name>`, and every array
    holds numbers: bool, integers or floats (never complex, strings or records)."""
    for key, array in arrays.items():
        head, slash, name = key.partition("/")
        if key != "loss" and not (slash and head in SECTIONS and name):
            raise bad_file(path, f"key {key!r} is not a case key",
                           f"'loss' or <section>/<name> with a section of {', '.join(SECTIONS)}",
                           repr(key))
        if array.dtype.kind not in NUMBER_KINDS:
            raise bad_file(path, f"{key} does not hold numbers numpy_tf compares",
                           "bool, integer or float", f"dtype {array.dtype}")


@dataclass
class Case:
    meta: dict
    arrays: dict[str, np.ndarray] = field(default_factory=dict)   # every key except meta

    @classmethod
    def load(cls, path) -> "Case":
        """The case in `path`. A file that is not a case (no meta, meta not a JSON object
        with kind and dtype, a key outside the sections, an array that is not bool, integer
        or float) is a FileFormatError naming the file and what is wrong."""
        arrays = load_npz(path)
        if "meta" not in arrays:
            raise bad_file(path, "the file is not a numpy_tf case: it has no 'meta' entry",
                           "meta, param/*, input/*, ...", ", ".join(arrays) or "no arrays")
        meta = from_json_array(arrays.pop("meta"), path, "meta", dict)
        if not isinstance(meta.get("kind"), str):
            raise bad_file(path, "meta has no kind", "a string such as 'linear'",
                           repr(meta.get("kind")))
        if meta.get("dtype") not in CASE_DTYPES:
            raise bad_file(path, "meta has no usable dtype", " or ".join(map(repr, CASE_DTYPES)),
                           repr(meta.get("dtype")))
        check_case_arrays(path, arrays)
        return cls(meta, arrays)

    def save(self, path) -> None:
        save_npz(path, {"meta": json_array(self.meta), **self.arrays})

    def section(self, name: str) -> dict[str, np.ndarray]:
        """{name: array} of one section, e.g. section("param") is a state_dict."""
        prefix = f"{name}/"
        return {key[len(prefix):]: value for key, value in self.arrays.items()
                if key.startswith(prefix)}

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    def inputs(self) -> list[np.ndarray]:
        """The forward inputs in order (None for an input the case leaves out)."""
        return [self.arrays.get(f"input/{name}") for name in self.meta["inputs"]]
