"""What every optimizer shares, as torch.optim.Optimizer: parameter groups, state, checkpoints.

    optimizer.param_groups    [{"params": [Parameter, ...], "lr": ..., ...}, ...]: every
                              hyperparameter the constructor did not get from the group
                              comes from the constructor's arguments; a group's values may
                              be changed between steps (`group["lr"] = ...`, for schedules)
    optimizer.state           {parameter index: {"step": int, "exp_avg": array, ...}},
                              created at a parameter's first step, as torch does
    optimizer.zero_grad()     every Parameter.grad back to zero

Parameters are numbered across the groups in order (0, 1, ... through group 0, then group 1),
which is how torch numbers them in a state_dict. The same Parameter in two places is an error.

Checkpoints, both strict (everything is checked before anything changes) and bit-exact:

    state_dict() / load_state_dict(sd)     torch's layout: {"state": {index: {key: value}},
                                           "param_groups": [{hyperparameters, "params":
                                           [indices], "param_names"?}]}
    flat_state() -> (arrays, meta)         {"state/<index>/<key>": array} and a JSON-able
    load_flat_state(arrays, meta)          meta (class name, groups, parameter shapes and
                                           dtypes): one .npz file, no pickle
"""
from __future__ import annotations

import json
from typing import Iterable

import numpy as np

from ..core.module import Module, Parameter


