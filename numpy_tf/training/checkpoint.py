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
from typing import Callable

import numpy as np

from ..core import validate
from ..core.module import Module
from ..core.npz import from_json_array, json_array, load_npz, save_npz
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


def build_model(spec: dict) -> Module:
    kind = spec.get("kind")
    family = registry.family_of_kind(kind)
    if family is None or family.config_class is None:
        known = [f.kind for f in registry.FAMILIES.values() if f.config_class is not None]
        raise ValueError(f"checkpoint model kind {kind!r} is unknown; known: "
                         + ", ".join(sorted(known)))
    return family.model_class(family.config_class(**spec["config"]),
                              dtype=np.dtype(spec["dtype"]))


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

    @property
    def step(self) -> int:
        return self.meta["step"]

    def generator(self) -> np.random.Generator | None:
        """A Generator in exactly the saved state (None if none was saved)."""
        state = self.meta.get("rng")
        if state is None:
            return None
        bit_generator = getattr(np.random, state["bit_generator"])()
        bit_generator.state = state
        return np.random.Generator(bit_generator)

    def restore_optimizer(self, optimizer: Optimizer) -> None:
        """Load the saved optimizer state into `optimizer` (built on self.model's parameters);
        strict: class, parameter count, shapes, dtypes and keys must all match."""
        if "optimizer" not in self.meta:
            raise ValueError("this checkpoint holds no optimizer state")
        prefix = "optim/"
        optimizer.load_flat_state({k[len(prefix):]: v for k, v in self.arrays.items()
                                   if k.startswith(prefix)}, self.meta["optimizer"])


def load_checkpoint(path) -> Checkpoint:
    """Rebuild the model from the file and load its parameters (strictly)."""
    arrays = load_npz(path)
    if "meta" not in arrays:
        raise ValueError(f"{path} is not a numpy_tf checkpoint: it has no 'meta' entry")
    meta = from_json_array(arrays.pop("meta"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a numpy_tf checkpoint (format "
                         f"{meta.get('format')!r}, expected {FORMAT!r})")
    model = build_model(meta["model"])
    prefix = "param/"
    model.load_state_dict({k[len(prefix):]: v for k, v in arrays.items()
                           if k.startswith(prefix)})
    return Checkpoint(meta, model, arrays)
