"""The core every layer stands on: Parameter, Module, and the two containers.

A Parameter holds an array (`data`) and the gradient accumulated into it (`grad`, same shape and
dtype). A Module owns Parameters and other Modules as attributes; their torch-style names are the
attribute paths (`blocks.0.attention.qkv.weight`), so a torch state_dict loads as is.

The forward/backward contract (SPEC §3):

    out, cache = layer.forward(*inputs)        # the cache is returned, never kept on the layer
    dinputs = layer.backward(dout, cache)      # parameter gradients are ADDED into Parameter.grad

This file imports nothing of numpy_tf.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import operator
from typing import Iterator, Mapping, NamedTuple

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def float_dtype(dtype) -> np.dtype:
    """The numpy dtype for `dtype`, which must be float32 or float64."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64; got {dtype!r}") from None
    if resolved not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64; got {resolved}")
    return resolved


class Parameter:
    """A trainable array and its gradient. `grad` starts at zero and only ever grows by `+=`.

    The gradient array is allocated the first time it is used, so a model that only runs
    forward (inference, generation) holds its weights once, not twice."""

    __slots__ = ("data", "_grad")

    def __init__(self, data: np.ndarray):
        if not isinstance(data, np.ndarray) or data.dtype not in FLOAT_DTYPES:
            raise TypeError("Parameter data must be a float32 or float64 numpy array; "
                            f"got {getattr(data, 'dtype', type(data).__name__)}")
        self.data = data
        self._grad = None

    @property
    def grad(self) -> np.ndarray:
        if self._grad is None:
            self._grad = np.zeros_like(self.data)
        return self._grad

    @grad.setter
    def grad(self, value: np.ndarray) -> None:
        self._grad = value

    def zero_grad(self) -> None:
        if self._grad is not None:
            self._grad.fill(0)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def size(self) -> int:
        return self.data.size

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


def _recorded(module: "Module", kind: str, recorder: "Recorder"):
    """module's bound forward or backward, wrapped so that `recorder` sees its output (forward)
    or the gradient it was given (backward). record_activations sets these wrappers on the
    modules' instances for the length of its `with` block only: outside it, a call costs
    nothing extra and holds no extra reference to its arguments."""
    method = getattr(module, kind)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if kind == "backward":                          # the gradient arriving, at entry
            recorder.record(kind, module, args[0])
        result = method(*args, **kwargs)
        if kind == "forward":                           # the output leaving, at exit
            recorder.record(kind, module, result[0])
        return result
    return wrapper


RECORDED = ("forward", "backward")     # the methods record_activations wraps on an instance


