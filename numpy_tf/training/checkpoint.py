"""Checkpoints: one .npz holding everything needed to resume training exactly.

    meta                 JSON: format, model kind and config, dtype, step, the Generator's
                         state, the optimizer's hyperparameters, anything the caller adds
    param/<name>         the model's state_dict (a tied weight under each of its names)
    optim/state/<i>/<k>  the optimizer's per-parameter state
    <extra>              e.g. "tokenizer", so sampling needs nothing but the file

Written to a temporary file and renamed (numpy_tf.npz), so an interrupted save leaves the
previous checkpoint whole; read without pickle; loading is strict and names every missing,
unexpected or mismatched key.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.npz import (FileFormatError, bad_file, file_path, from_json_array, json_array,
                         load_npz, save_npz)
from ..models import registry
from ..optim.optimizer import Optimizer

FORMAT = "numpy_tf checkpoint 1"


def register_model(kind: str, config_class: type, model_class: Callable[..., Module]) -> None:
    """Make a model of your own checkpointable: `kind` is the class name of its models (what a
    checkpoint records); config_class(**saved config) and model_class(config, dtype=...)
    rebuild it. The families numpy_tf ships are registered in numpy_tf.models.registry; this
    registers a family named after the kind (or gives the family of that kind these classes)."""
    existing = registry.family_of_kind(kind)
    if existing is None:
        registry.register_family(registry.Family(kind, f"{kind} (registered by register_model)",
                                                 model_class, config_class,
                                                 checkpoint_kind=kind))
    else:
        registry.register_family(replace(existing, model_class=model_class,
                                         config_class=config_class, checkpoint_kind=kind),
                                 replace_existing=True)


def model_spec(model: Module) -> dict:
    """{"kind", "config", "dtype"}: what rebuilds the model's architecture."""
    kind = type(model).__name__
    family = registry.family_of_kind(kind)
    if family is None or family.config_class is None:
        raise TypeError(f"{kind} cannot be checkpointed: register it with "
                        "numpy_tf.checkpoint.register_model")
    config = model.config
    return {"kind": kind, "config": asdict(config) if is_dataclass(config) else dict(config),
            "dtype": model.dtype.name}


def build_model(spec: dict, path=None) -> Module:
    """The model `spec` ({"kind", "config", "dtype"}, as model_spec gives) describes, with
    fresh weights. A spec that cannot be built is a FileFormatError (a ValueError) naming
    `path`, the file the spec came from, and what is wrong."""
    where = "model spec" if path is None else f"{path}: meta['model']"

    def wrong(what: str, expected: str, got) -> FileFormatError:
        return FileFormatError(f"{where} {what} (expected {expected}, got {got})")

    if not isinstance(spec, dict):
        raise wrong("is not a model spec", "a JSON object with kind, config and dtype",
                    type(spec).__name__)
    kind, config, dtype = spec.get("kind"), spec.get("config"), spec.get("dtype")
    family = registry.family_of_kind(kind)
    if family is None or family.config_class is None:
        known = sorted(f.kind for f in registry.FAMILIES.values() if f.config_class is not None)
        raise wrong("names an unknown model kind", "one of " + ", ".join(known), repr(kind))
    if not isinstance(config, dict):
        raise wrong("has no config", "a JSON object of config fields", type(config).__name__)
    if dtype not in ("float32", "float64"):
        raise wrong("has no usable dtype", "'float32' or 'float64'", repr(dtype))
    try:
        return family.model_class(family.config_class(**config), dtype=np.dtype(dtype))
    except (TypeError, ValueError, ZeroDivisionError, KeyError, AttributeError) as error:
        raise wrong("config does not build a model", f"the config of a {kind}",
                    f"{type(error).__name__}: {error}") from None


