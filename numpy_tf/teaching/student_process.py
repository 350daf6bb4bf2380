"""The process a submission runs in: `python -m numpy_tf.teaching.student_process JOB_DIR FD`.

numpy_tf.teaching.grading starts one fresh interpreter per submission and never imports the
student's file itself. This side, in order:

1. reads what to run (JOB_DIR/job.json: the source, which functions to try on which cases) and
   the case inputs (JOB_DIR/inputs.npz, read with allow_pickle=False);
2. computes numpy_tf's own cache of every case (a backward is fed numpy_tf's cache when the
   file defines no forward) and notes numpy_tf's code objects a student's function must not
   enter (its own reference function, and every kernel), all before the file can change a thing;
3. runs the file as a module, then each of its functions on each case, announcing every call on
   the event pipe (file descriptor FD) so that the grader can end the process when a call runs
   past the time limit;
4. appends each array a call returned to JOB_DIR/results.npy in .npy format (written and read
   with allow_pickle=False; an array of objects is not sent) and describes the rest (its offset
   there, None, a tuple, another type) in the event that follows.

The grader reads the arrays and judges them; nothing here decides a grade, and what the
submission prints goes to this process's own stdout and stderr (files the grader keeps apart).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
import types
import warnings
from pathlib import Path

import numpy as np

from .layer_table import LAYERS, LayerSpec

_NDARRAY = np.ndarray           # captured before the submission can rebind numpy's names
_COPY = np.ndarray.copy
_TOBYTES = np.ndarray.tobytes
_WRITE_ARRAY = np.lib.format.write_array
_ERRSTATE = np.errstate
_SPECS = dict(LAYERS)           # a submission may clear the table or rebind its functions
_CALL = LayerSpec.call


class _Events:
    """One JSON object per line on the pipe to the grader."""

    def __init__(self, fd: int):
        self.stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, **event) -> None:
        self.stream.write(json.dumps(event) + "\n")
        self.stream.flush()


def describe(error: BaseException, filename: str) -> str:
    """`Type: message (line N)`, N the last line of the submission in the traceback."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno}); nothing in the file can run"
    try:
        lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename == filename]
        text = str(error)
    except BaseException:                       # a __str__ that raises
        lines, text = [], ""
    where = f" (line {lines[-1]})" if lines else ""
    return f"{type(error).__name__}{': ' + text if text else ''}{where}"


def _kernel_codes() -> dict:
    """Every function of numpy_tf.kernels (loaded by the layers that run them): a student's
    function may call none of them."""
    codes = {}
    for module in [module for name, module in sys.modules.items()
                   if name.startswith("numpy_tf.kernels.")]:
        for name, value in vars(module).items():
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
                codes[value.__code__] = f"{module.__name__}.{name}"
    return codes


class _Watch:
    """Records, while a student's function runs, whether it entered numpy_tf's own version of
    itself (by code object, so every route counts: an alias, `import numpy_tf as n`, importlib,
    a layer class that runs the kernel)."""

    def __init__(self):
        self.forbidden: dict = {}
        self.entered: list[str] = []

    def __call__(self, frame, event, arg):
        if event == "call":
            name = self.forbidden.get(frame.f_code)
            if name is not None and name not in self.entered:
                self.entered.append(name)


def _encode(value, stream, depth: int = 0) -> dict:
    """What a function returned, as JSON; its plain ndarrays are appended to `stream`."""
    if value is None:
        return {"kind": "none"}
    if type(value) is _NDARRAY and value.dtype.kind in "biufc":
        offset = stream.tell()
        _WRITE_ARRAY(stream, value, allow_pickle=False)
        stream.flush()
        return {"kind": "array", "offset": offset}
    if isinstance(value, (tuple, list)) and depth == 0:
        return {"kind": type(value).__name__ if type(value) is list else "tuple",
                "items": [_encode(item, stream, 1) for item in value]}
    kind = type(value).__name__
    if isinstance(value, _NDARRAY):
        kind = f"{kind} of dtype {value.dtype}" if type(value) is _NDARRAY else kind
    return {"kind": "other", "type": kind}


def _arrays_in(value, depth: int = 0) -> list:
    """The ndarrays a cache holds (its fields, and the fields of the caches inside it, as
    SwiGLU's holds Linear's), to check they are unchanged."""
    if isinstance(value, _NDARRAY):
        return [value]
    if isinstance(value, (tuple, list)) and depth < 3:
        return [array for item in value for array in _arrays_in(item, depth + 1)]
    return []