class Module:
    """A holder of Parameters and sub-Modules, named by attribute path as torch names them.

    Subclasses call `super().__init__(dtype)` first, then assign Parameters and Modules as
    attributes. Like torch, a module lists its own Parameters before those of its children,
    each group in assignment order.
    """

    def __init__(self, dtype=np.float64):
        self.dtype = float_dtype(dtype)
        self.training = True        # dropout acts only in training mode, as in torch

    def __getstate__(self) -> dict:
        """What a copy (copy.deepcopy, astype) takes: everything but a recorder's wrappers,
        which belong to this instance (see record_activations)."""
        state = dict(vars(self))
        for kind in RECORDED:
            state.pop(kind, None)
        return state

    def is_recorded(self) -> bool:
        """Whether record_activations' wrappers sit on this module now."""
        return any(kind in vars(self) for kind in RECORDED)

    def feeding(self, out, cache):
        """`with module.feeding(out, cache): consumer.forward(out)`: a block in which a
        Linear given this module's output `out` may keep, instead of out, what rebuilds it.
        Here a block that does nothing; LayerNorm and RMSNorm say otherwise (layers.norm)."""
        return contextlib.nullcontext()

    def runs_forward(self, forward) -> bool:
        """Whether self.forward(...) runs the function `forward` as defined: no subclass
        overriding it, no patch of the class's attribute, no wrapper on the instance (any of
        which could replace or write what it returns or is given)."""
        return type(self).forward is forward and "forward" not in vars(self)

    def backward_is_watched(self) -> bool:
        """Whether a wrapper on this instance sees the gradients its backward is given or
        returns (record_activations, rounding_every_module), so that a parent must hand it an
        array of its own. A wrapper whose `watches` attribute is False only acts after the
        backward has returned, on nothing it was given (BatchSplit's parts)."""
        wrapper = vars(self).get("backward")
        return wrapper is not None and getattr(wrapper, "watches", True)

    def train(self, mode: bool = True) -> "Module":
        """Set training mode on this module and every module below it; returns self."""
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    # -- what the module holds --------------------------------------------------------------
    def _own(self) -> Iterator[tuple[str, object]]:
        for name, value in vars(self).items():
            if isinstance(value, (Parameter, Module)):
                yield name, value

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """(name, module) for this module ("" or `prefix`) and every module below it."""
        found: list[tuple[str, Module]] = []
        self._collect_modules(prefix, found)
        return iter(found)

    def _collect_modules(self, prefix: str, found: list) -> None:
        found.append((prefix, self))
        for name, value in vars(self).items():
            if isinstance(value, Module):
                value._collect_modules(f"{prefix}.{name}" if prefix else name, found)

    def _named_parameters_all(self) -> list[tuple[str, Parameter]]:
        """(name, Parameter) for every name a Parameter is reached by: a module's own
        Parameters first, then each child's, in the order they were set."""
        found: list[tuple[str, Parameter]] = []
        self._collect_parameters("", found)
        return found

    def _collect_parameters(self, prefix: str, found: list) -> None:
        # a list filled by plain recursion: nested generators cost a resumption per level for
        # every Parameter, which the fast gradient check of a small model paid several times
        children = []
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                found.append((f"{prefix}.{name}" if prefix else name, value))
            elif isinstance(value, Module):
                children.append((f"{prefix}.{name}" if prefix else name, value))
        for name, child in children:
            child._collect_parameters(name, found)

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Each Parameter object once; a tied Parameter under the first name it is reached by."""
        seen: set[int] = set()
        for name, parameter in self._named_parameters_all():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                yield name, parameter

    def parameters(self) -> list[Parameter]:
        return [parameter for _, parameter in self.named_parameters()]

    def num_parameters(self) -> int:
        """The number of trainable scalars, each tied Parameter counted once."""
        return sum(parameter.size for parameter in self.parameters())

    def constant_elements(self) -> dict[str, np.ndarray]:
        """{parameter name: bool mask} of the elements whose gradient is zero by definition
        rather than by derivative (torch's Embedding padding_idx row). Finite differences see
        them change the output, so a gradient check must skip them. Layers with such elements
        override `_own_constant_elements`."""
        masks = {}
        for prefix, module in self.named_modules():
            for name, mask in module._own_constant_elements().items():
                masks[f"{prefix}.{name}" if prefix else name] = mask
        return masks

    def _own_constant_elements(self) -> dict[str, np.ndarray]:
        return {}

    def zero_grad(self) -> None:
        for parameter in self.parameters():
            parameter.zero_grad()

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """{name: array} for every name a Parameter is reached by (a tied weight appears under
        each of its names, as in torch). The arrays are the module's own, not copies."""
        return {name: parameter.data for name, parameter in self._named_parameters_all()}

    def grad_dict(self) -> dict[str, np.ndarray]:
        """{name: gradient}, named exactly as `state_dict`."""
        return {name: parameter.grad for name, parameter in self._named_parameters_all()}

    def load_state_dict(self, state: Mapping[str, np.ndarray], strict: bool = True) -> None:
        """Copy `state` into the Parameters. Names, shapes and dtypes are all checked before
        anything is copied; the error lists every missing, unexpected or mismatched key.
        With strict=False, missing and unexpected keys are allowed (mismatches never are)."""
        expected = dict(self._named_parameters_all())
        missing = [name for name in expected if name not in state]
        unexpected = [name for name in state if name not in expected]
        mismatched = []
        for name, parameter in expected.items():
            if name not in state:
                continue
            value = state[name]
            if not isinstance(value, np.ndarray):
                mismatched.append(f"{name}: expected a numpy array, got {type(value).__name__}")
            elif isinstance(value, (np.matrix, np.ma.MaskedArray)):    # validate.plain_arithmetic
                mismatched.append(f"{name}: expected a plain numpy array, not a "
                                  f"{type(value).__name__}")
            elif value.shape != parameter.shape:
                mismatched.append(f"{name}: expected shape {parameter.shape}, got {value.shape}")
            elif value.dtype != parameter.dtype:
                mismatched.append(f"{name}: expected dtype {parameter.dtype}, got {value.dtype}")
        tied_conflicts = []
        by_parameter: dict[int, tuple[str, np.ndarray]] = {}
        for name, parameter in expected.items():
            if name in state and not mismatched:
                first = by_parameter.setdefault(id(parameter), (name, state[name]))
                if first[0] != name and not np.array_equal(first[1], state[name]):
                    tied_conflicts.append(f"{first[0]} and {name} are one tied Parameter "
                                          "but were given different values")
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if mismatched:
            problems.append("mismatched: " + "; ".join(mismatched))
        problems += tied_conflicts
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__} failed: "
                             + " | ".join(problems))
        for name, parameter in expected.items():
            if name in state:
                np.copyto(parameter.data, state[name])

    def astype(self, dtype) -> "Module":
        """A deep copy of this module whose Parameters are `dtype`, without gradients (ties are
        kept: a Parameter reached twice is copied once)."""
        dtype = float_dtype(dtype)
        clone = _deep_copy(self, {}, dtype)
        for _, module in clone.named_modules():
            module.dtype = dtype
        return clone

    def __repr__(self) -> str:
        children = [f"  {name}: {type(value).__name__}" for name, value in self._own()]
        return f"{type(self).__name__}(\n" + "\n".join(children) + "\n)" if children else \
            f"{type(self).__name__}()"