class Optimizer:
    """A subclass validates its hyperparameters (`_check`), names its state keys, and
    implements `step` using `_prepared()`."""

    REQUIRED_STATE: tuple[str, ...] = ()      # keys the state of a stepped parameter holds
    OPTIONAL_STATE: tuple[str, ...] = ()      # keys it may hold

    def __init__(self, params, defaults: dict):
        self.defaults = self._check(defaults, "")
        self.param_groups: list[dict] = []
        seen: dict[int, str] = {}
        for number, group in enumerate(_as_groups(params)):
            where = f"param_groups[{number}]"
            unknown = sorted(set(group) - {"params", "param_names", *self.defaults})
            if unknown:
                raise ValueError(f"{where} has unknown keys {unknown}; a group holds 'params', "
                                 f"optionally 'param_names', and any of {sorted(self.defaults)}")
            members = as_parameter_list(group["params"], f"{where}['params']")
            names = None if group.get("param_names") is None else \
                [str(name) for name in group["param_names"]]
            if names is not None and len(names) != len(members):
                raise ValueError(f"{where}['param_names'] has {len(names)} names for "
                                 f"{len(members)} params")
            for position, parameter in enumerate(members):
                label = f"{where}['params'][{position}]" + \
                    (f" ({names[position]!r})" if names else "")
                if id(parameter) in seen:
                    raise ValueError(f"the same Parameter is given twice: {seen[id(parameter)]}"
                                     f" and {label}; a parameter may be in one group, once")
                seen[id(parameter)] = label
            hyper = {key: group.get(key, value) for key, value in self.defaults.items()}
            self.param_groups.append({"params": members, **self._check(hyper, f"{where}: "),
                                      **({"param_names": names} if names else {})})
        if not seen:
            raise ValueError("the optimizer got an empty parameter list")
        self.state: dict[int, dict] = {}

    def _check(self, hyper: dict, where: str) -> dict:
        """`hyper` validated and normalised (Python floats, bools, tuples); `where` prefixes
        the error message ("param_groups[1]: ")."""
        raise NotImplementedError

    def _required_state(self, hyper: dict) -> tuple[str, ...]:
        """The state keys beyond REQUIRED_STATE a parameter with these hyperparameters holds."""
        return ()

    def step(self) -> None:
        raise NotImplementedError

    # -- the parameters ----------------------------------------------------------------------
    def _indexed(self) -> list[tuple[int, int, Parameter]]:
        """(index, group number, parameter) for every parameter, numbered across groups."""
        return [(index, number, parameter) for index, (number, parameter) in enumerate(
            (number, parameter) for number, group in enumerate(self.param_groups)
            for parameter in group["params"])]

    def _label(self, index: int) -> str:
        """"param 3 ('blocks.0.norm.weight')" (the name when the group has names)."""
        position = index
        for group in self.param_groups:
            if position < len(group["params"]):
                names = group.get("param_names")
                return f"param {index}" + (f" ({names[position]!r})" if names else "")
            position -= len(group["params"])
        return f"param {index}"

    def _prepared(self) -> list[tuple[int, Parameter, dict]]:
        """(index, parameter, hyperparameters) for one step. Every group's hyperparameters
        and every gradient are checked first, so a bad value never leaves a half-made step."""
        hypers = [self._check({key: group[key] for key in self.defaults}, f"param_groups[{n}]: ")
                  for n, group in enumerate(self.param_groups)]
        for index, _, parameter in self._indexed():
            grad = parameter.grad
            if not isinstance(grad, np.ndarray) or grad.shape != parameter.shape \
                    or grad.dtype != parameter.dtype:
                raise TypeError(f"{self._label(index)}: grad must be a {parameter.dtype} array "
                                f"of shape {parameter.shape}; got "
                                f"{getattr(grad, 'dtype', type(grad).__name__)} "
                                f"{getattr(grad, 'shape', '')}")
        return [(index, parameter, hypers[number])
                for index, number, parameter in self._indexed()]

    def zero_grad(self) -> None:
        for _, _, parameter in self._indexed():
            parameter.zero_grad()

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """torch's layout. The arrays are copies, so later steps do not change a state_dict
        already taken; "step" is a Python int."""
        state = {index: {key: value.copy() if isinstance(value, np.ndarray) else value
                         for key, value in entry.items()}
                 for index, entry in sorted(self.state.items())}
        groups, start = [], 0
        for number, group in enumerate(self.param_groups):
            saved = self._check({key: group[key] for key in self.defaults},
                                f"param_groups[{number}]: ")
            saved["params"] = list(range(start, start + len(group["params"])))
            if "param_names" in group:
                saved["param_names"] = list(group["param_names"])
            start += len(group["params"])
            groups.append(saved)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the hyperparameters and state of `state_dict` (the Parameters stay). Checked
        first: the same number of groups and of parameters in each, the same names where both
        have them, valid hyperparameters, the state keys this optimizer keeps, and state arrays
        of each parameter's shape and dtype. The error lists every problem."""
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            given = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict)
            raise ValueError("state_dict must be a dict with keys 'param_groups' and 'state'; "
                             f"got {given}")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict) \
                or not all(isinstance(group, dict) for group in saved_groups):
            raise ValueError("state_dict['param_groups'] must be a list of dicts and "
                             "state_dict['state'] a dict")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the checkpoint has {len(saved_groups)} parameter groups, this "
                             f"{type(self).__name__} has {len(self.param_groups)}")
        problems, hypers, start = [], [], 0
        for number, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            where = f"param_groups[{number}]"
            expected = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            if list(saved.get("params", ())) != expected:
                problems.append(f"{where}: expected params {expected}, got {saved.get('params')}")
            if "param_names" in saved and "param_names" in group \
                    and list(saved["param_names"]) != group["param_names"]:
                problems.append(f"{where}: parameter names differ: checkpoint "
                                f"{list(saved['param_names'])}, optimizer {group['param_names']}")
            unknown = sorted(set(saved) - {"params", "param_names", *self.defaults})
            missing = sorted(set(self.defaults) - set(saved))
            if unknown or missing:
                problems.append(f"{where}: unknown keys {unknown}, missing keys {missing}")
                hypers.append(None)
                continue
            try:
                hypers.append(self._check({key: saved[key] for key in self.defaults},
                                          f"{where}: "))
            except (TypeError, ValueError) as error:
                problems.append(str(error))
                hypers.append(None)
        rows = self._indexed()
        state = {}
        for index, entry in saved_state.items():
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) \
                    or not 0 <= index < len(rows) or not isinstance(entry, dict):
                problems.append(f"the state has an entry for parameter {index!r}; this "
                                f"{type(self).__name__} has parameters 0..{len(rows) - 1}")
                continue
            _, number, parameter = rows[index]
            state[int(index)] = self._checked_state(int(index), parameter, hypers[number],
                                                    entry, problems)
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__} failed: "
                             + " | ".join(problems))
        for group, hyper in zip(self.param_groups, hypers):
            group.update(hyper)
        self.state = state

    def _checked_state(self, index: int, parameter: Parameter, hyper: dict | None,
                       entry: dict, problems: list[str]) -> dict:
        """A copy of one parameter's saved state; what is wrong with it goes to `problems`."""
        label, keys = self._label(index), set(entry)
        required = set(self.REQUIRED_STATE) | set(self._required_state(hyper or {}))
        if not required <= keys or not keys <= required | set(self.OPTIONAL_STATE):
            problems.append(f"{label}: state keys {sorted(keys)}; expected {sorted(required)}"
                            f" (and possibly {sorted(self.OPTIONAL_STATE)})")
            return {}
        checked = {}
        for key, value in entry.items():
            if key == "step":
                step = np.asarray(value)
                if step.shape != () or step.dtype.kind not in "iu" or step < 0:
                    problems.append(f"{label}: step must be a non-negative integer; got "
                                    f"{value!r}")
                else:
                    checked[key] = int(step)
            elif not isinstance(value, np.ndarray):
                problems.append(f"{label}: {key} must be a numpy array; got "
                                f"{type(value).__name__}")
            elif value.shape != parameter.shape or value.dtype != parameter.dtype:
                problems.append(f"{label}: {key} must be {parameter.dtype} of shape "
                                f"{parameter.shape}; got {value.dtype} of shape {value.shape}")
            else:
                checked[key] = value.copy()
        return checked

    def flat_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """({"state/<index>/<key>": array}, meta): each "step" a 0-d int64 array; meta
        (JSON-able) holds the class name, the param_groups and every parameter's shape and
        dtype. A checkpoint stores the arrays and `json.dumps(meta)` in one .npz."""
        full = self.state_dict()
        arrays = {f"state/{index}/{key}": np.asarray(value, dtype=np.int64) if key == "step"
                  else value for index, entry in full["state"].items()
                  for key, value in entry.items()}
        groups = [{key: list(value) if isinstance(value, tuple) else value
                   for key, value in group.items()} for group in full["param_groups"]]
        params = [{"shape": list(parameter.shape), "dtype": parameter.dtype.name}
                  for _, _, parameter in self._indexed()]
        return arrays, {"optimizer": type(self).__name__, "param_groups": groups,
                        "params": params}

    def load_flat_state(self, arrays: dict[str, np.ndarray], meta) -> None:
        """Load what `flat_state` gave; `meta` may be the dict, its JSON text, or the 0-d
        string array a .npz holds. Strict: the optimizer class, the number of parameters and
        each one's shape and dtype must match, and every key must be "state/<index>/<key>"."""
        if isinstance(meta, np.ndarray):
            meta = meta[()]
        if isinstance(meta, (str, np.str_)):
            meta = json.loads(str(meta))
        if not isinstance(meta, dict) or meta.get("optimizer") != type(self).__name__:
            found = meta.get("optimizer") if isinstance(meta, dict) else meta
            raise ValueError(f"the checkpoint holds {found!r} state; this optimizer is "
                             f"{type(self).__name__}")
        rows, saved_params = self._indexed(), meta.get("params", [])
        problems = [] if len(saved_params) == len(rows) else [
            f"the checkpoint has {len(saved_params)} parameters, this "
            f"{type(self).__name__} has {len(rows)}"]
        for (index, _, parameter), saved in zip(rows, saved_params):
            if tuple(saved["shape"]) != parameter.shape or saved["dtype"] != parameter.dtype.name:
                problems.append(f"{self._label(index)}: the checkpoint has {saved['dtype']} of "
                                f"shape {tuple(saved['shape'])}, the parameter is "
                                f"{parameter.dtype} of shape {parameter.shape}")
        state: dict[int, dict] = {}
        for name, value in arrays.items():
            parts = name.split("/")
            if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
                problems.append(f"unexpected key {name!r} (expected 'state/<index>/<key>')")
                continue
            state.setdefault(int(parts[1]), {})[parts[2]] = value
        if problems:
            raise ValueError(f"load_flat_state into {type(self).__name__} failed: "
                             + " | ".join(problems))
        self.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def as_parameter_list(params, what: str) -> list[Parameter]:
    if isinstance(params, Parameter):
        return [params]
    if isinstance(params, (set, frozenset)):
        raise TypeError(f"{what} must be an ordered collection (a list); a set's order "
                        "changes between runs")
    if isinstance(params, (Module, dict, str)) or not isinstance(params, Iterable):
        raise TypeError(f"{what} must be a list of Parameters (model.parameters()); got "
                        f"{type(params).__name__}")
    params = list(params)
    for position, parameter in enumerate(params):
        if not isinstance(parameter, Parameter):
            raise TypeError(f"{what}[{position}] must be a numpy_tf Parameter; got "
                            f"{type(parameter).__name__}")
    return params


def _as_groups(params) -> list[dict]:
    """`params` as group dicts: Parameters make one group; dicts are groups already."""
    if isinstance(params, dict):
        params = [params]
    if isinstance(params, (list, tuple)) and params and all(isinstance(item, dict)
                                                            for item in params):
        for number, group in enumerate(params):
            if "params" not in group:
                raise ValueError(f"param_groups[{number}] has no 'params' key")
        return [dict(group) for group in params]
    return [{"params": as_parameter_list(params, "params")}]
