"""What every fixture script shares: drawing values, running torch forward and backward, and
writing a case file (the format of SPEC §7).

This folder never imports numpy_tf: the torch side stands on its own, so an error in numpy_tf
cannot be copied into the fixture meant to catch it.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32}
_EPOCH = (1980, 1, 1, 0, 0, 0)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def normal(g: torch.Generator, shape, dtype: str, std: float = 1.0) -> torch.Tensor:
    """N(0, std^2) drawn in float64 (the same draw for both dtypes), then cast."""
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(DTYPES[dtype])


def randomize(module: torch.nn.Module, g: torch.Generator, dtype: str, std: float = 1.0):
    """Every parameter redrawn from N(0, std^2), so no default (ones, zeros) hides a bug."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(normal(g, parameter.shape, dtype, std))
    return module


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def conventions(**extra) -> dict:
    base = {"linear_weight_layout": "(out_features, in_features), y = x W^T + b",
            "bool_mask": "True = blocked (torch.nn.MultiheadAttention meaning)"}
    base.update(extra)
    return base


def meta(generator_file: str, kind: str, seed: int, dtype: str, config: dict,
         inputs: list[str], level: str = "layer", **extra) -> dict:
    return {"generator": f"reference/{generator_file}", "torch": torch.__version__,
            "seed": seed, "dtype": dtype, "kind": kind, "level": level, "config": config,
            "inputs": inputs, "conventions": conventions(**extra.pop("conventions", {})),
            **extra}


def run_module_case(module: torch.nn.Module, inputs: dict, g: torch.Generator, dtype: str,
                    call=None, keyword: dict | None = None) -> dict[str, np.ndarray]:
    """Forward `inputs` (float tensors get gradients) through `module`, backward a random
    upstream gradient, and return the arrays of a case (without meta). `keyword` inputs
    (masks) are passed by name, saved as inputs, and get no gradient."""
    tensors = {}
    for name, value in inputs.items():
        if value is not None and value.is_floating_point():
            value = value.detach().clone().requires_grad_(True)
        tensors[name] = value
    keyword = {k: v for k, v in (keyword or {}).items() if v is not None}
    out = call(module, **tensors, **keyword) if call else module(*tensors.values(), **keyword)
    dout = normal(g, out.shape, dtype)
    out.backward(dout)
    arrays = {f"param/{name}": to_numpy(p) for name, p in module.state_dict().items()}
    arrays.update({f"input/{name}": to_numpy(v) for name, v in tensors.items() if v is not None})
    arrays.update({f"input/{name}": to_numpy(v) for name, v in keyword.items()})
    arrays["output/out"] = to_numpy(out)
    arrays["grad_output/out"] = to_numpy(dout)
    for name, parameter in module.named_parameters():
        arrays[f"grad/{name}"] = to_numpy(parameter.grad)
    for name, value in tensors.items():
        if value is not None and value.is_floating_point():
            arrays[f"grad_input/{name}"] = to_numpy(value.grad)
    return arrays


def float_case(out_dir: Path, generator_file: str, name: str, kind: str, seed: int, dtype: str,
               module: torch.nn.Module, config: dict, inputs: dict, **extra) -> Path:
    """One case file `<name>_<dtype>.npz`: `module`'s parameters redrawn from `seed`, each input
    drawn by its function of the generator (in order), forward and backward a random upstream
    gradient, written with its meta."""
    g = generator(seed)
    module = randomize(module.to(DTYPES[dtype]), g, dtype)
    drawn = {key: value(g) for key, value in inputs.items()}
    arrays = run_module_case(module, drawn, g, dtype)
    return save_case(Path(out_dir) / f"{name}_{dtype}.npz",
                     meta(generator_file, kind, seed, dtype, config, list(inputs), **extra),
                     arrays)


def save_case(path: Path, case_meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    """Write a case deterministically (fixed timestamps, given order) and atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    members = {"meta": np.array(json.dumps(case_meta, sort_keys=True, indent=1)), **arrays}
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(descriptor, "wb") as handle:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
            for name, array in members.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(array),
                                              allow_pickle=False)
    os.replace(temporary, path)
    return path