_SHARED = (type(None), bool, int, float, complex, str, bytes, np.dtype, np.generic)


def _deep_copy(value, memo: dict, dtype: np.dtype):
    """copy.deepcopy(value) for Module.astype, with each Parameter's data converted to `dtype`
    and its gradient dropped, walking Modules, Parameters, plain arrays and the containers
    directly (deepcopy's generic protocol cost more than the model's forward at small sizes);
    every other object, and a Module class with its own copy protocol, goes to deepcopy, with
    the same memo (one object reached twice is copied once)."""
    if isinstance(value, _SHARED):                  # immutable: deepcopy returns them as is
        return value
    key = id(value)
    if key in memo:
        return memo[key]
    kind = type(value)
    if kind is Parameter:
        clone = memo[key] = Parameter(value.data.astype(dtype))
    elif isinstance(value, Parameter):                  # a subclass: its own attributes too
        clone = copy.deepcopy(value, memo)
        clone.data, clone.grad = clone.data.astype(dtype), None
    elif isinstance(value, Module) and not hasattr(value, "__deepcopy__") and \
            not hasattr(value, "__setstate__"):
        clone = memo[key] = object.__new__(kind)
        clone.__dict__.update({name: _deep_copy(item, memo, dtype)
                               for name, item in value.__getstate__().items()})
    elif kind is np.ndarray and value.dtype != object:
        clone = memo[key] = value.copy()
    elif kind is list:
        clone = memo[key] = []
        clone.extend(_deep_copy(item, memo, dtype) for item in value)
    elif kind is dict:
        clone = memo[key] = {}
        clone.update((_deep_copy(k, memo, dtype), _deep_copy(item, memo, dtype))
                     for k, item in value.items())
    elif kind is tuple:
        items = tuple(_deep_copy(item, memo, dtype) for item in value)
        clone = memo[key] = value if all(map(operator.is_, items, value)) else items
    else:
        clone = copy.deepcopy(value, memo)
    return clone