def save_checkpoint(path, model: Module, optimizer: Optimizer | None = None, step: int = 0,
                    rng: np.random.Generator | None = None, extra_meta: dict | None = None,
                    extra_arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write one checkpoint .npz (see the module docstring): `step` a non-negative integer
    (2.7 is refused, not saved as 2), `rng` None or the Generator whose state is saved."""
    step = validate.non_negative_int("step", step)
    rng = validate.generator("rng", rng, allow_none=True)
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be None or a numpy_tf Optimizer; got "
                        f"{type(optimizer).__name__}")
    meta = {"format": FORMAT, "model": model_spec(model), "step": step,
            "rng": None if rng is None else rng.bit_generator.state, **(extra_meta or {})}
    arrays = {f"param/{name}": value for name, value in model.state_dict().items()}
    if optimizer is not None:
        optim_arrays, meta["optimizer"] = optimizer.flat_state()
        arrays.update({f"optim/{key}": value for key, value in optim_arrays.items()})
    for key in extra_arrays or {}:
        if key == "meta" or key.split("/")[0] in ("param", "optim"):
            raise ValueError(f"extra array name {key!r} is reserved")
    save_npz(path, {"meta": json_array(meta), **arrays, **(extra_arrays or {})})


@dataclass
class Checkpoint:
    meta: dict
    model: Module
    arrays: dict[str, np.ndarray] = field(repr=False)
    path: Path | None = None                # the file it was loaded from


    @property
    def step(self) -> int:
        return self.meta["step"]

    def generator(self) -> np.random.Generator | None:
        """A Generator in exactly the saved state (None if none was saved)."""
        state = self.meta.get("rng")
        return None if state is None else _generator(state)

    def restore_optimizer(self, optimizer: Optimizer) -> None:
        """Load the saved optimizer state into `optimizer` (built on self.model's parameters);
        strict: class, parameter count, shapes, dtypes and keys must all match."""
        if "optimizer" not in self.meta:
            raise ValueError("this checkpoint holds no optimizer state")
        prefix = "optim/"
        state = {k[len(prefix):]: v for k, v in self.arrays.items() if k.startswith(prefix)}
        try:
            optimizer.load_flat_state(state, self.meta["optimizer"])
        except (KeyError, TypeError, IndexError) as error:     # a malformed saved state
            raise bad_file(self.path or "checkpoint", "its optimizer state is malformed "
                           f"({type(error).__name__}: {error})") from None


def load_checkpoint(path) -> Checkpoint:
    """Rebuild the model from the file and load its parameters (strictly). Anything malformed
    (not an .npz, no or broken meta, a model spec that does not build, missing, unexpected or
    mismatched parameters, a NaN or infinite weight) is a FileFormatError naming the file and
    what is wrong; a missing file is a FileNotFoundError."""
    path = file_path(path)
    arrays = load_npz(path)
    if "meta" not in arrays:
        raise bad_file(path, "the file is not a numpy_tf checkpoint: it has no 'meta' entry",
                       "meta, param/*", f"{_listed(arrays)}")
    meta = from_json_array(arrays.pop("meta"), path, "meta", dict)
    if meta.get("format") != FORMAT:
        raise bad_file(path, "the file is not a numpy_tf checkpoint", f"meta format {FORMAT!r}",
                       repr(meta.get("format")))
    _check_meta(path, meta)
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    _check_parameter_sizes(path, meta["model"], params)
    model = build_model(meta["model"], path)
    try:
        model.load_state_dict(params)
    except ValueError as error:
        raise bad_file(path, f"its parameters do not fit the model its meta describes: "
                       f"{error}") from None
    for name, value in params.items():
        finite = np.isfinite(value)
        if not finite.all():
            bad = np.argwhere(~finite)
            raise bad_file(path, f"parameter {name} holds {len(bad)} non-finite values "
                           f"(first {value[tuple(bad[0])]} at {tuple(int(i) for i in bad[0])})",
                           "finite weights", f"{len(bad)} NaN or infinite")
    return Checkpoint(meta, model, arrays, path)


def _listed(arrays, limit: int = 5) -> str:
    names = list(arrays)
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "") or "no arrays"


def _check_meta(path, meta: dict) -> None:
    """The fields a checkpoint's meta must have, of the right JSON type."""
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad_file(path, "meta['step'] is not a step count", "an integer >= 0", repr(step))
    rng = meta.get("rng")
    if rng is not None:
        try:
            _generator(rng)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise bad_file(path, f"meta['rng'] is not a Generator's state ({error})",
                           "null or {'bit_generator': 'PCG64', 'state': ...}",
                           repr(rng)[:80]) from None
    optimizer = meta.get("optimizer")
    if optimizer is not None and not (isinstance(optimizer, dict)
                                      and isinstance(optimizer.get("optimizer"), str)
                                      and isinstance(optimizer.get("params"), list)
                                      and isinstance(optimizer.get("param_groups"), list)):
        raise bad_file(path, "meta['optimizer'] is malformed",
                       "an object with optimizer, params and param_groups", repr(optimizer)[:80])


def _check_parameter_sizes(path, spec, params: dict) -> None:
    """Refuse a config that would allocate far more than the file holds (a damaged
    vocab_size of 10**12 must not exhaust memory before the shapes are compared)."""
    family = registry.family_of_kind(spec.get("kind")) if isinstance(spec, dict) else None
    config = spec.get("config") if isinstance(spec, dict) else None
    if family is None or family.count is None or family.config_class is None \
            or not isinstance(config, dict):
        return
    try:
        claimed = family.count(family.config_class(**config)).total
    except Exception:                      # build_model names what is wrong with the config
        return
    held = sum(int(value.size) for value in params.values())
    if claimed > 2 * held + 1_000_000:
        raise bad_file(path, "meta['model'] describes a model far larger than the parameters "
                       "the file holds", f"about {held:,} parameters", f"{claimed:,}")


def _generator(state: dict) -> np.random.Generator:
    if not isinstance(state, dict) or state.get("bit_generator") not in \
            ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
        raise ValueError("unknown bit generator")
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
