"""BatchSplit: a training objective whose batch runs in parts, one part per thread.

A step's batch is B independent rows: every numpy_tf model reads each row on its own, and a
mean loss over the batch is the count-weighted mean of the parts' mean losses,

    loss = (sum_k n_k L_k) / N,        N = sum_k n_k,

with n_k the targets kept in part k (cross-entropy's `count`) and L_k the part's mean. Its
gradient is the sum of the parts' gradients, each part's backward given dloss n_k / N:

    dloss/dW = sum_k (n_k / N) dL_k/dW.

So the batch can be cut along its first axis into `threads` parts of consecutive rows and each
part run through the same weights on its own thread, as a data-parallel step runs one part per
device: NumPy's operations release the GIL, the parts share nothing but the weights, and each
thread's elementwise work stays in its own core's cache. The matrix products then run one BLAS
thread per part (the BLAS is set to one thread for the step and put back after): at 2 threads
on a 2-core machine the step of the benchmarks' small to large GPTs took 10-25 % less time
this way than with the whole batch and a 2-thread BLAS (docs/benchmarks.md).

Each part runs a twin of the objective: a copy whose Parameters hold the same weight arrays
(not copies: the twin always reads the weights the model holds, set again at every call), in
the model's train/eval mode, made again whenever anything else the objective's modules hold (a
label_smoothing, an activation's approximation, a module) is no longer the same object. What
the parts' backwards add into is arranged so that no two threads ever add into one array and the
sums are taken in one order whatever the threads' timing:

- part 0 adds straight into the model's gradient arrays;
- part k > 0 adds into an array of its own for each Parameter (made as zeros when its backward
  first adds into it), which is added into the model's, and let go, as soon as parts 0 .. k-1
  have added theirs and part k has finished with that Parameter;
- a part has finished with a Parameter when the backward of the smallest module holding every
  module that owns it has returned (a Linear's weight when that Linear's backward returns, or
  its parent's, for a parent that adds into its children's gradients itself; a tied weight
  when the module holding both of its users returns). Were a part to add into a Parameter after
  that, it would get a further array, added in after every part has ended, in part order.

So each model gradient is  g + (part 0's terms, in order) + s_1 + ... + s_{K-1}  (s_k: part k's
sum), every call the same bits, and a part's own arrays live for about one module's backward
rather than to the end of the step. Measured (`python -m benchmarks.worker memory --threads
2`, float32): the benchmarks' small GPT's step 41.7 MiB at 2 threads, 41.1 whole; medium
134.2, 134.1 whole; large 380.2, 372.1 whole (44.05, 148.5 and 453.8 when every extra part
kept a gradient of the whole model to the end of its backward).

The parts' sums are the whole batch's sums taken in another order, so the loss and the
gradients equal those of the whole batch on one thread within a few ulps of each array's
largest |value| (the bound and the measurements are in tests/test_split.py). A batch runs whole,
on the calling thread, exactly as objective.forward would, when splitting could change what it
computes or says:

- the objective is not one numpy_tf's families read row by row: NextTokenLoss, TargetLoss,
  MaskedLMLoss or Seq2SeqLoss around a model class of numpy_tf.models (MixtralLoss's
  load-balancing term counts the whole batch's tokens; another model may mix rows);
- an argument is not an array whose first axis is the batch's, or None (a Generator for
  dropout: the parts would draw correlated masks), or the batch has one row;
- two parts would each have less work than `min_part_work` (the model's parameters times the
  positions of the first batch argument; MIN_PART_WORK by default): the parts are then as
  many as have that much each;
- a module has record_activations' wrappers (they would see one part only);
- the BLAS cannot be set to one thread (numpy_tf.core.threads.can_set_blas_threads);
- a part refuses its input: the whole batch is then run as well, so that the error names the
  input the caller gave, not a part of it.
"""
from __future__ import annotations

import contextvars
import copy
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor, wait
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from ..core.threads import blas_threads, can_set_blas_threads
from ..models.objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss, TargetLoss

SPLITTABLE = (NextTokenLoss, TargetLoss, MaskedLMLoss, Seq2SeqLoss)   # exact classes
# parameters x positions of the first batch argument that a part needs at least: below it, a
# part's NumPy calls are too short and the threads spend the step handing the GIL to each other
# (2 threads, float32, the whole batch against 2 parts: GPTConfig.tiny() on 4 positions a
# part 1.0 against 4.1 ms, on 128 7.0 against 1.9; the benchmarks' small GPT, 0.87M
# parameters, on 128 positions 18.6 against 22.3 ms, 256 even, 512 61 against 71 ms)
MIN_PART_WORK = 2 ** 28