class Recorder:
    """What record_activations collects: for every named module (not the root) its forward
    output (`activations`) and the gradient its backward was given (`gradients`, the gradient
    of the loss with respect to that output), keyed by the module's name, in call order. A
    module called twice in one pass gets `name#2` for its second call; a backward gets the key
    of the forward it undoes (the last one not yet undone: backward runs in exact reverse), so
    gradients[key] is always the gradient of activations[key]."""

    def __init__(self, model: "Module"):
        self.names = {id(module): name for name, module in model.named_modules() if name}
        self.activations: dict[str, np.ndarray] = {}
        self.gradients: dict[str, np.ndarray] = {}
        self._open: dict[int, list[str]] = {}      # per module, forward keys not yet undone

    def record(self, kind: str, module: "Module", value) -> None:
        name = self.names.get(id(module))
        if name is None or not isinstance(value, np.ndarray):
            return
        store = self.activations if kind == "forward" else self.gradients
        open_keys = self._open.setdefault(id(module), [])
        if kind == "backward" and open_keys:
            store[open_keys.pop()] = value.copy()
            return
        key, count = name, 1
        while key in store:
            count += 1
            key = f"{name}#{count}"
        if kind == "forward":
            open_keys.append(key)
        store[key] = value.copy()


class record_activations:
    """with record_activations(model) as recorder: run forward and backward; then
    recorder.activations and recorder.gradients hold every module's output and its gradient."""

    def __init__(self, model: Module):
        self.model = model
        self.recorder = Recorder(model)
        self._before: list[tuple[Module, str, object]] = []   # what each module had set

    def __enter__(self) -> Recorder:
        modules = {id(module): module for name, module in self.model.named_modules() if name}
        for module in modules.values():
            for kind in RECORDED:
                if not hasattr(module, kind):       # a ModuleList: nothing to record
                    continue
                self._before.append((module, kind, vars(module).get(kind)))
                setattr(module, kind, _recorded(module, kind, self.recorder))
        return self.recorder

    def __exit__(self, *exc) -> None:
        for module, kind, before in reversed(self._before):
            if before is None:
                del vars(module)[kind]          # the class's method shows through again
            else:
                setattr(module, kind, before)   # an outer recorder's wrapper
        self._before.clear()


class ModuleList(Module):
    """Modules named by position ("0", "1", ...), as torch.nn.ModuleList. It has no forward."""

    def __init__(self, modules=(), dtype=np.float64):
        super().__init__(dtype)
        for index, module in enumerate(modules):
            setattr(self, str(index), module)

    def __len__(self) -> int:
        return sum(1 for _ in self._own())

    def __getitem__(self, index: int) -> Module:
        return getattr(self, str(range(len(self))[index]))

    def __iter__(self) -> Iterator[Module]:
        return (value for _, value in self._own())


class SequentialCache(NamedTuple):
    caches: list                # one cache per module, in the order the modules ran


class Sequential(ModuleList):
    """Modules applied in order, named by position, as torch.nn.Sequential.

    forward keeps one cache per module; backward runs them in exact reverse order."""

    def __init__(self, *modules: Module, dtype=np.float64):
        super().__init__(modules, dtype)

    def forward(self, x: np.ndarray):
        caches = []
        for module in self:
            x, cache = module.forward(x)
            caches.append(cache)
        return x, SequentialCache(caches)

    def backward(self, dout: np.ndarray, cache: SequentialCache):
        from .validate import cache_kind        # validate imports this module
        cache_kind(cache, SequentialCache)
        for module, module_cache in zip(reversed(list(self)), reversed(cache.caches)):
            dout = module.backward(dout, module_cache)
        return dout