class _Runner:
    def __init__(self, job_dir: Path, events: _Events):
        self.job_dir = job_dir
        self.events = events
        self.job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
        with np.load(job_dir / "inputs.npz", allow_pickle=False) as data:
            self.arrays = {key: data[key] for key in data.files}
        self.filename = self.job["filename"]
        self.watch = _Watch()
        self.kernels = _kernel_codes()
        self.references = {f"{name}_{kind}": getattr(spec, kind).__code__
                           for name, spec in _SPECS.items() for kind in ("forward", "backward")}
        self.numpy_tf_caches = {}            # (layer, case number) -> numpy_tf's cache
        for name, cases in self.job["cases"].items():
            spec = _SPECS[name]
            for number, case in enumerate(cases):
                if f"{name}_backward" in self.job["candidates"]:
                    self.numpy_tf_caches[name, number] = \
                        _CALL(spec.forward, self.inputs(case))[1]
        self.results = open(job_dir / "results.npy", "ab")

    def inputs(self, case: dict) -> dict:
        return {name: _COPY(self.arrays[value["array"]]) if "array" in value else value["value"]
                for name, value in case["inputs"].items()}

    def student(self, function, *args, what: str, **kwargs):
        """Call into the submission: announced, watched, its warnings silenced. Returns
        (result, None) or (None, the message of what it raised)."""
        self.events.send(event="call", what=what)
        self.watch.entered = []
        try:
            with warnings.catch_warnings(), _ERRSTATE(all="ignore"):
                warnings.simplefilter("ignore")
                sys.setprofile(self.watch)
                try:
                    result = function(*args, **kwargs)
                finally:
                    sys.setprofile(None)
            return result, None
        except BaseException as error:          # SystemExit, KeyboardInterrupt, ... too
            return None, describe(error, self.filename)
        finally:
            self.events.send(event="return")

    def load(self):
        """Run the file as a module; (module, None) or (None, the message)."""
        module = types.ModuleType(self.job["module"])
        module.__file__ = self.filename
        sys.modules[module.__name__] = module          # dataclasses look their module up
        try:
            code = compile(self.job["source"], self.filename, "exec")
        except SyntaxError as error:
            return None, describe(error, self.filename)
        _, error = self.student(exec, code, vars(module), what="import")
        return (None, error) if error is not None else (module, None)

    def run(self) -> None:
        self.events.send(event="ready")
        module, error = self.load()
        if error is not None:
            self.events.send(event="import_error", message=error)
            return
        namespace = dict(vars(module))          # the functions as the import left them
        owned = [name for name in self.job["candidates"]
                 if isinstance(function := namespace.get(name), types.FunctionType)
                 and function.__module__ == module.__name__]
        self.events.send(event="owned", names=owned)
        skip = set(self.job["skip"])
        for layer_name, cases in self.job["cases"].items():
            spec = _SPECS[layer_name]
            forward = namespace.get(f"{layer_name}_forward") \
                if f"{layer_name}_forward" in owned else None
            for kind in ("forward", "backward"):
                name = f"{layer_name}_{kind}"
                if name not in owned or name in skip or \
                        (kind == "forward" and not self.job["forwards"]):
                    continue
                self.watch.forbidden = {self.references[name]: f"numpy_tf's {name}",
                                        **self.kernels}
                function = namespace[name]
                for number, case in enumerate(cases):
                    if kind == "forward":
                        result = self.forward_case(spec, function, case)
                    else:
                        result = self.backward_case(spec, function, forward, case,
                                                    self.numpy_tf_caches[layer_name, number])
                    self.events.send(event="case", function=name, case=number, id=case["id"],
                                     **result)

    def forward_case(self, spec, function, case: dict) -> dict:
        result, error = self.student(_CALL, function, self.inputs(case), what="forward")
        delegated = list(self.watch.entered)
        if error is not None:
            return {"error": error, "delegated": delegated}
        if not isinstance(result, tuple) or len(result) != 2:
            return {"error": "must return (out, cache)", "delegated": delegated}
        returned = _encode(result[0], self.results)
        return {"returned": returned, "delegated": delegated}

    def backward_case(self, spec, function, forward, case: dict, numpy_tf_cache) -> dict:
        cache = numpy_tf_cache
        if forward is not None:                 # what it enters counts against the forward
            result, error = self.student(_CALL, forward, self.inputs(case),
                                         what="the forward that feeds it")
            if error is not None:
                return {"error": f"the forward that feeds it raised {error}"}
            if not isinstance(result, tuple) or len(result) != 2:
                return {"error": "the forward that feeds it must return (out, cache)"}
            cache = result[1]
        dout = _COPY(self.arrays[case["dout"]])
        held = [(array, _TOBYTES(array)) for array in _arrays_in(cache)]
        grads, error = self.student(function, dout, cache, what="backward")
        delegated = list(self.watch.entered)
        if error is not None:
            return {"error": error, "delegated": delegated}
        returned = _encode(grads, self.results)
        return {"returned": returned, "delegated": delegated,
                "changed_dout": _TOBYTES(dout) != _TOBYTES(self.arrays[case["dout"]]),
                "changed_cache": any(_TOBYTES(array) != before for array, before in held)}


def main(argv: list[str]) -> int:
    job_dir, fd = Path(argv[0]), int(argv[1])
    events = _Events(fd)
    _Runner(job_dir, events).run()
    events.send(event="end")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