class SplitCache(NamedTuple):
    caches: tuple           # each part's cache, in batch order
    counts: tuple           # n_k: each part's kept targets
    count: int              # N: the whole batch's kept targets (Trainer.evaluate weighs by it)
    output_spec: tuple      # ((), dtype): the loss's
    twins: tuple            # the parts' twins that made the caches (and run their backwards)


class BatchSplit:
    """forward(*batch, **kwargs) -> (loss, cache) and backward(dloss, cache) of `objective`,
    the batch cut into up to `threads` parts run on as many threads (see the module text).
    `.model` is the objective's model, so a Trainer takes a BatchSplit as its objective."""

    def __init__(self, objective: Module, threads: int = 2, *,
                 min_part_work: int = MIN_PART_WORK):
        if not isinstance(objective, Module) or not hasattr(objective, "model"):
            raise TypeError(f"objective must be a training objective (a Module with a .model, "
                            f"such as NextTokenLoss); got {type(objective).__name__}")
        self.objective, self.model = objective, objective.model
        self.threads = validate.positive_int("threads", threads)
        self.min_part_work = validate.non_negative_int("min_part_work", min_part_work)
        self._twins: list[_Twin] = []
        self._built_for: tuple = ()
        self._built_settings: list = []
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"BatchSplit({type(self.objective).__name__}, threads={self.threads})"

    # -- forward -----------------------------------------------------------------------------
    def forward(self, *batch, **kwargs):
        own = self.objective.parameters()
        parts = self._parts(batch, kwargs, own)
        if parts is None:
            return self.objective.forward(*batch, **kwargs)
        twins = self._twins_for(len(parts), own)
        try:
            results = self._run([(twin.objective.forward, args, kw)
                                 for twin, (args, kw) in zip(twins, parts)])
        except (TypeError, ValueError):
            # a part refused its input: the whole batch's forward says what is wrong with the
            # caller's arrays (and, in the unlikely case that it accepts them, computes them)
            return self.objective.forward(*batch, **kwargs)
        losses = [loss for loss, _ in results]
        counts = tuple(int(cache.loss.count) for _, cache in results)
        total = sum(counts)
        dtype = np.asarray(losses[0]).dtype
        # sum_k n_k L_k / N in float64, rounded once to the loss's dtype; 0 when nothing is
        # kept, as cross-entropy's mean over no targets is
        mean = sum(float(loss) * n for loss, n in zip(losses, counts)) / total if total else 0.0
        cache = SplitCache(tuple(cache for _, cache in results), counts, total, ((), dtype),
                           tuple(twins))
        return (np.array(mean, dtype) if isinstance(losses[0], np.ndarray) else
                dtype.type(mean)), cache

    __call__ = forward

    # -- backward ----------------------------------------------------------------------------
    def backward(self, dloss, cache):
        """Each part's backward with dloss n_k / N, its gradients handed into the model's in
        part order (the module text). Returns what the objective's backward returns, the
        parts' arrays put back together along the batch axis (None when it returns None)."""
        if not isinstance(cache, SplitCache):
            return self.objective.backward(dloss, cache)
        dtype = cache.output_spec[1]
        validate.gradient("dloss", dloss, (), dtype, "the objective")
        twins = cache.twins                 # as forward left them: the caches are theirs
        handoff = _Handoff(twins[0].own, len(twins))
        scale = float(np.asarray(dloss, dtype=dtype))
        for twin in twins:
            twin.handoff = handoff
        try:
            results = self._run([(twin.objective.backward,
                                  (dtype.type(scale * n / cache.count if cache.count else 0.0),
                                   part), {})
                                 for twin, part, n in zip(twins, cache.caches, cache.counts)])
        finally:
            for twin in twins:
                twin.handoff = None
        handoff.finish()
        return _joined(results)

    # -- the parts ---------------------------------------------------------------------------
    def _parts(self, batch: tuple, kwargs: dict, own: list) -> list | None:
        """[(args, kwargs)] of each part, consecutive rows of every array; None when the batch
        runs whole (the module text lists when)."""
        objective = self.objective
        if self.threads < 2 or type(objective) not in SPLITTABLE \
                or not type(objective.model).__module__.startswith("numpy_tf.models"):
            return None
        arrays = [value for value in (*batch, *kwargs.values()) if value is not None]
        if not arrays or any(type(value) is not np.ndarray or value.ndim == 0
                             for value in arrays):
            return None
        rows = arrays[0].shape[0]
        if rows < 2 or any(value.shape[0] != rows for value in arrays):
            return None
        if any(module.is_recorded() for _, module in objective.named_modules()):
            return None                                     # record_activations is watching
        if not can_set_blas_threads():
            return None
        work = arrays[0].size * sum(parameter.size for parameter in own)
        count = min(self.threads, rows, work // max(self.min_part_work, 1))
        if count < 2:
            return None
        bounds = [rows * k // count for k in range(count + 1)]

        def part(value, k):
            return None if value is None else value[bounds[k]:bounds[k + 1]]
        return [(tuple(part(value, k) for value in batch),
                 {name: part(value, k) for name, value in kwargs.items()})
                for k in range(count)]

    def _twins_for(self, parts: int, own: list) -> list["_Twin"]:
        """The twins of parts 0 .. parts - 1, reading the weight arrays of `own` (the
        objective's Parameters) as they are now; made again when the objective's Parameters,
        its modules or anything else they hold (a label_smoothing, a config, a buffer) are no
        longer the objects they were made from."""
        modules = [module for _, module in self.objective.named_modules()]
        settings = _settings(modules)
        if len(own) != len(self._built_for) or any(
                a is not b for a, b in zip(own, self._built_for)) \
                or not _same_settings(settings, self._built_settings):
            self._twins, self._built_for, self._built_settings = [], tuple(own), settings
        while len(self._twins) < parts:
            self._twins.append(_Twin(self.objective, own, len(self._twins)))
        for twin in self._twins[:parts]:
            for parameter, twins in zip(own, twin.parameters):
                twins.data = parameter.data         # the optimizer may have put in new arrays
            for module, twins in zip(modules, twin.modules):
                twins.training = module.training    # and the model may have gone to eval()
        return self._twins[:parts]

    def _run(self, calls: list) -> list:
        """[function(*args, **kwargs)] of each call, the first on this thread, the others on
        the pool's, each in a copy of this thread's context (reference_path and np.errstate
        are context variables), with the BLAS on one thread. Every call has ended before this
        returns or raises; the first failed call's exception (in part order) is raised."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1,
                                            thread_name_prefix="numpy_tf-part")
        with blas_threads(1):
            futures = [self._pool.submit(contextvars.copy_context().run, function, *args,
                                         **kwargs) for function, args, kwargs in calls[1:]]
            function, args, kwargs = calls[0]
            try:
                first = function(*args, **kwargs)
            finally:
                wait(futures)                       # nothing runs on after this returns
            return [first, *(future.result() for future in futures)]


class _Handoff:
    """One backward's gradients on their way into the model's (the module text): what a part's
    Parameter hands out as its gradient, when a part has finished with a Parameter, and the
    adds into the model's gradient, in part order, under one lock."""

    def __init__(self, own: list, parts: int):
        self.own, self.parts = own, parts
        self.lock = threading.Lock()
        self.held = [[None] * len(own) for _ in range(parts)]      # part k > 0's own arrays
        self.finished = [[False] * len(own) for _ in range(parts)]
        self.added = [0] * len(own)     # parts 0 .. added - 1 are in the model's gradient
        self.late = [[] for _ in range(parts)]                      # (index, array)

    def array(self, part: int, index: int) -> np.ndarray:
        """The array part `part` adds Parameter `index`'s gradient into. Only that part's
        thread asks, and the arrays it is given are added into the model's by others only
        once it has finished with the Parameter (and asks no more for them)."""
        if self.finished[part][index]:
            late = np.zeros_like(self.own[index].data)
            self.late[part].append((index, late))
            return late
        if part == 0:
            return self.own[index].grad
        held = self.held[part][index]
        if held is None:
            held = self.held[part][index] = np.zeros_like(self.own[index].data)
        return held

    def mark_finished(self, part: int, indices) -> None:
        """Part `part` adds no more into these Parameters' gradients: add in every part's
        array that is now next in part order."""
        with self.lock:
            for index in indices:
                if not self.finished[part][index]:
                    self.finished[part][index] = True
                    self._add_ready(index)

    def _add_ready(self, index: int) -> None:
        finished, parameter = self.finished, self.own[index]
        while self.added[index] < self.parts and finished[self.added[index]][index]:
            part = self.added[index]
            held = self.held[part][index]
            if held is not None:                        # part 0's terms are in already
                parameter.grad += held
                self.held[part][index] = None
            self.added[index] += 1

    def finish(self) -> None:
        """After every part's backward: what no module's return handed in (none, when each
        part's objective backward returned), then the late arrays, in part order."""
        everything = range(len(self.own))
        for part in range(self.parts):
            self.mark_finished(part, everything)
        for late in self.late:
            for index, array in late:
                self.own[index].grad += array
        self.late = [[] for _ in range(self.parts)]


class _PartParameter(Parameter):
    """A twin's Parameter: the model's weight array as its data; as its gradient, the array
    the step's hand-off gives its part."""

    __slots__ = ("twin", "index", "_given")

    def __init__(self, data: np.ndarray, twin: "_Twin", index: int):
        super().__init__(data)
        self.twin, self.index, self._given = twin, index, None

    @property
    def grad(self) -> np.ndarray:
        array = self.twin.current().array(self.twin.number, self.index)
        self._given = weakref.ref(array)        # not a reference that would keep it alive
        return array

    @grad.setter
    def grad(self, value) -> None:
        """`grad += d` puts back the array the getter gave; nothing else may be put there."""
        if self._given is None or value is not self._given():
            raise RuntimeError("a gradient in a BatchSplit part is added into, not replaced")


class _Twin:
    """Part `number`'s copy of the objective: its Parameters are _PartParameters over the
    model's weight arrays, and each module's backward, on returning, tells the step's hand-off
    that the part has finished with the Parameters the module holds all the users of."""

    def __init__(self, objective: Module, own: list, number: int):
        self.number, self.handoff = number, None
        memo = {id(parameter): _PartParameter(parameter.data, self, index)
                for index, parameter in enumerate(own)}
        self.objective = copy.deepcopy(objective, memo)
        self.own = own                          # the model's Parameters, in index order
        self.parameters = [memo[id(parameter)] for parameter in own]
        self.modules = [module for _, module in self.objective.named_modules()]
        for module, indices in _finishing(self.modules):
            module.backward = self._finishes(module.backward, indices)

    def current(self) -> _Handoff:
        if self.handoff is None:
            raise RuntimeError("a BatchSplit part has a gradient only during its backward")
        return self.handoff

    def _finishes(self, backward, indices: tuple):
        def finishing_backward(*args, **kwargs):
            # (dout, cache) are moved on, not held by this frame: a backward lets go of the
            # gradient it was given once it has used it, and holding it here for the length
            # of the call put the benchmarks' small float32 step at 2 threads 1 MiB higher
            args = list(args)
            result = backward(args.pop(0), args.pop()) if len(args) == 2 and not kwargs \
                else backward(*args, **kwargs)
            self.current().mark_finished(self.number, indices)
            return result
        finishing_backward.watches = False          # Module.backward_is_watched
        return finishing_backward


def _settings(modules: list) -> list:
    """[(module, [(name, value)])]: each module and what it holds besides Parameters,
    sub-Modules and its train/eval flag (which the twins follow on every call)."""
    return [(module, [(name, value) for name, value in vars(module).items()
                      if name != "training" and not isinstance(value, (Parameter, Module))])
            for module in modules]


def _same_settings(now: list, then: list) -> bool:
    """Whether two _settings lists hold the same modules and the same objects, by identity."""
    return len(now) == len(then) and all(
        module is earlier and len(held) == len(kept) and all(
            name == old_name and value is old_value
            for (name, value), (old_name, old_value) in zip(held, kept))
        for (module, held), (earlier, kept) in zip(now, then))


def _finishing(modules: list) -> list:
    """[(module, indices)]: for each distinct module, the _PartParameters (by index) all of
    whose owners (the modules holding them as attributes) are the module or below it, so that
    once its backward has returned nothing adds into their gradients any more. A holder
    without a backward of its own (a ModuleList) leaves its Parameters to the module above."""
    distinct = list({id(module): module for module in modules}.values())
    owners: dict[int, set] = {}
    for module in distinct:
        for value in vars(module).values():
            if isinstance(value, _PartParameter):
                owners.setdefault(value.index, set()).add(id(module))
    finishing = []
    for module in distinct:
        if not callable(getattr(module, "backward", None)):
            continue
        below = {id(inner) for _, inner in module.named_modules()}
        indices = tuple(sorted(index for index, holders in owners.items()
                               if holders <= below))
        if indices:
            finishing.append((module, indices))
    return finishing


def _joined(results: list):
    """The parts' backward results put back together along the batch axis: None (ids have no
    gradient), or the arrays concatenated (Seq2Seq's feature inputs' gradient)."""
    return None if results[0] is None else np.concatenate(results, axis=0)

