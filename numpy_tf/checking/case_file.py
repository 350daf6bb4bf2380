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

from ..core.npz import from_json_array, json_array, load_npz, save_npz

SECTIONS = ("param", "input", "output", "grad_output", "grad", "grad_input", "act", "grad_act")


@dataclass
class Case:
    meta: dict
    arrays: dict[str, np.ndarray] = field(default_factory=dict)   # every key except meta

    @classmethod
    def load(cls, path) -> "Case":
        arrays = load_npz(path)
        if "meta" not in arrays:
            raise ValueError(f"{path} is not a numpy_tf case: it has no 'meta' entry")
        meta = from_json_array(arrays.pop("meta"))
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
