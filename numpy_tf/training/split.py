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

Each extra part runs a twin of the objective: a copy whose Parameters hold the same weight
arrays (not copies: the twin always reads the weights the model holds, set again at every
call) and gradient arrays of their own, so that no two threads ever add into one array. After
the parts' backwards, the twins' gradients are added into the model's, in part order: the
result does not depend on which thread finished first, and every call gives the same bits.
The price is one more gradient array per Parameter for each extra part while a backward runs:
a twin's gradient array is made (as zeros) when its part's backward first adds into it and let
go once it has been added into the model's. Made during the backward, they coincide with the
end of it, when the caches are all there but the backward's working arrays are few; held from
step to step they would add to the peak at its start (the benchmarks' small float32 step:
45.0 MiB held, 41.x made in each backward).

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
from concurrent.futures import ThreadPoolExecutor, wait
from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module
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
        self._twins: list[Module] = []
        self._built_for: tuple = ()
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"BatchSplit({type(self.objective).__name__}, threads={self.threads})"

    # -- forward -----------------------------------------------------------------------------
    def forward(self, *batch, **kwargs):
        own = self.objective.parameters()
        parts = self._parts(batch, kwargs, own)
        if parts is None:
            return self.objective.forward(*batch, **kwargs)
        runners = [self.objective, *self._twins_for(len(parts), own)]
        try:
            results = self._run([(runner.forward, args, kw)
                                 for runner, (args, kw) in zip(runners, parts)])
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
        cache = SplitCache(tuple(cache for _, cache in results), counts, total, ((), dtype))
        return (np.array(mean, dtype) if isinstance(losses[0], np.ndarray) else
                dtype.type(mean)), cache

    __call__ = forward

    # -- backward ----------------------------------------------------------------------------
    def backward(self, dloss, cache):
        """Each part's backward with dloss n_k / N, the twins' gradients then added into the
        model's in part order. Returns what the objective's backward returns, the parts'
        arrays put back together along the batch axis (None when it returns None)."""
        if not isinstance(cache, SplitCache):
            return self.objective.backward(dloss, cache)
        dtype = cache.output_spec[1]
        validate.gradient("dloss", dloss, (), dtype, "the objective")
        own = self.objective.parameters()
        runners = [self.objective, *self._twins_for(len(cache.caches), own)]
        scale = float(np.asarray(dloss, dtype=dtype))
        results = self._run([(runner.backward,
                              (dtype.type(scale * n / cache.count if cache.count else 0.0),
                               part), {})
                             for runner, part, n in zip(runners, cache.caches, cache.counts)])
        for twin in runners[1:]:
            for parameter, twins in zip(own, twin.parameters()):
                if twins._grad is not None:
                    parameter.grad += twins._grad
                    twins.grad = None           # not held between steps (module text)
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

    def _twins_for(self, parts: int, own: list) -> list[Module]:
        """parts - 1 twins of the objective, reading the weight arrays of `own` (the
        objective's Parameters) as they are now; made again when the objective's Parameters
        are no longer those they were made for."""
        if len(own) != len(self._built_for) or any(
                a is not b for a, b in zip(own, self._built_for)):
            self._twins, self._built_for = [], tuple(own)
        while len(self._twins) < parts - 1:
            self._twins.append(_twin(self.objective, own))
        modules = [module for _, module in self.objective.named_modules()]
        for twin in self._twins[:parts - 1]:
            for parameter, twins in zip(own, twin.parameters()):
                twins.data = parameter.data         # the optimizer may have put in new arrays
            for module, twins in zip(modules, (module for _, module in twin.named_modules())):
                twins.training = module.training    # and the model may have gone to eval()
        return self._twins[:parts - 1]

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


def _twin(objective: Module, own: list) -> Module:
    """A deep copy of `objective` whose Parameters hold `own`'s data arrays themselves and no
    gradient (allocated when a part's backward first adds into it)."""
    memo = {}
    for parameter in own:
        twin = copy.copy(parameter)
        twin.grad = None
        memo[id(parameter)] = twin
    return copy.deepcopy(objective, memo)


def _joined(results: list):
    """The parts' backward results put back together along the batch axis: None (ids have no
    gradient), or the arrays concatenated (Seq2Seq's feature inputs' gradient)."""
    return None if results[0] is None else np.concatenate(results, axis=0)

