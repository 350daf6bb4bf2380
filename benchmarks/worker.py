"""One benchmark process at one thread count: `python -m benchmarks.worker TASK --threads N ...`
prints one JSON object. The parent (benchmarks/run.py) sets the BLAS and OpenMP thread
variables in this process's environment before NumPy is imported; here torch.set_num_threads
and, when threadpoolctl is installed, threadpool_limits pin the libraries again and record
which BLAS library and kernel NumPy runs.

Tasks:
  timing   with --library numpy_tf or torch: that library's forward and training-step times
           after warm-up (every run's time, the parent takes medians), its GEMM peak and, for
           numpy_tf, KV-cache decoding and the finite-difference gradient checks. One library
           per process: after a product, OpenBLAS keeps its threads spinning for ~0.1 s, and
           in a shared process those threads took a core from torch's next run (torch's step
           measured up to 2x slower when the two alternated in one process at 2 threads).
  memory   the step's peak memory beyond the parameters and their gradient buffers: tracemalloc
           and peak-RSS deltas for numpy_tf, peak-RSS delta for torch (run with glibc's
           MALLOC_MMAP_THRESHOLD_ low, so a freed buffer leaves the resident set at once);
           at N > 1 threads numpy_tf's includes the gradient arrays BatchSplit's extra parts
           add into (each from a module's first add to its return)

At N > 1 threads numpy_tf's step is what `numpy-tf train --threads N` runs: the batch in N parts
on N threads, one BLAS thread each (numpy_tf.training.split.BatchSplit).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc

import numpy as np

from benchmarks.models import (SIZES, batch_ids, check_agreement, config_for, step_flops,
                               torch_mirror)
from numpy_tf.checking.finite_differences import gradcheck_module
from numpy_tf.core.memory import reuse_freed_memory
from numpy_tf.generation.decoding import generate
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.models.objectives import NextTokenLoss
from numpy_tf.training.split import BatchSplit

DTYPES = {"float32": np.float32, "float64": np.float64}
DEFAULT_REPEATS = {"tiny": 100, "small": 8, "medium": 4, "large": 3}   # per process


def pin_threads(threads: int, with_torch: bool = True) -> dict:
    """Set the libraries to `threads` and say what NumPy's BLAS is. torch is imported only
    when this process runs it."""
    info = {"threads": threads, "numpy": np.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "environment": {name: os.environ.get(name) for name in (
                "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMPY_TF_NUM_THREADS")}}
    if with_torch:
        import torch

        torch.set_num_threads(threads)
        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        info["blas"] = "threadpoolctl not installed; threads set by environment variables"
        return info
    threadpool_limits(threads)
    info["blas"] = [{key: pool.get(key) for key in ("internal_api", "version", "architecture",
                                                     "num_threads", "threading_layer",
                                                     "filepath")}
                    for pool in threadpool_info()]
    return info


# -- timing ---------------------------------------------------------------------------------------
def timed(function, repeats: int, warmup: int = 2) -> list[float]:
    """The times of `repeats` calls of function(), after `warmup` untimed ones, with Python's
    cyclic garbage collector paused while timing (as timeit does): a collection would land on
    whichever call happened to cross its threshold."""
    for _ in range(warmup):
        function()
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return times


def gemm_peak(dtype: str, library: str, n: int = 1024, repeats: int = 5) -> float:
    """The best GFLOP/s of an n x n x n matrix product in `library` (NumPy's BLAS for
    numpy_tf)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = np.random.default_rng(1).standard_normal((n, n)).astype(dtype)
    if library == "torch":
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)
    return 2.0 * n ** 3 / min(timed(lambda: a @ b, repeats)) / 1e9


def step_objective(model: GPT, threads: int):
    """What `numpy-tf train --threads N` runs: NextTokenLoss, its batch in N parts on N threads
    when N > 1 (numpy_tf.training.split)."""
    objective = NextTokenLoss(model)
    return BatchSplit(objective, threads) if threads > 1 else objective


def numpy_step(objective, ids: np.ndarray, parameters: list):
    """Zero the gradients (a cached parameter list, as an optimizer holds it), forward,
    cross-entropy, backward."""
    for parameter in parameters:
        parameter.grad.fill(0.0)
    loss, cache = objective.forward(ids)
    objective.backward(1.0, cache)
    return loss


def torch_step(mirror, ids, parameters: list, set_to_none: bool = True):
    """The same in torch: gradients set to None (torch's default, the cheaper) or zeroed."""
    import torch.nn.functional as F

    for parameter in parameters:
        if set_to_none:
            parameter.grad = None
        elif parameter.grad is not None:
            parameter.grad.zero_()
    logits = mirror(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           ids[:, 1:].reshape(-1))
    loss.backward()
    return loss


def time_size(size: str, dtype: str, repeats: int, library: str, threads: int = 1) -> dict:
    """Forward and step times of one library; the loss of the step, which the parent compares
    across the two processes; the torch process also checks that the two models' logits
    agree (a numpy_tf forward, before any timing)."""
    model = GPT(config_for(size), rng=0, dtype=DTYPES[dtype])
    ids = batch_ids(size)
    result = {"size": size, "dtype": dtype, "repeats": repeats, "flops": step_flops(size)}
    if library == "numpy_tf":
        objective, parameters = step_objective(model, threads), model.parameters()
        result["step_runs"] = repr(objective)
        result["loss"] = float(numpy_step(objective, ids, parameters))
        forward = lambda: model.forward(ids)                            # noqa: E731
        step = lambda: numpy_step(objective, ids, parameters)           # noqa: E731
    else:
        import torch

        mirror, ids_t = torch_mirror(model), torch.from_numpy(ids)
        result["logits_max_abs_diff"] = check_agreement(model, mirror, ids)
        parameters = list(mirror.parameters())
        result["loss"] = torch_step(mirror, ids_t, parameters).item()
        forward = lambda: mirror(ids_t)                                 # noqa: E731
        step = lambda: torch_step(mirror, ids_t, parameters)            # noqa: E731
    for name, function in (("forward", forward), ("step", step)):
        gc.collect()
        result[name] = timed(function, repeats)
    return result


def time_decoding(size: str, dtype: str, length: int = 256, batch: int = 1) -> dict:
    """Greedy decoding from a one-token prompt to `length` positions: with the KV cache (one
    position per step) and recomputing the whole prefix every step; tokens per second each."""
    model = GPT(config_for(size, max_context=length), rng=0, dtype=DTYPES[dtype])
    prompt = batch_ids(size)[:batch, :1]
    new_tokens = length - 1
    result = {"size": size, "dtype": dtype, "length": length, "batch": batch}
    outputs = {}
    for name, use_cache in (("cache", True), ("recompute", False)):
        start = time.perf_counter()
        outputs[name] = generate(model, prompt, new_tokens, temperature=0.0,
                                 use_cache=use_cache)
        seconds = time.perf_counter() - start
        result[name] = {"seconds": seconds, "tokens_per_s": batch * new_tokens / seconds}
    result["same_tokens"] = bool(np.array_equal(outputs["cache"], outputs["recompute"]))
    result["speedup"] = result["cache"]["tokens_per_s"] / result["recompute"]["tokens_per_s"]
    return result


def time_gradcheck(fast_repeats: int = 20) -> dict:
    """The full (every parameter) and fast (random directions) finite-difference checks of the
    7,232-parameter Pre-LN GPT, GPTConfig.tiny(), on the tiny batch, float64."""
    model = GPT(GPTConfig.tiny(), rng=0)
    objective = NextTokenLoss(model)
    ids = batch_ids("tiny")
    start = time.perf_counter()
    full = gradcheck_module(objective, ids, fast=False)
    full_seconds = time.perf_counter() - start
    fast_times = []
    for seed in range(fast_repeats):
        start = time.perf_counter()
        fast = gradcheck_module(objective, ids, fast=True, seed=seed)
        fast_times.append(time.perf_counter() - start)
        assert fast.passed, str(fast)
    return {"parameters": model.num_parameters(), "ids_shape": list(ids.shape),
            "full_seconds": full_seconds, "full_passed": full.passed,
            "full_max_norm_rel_error": full.max_norm_rel_error,
            "fast_seconds": statistics.median(fast_times), "fast_directions": 3}


# -- memory ---------------------------------------------------------------------------------------
def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rss_peak_of(function) -> int:
    """Peak resident bytes during function() above the resident bytes before it (the peak
    counter VmHWM is reset through /proc/self/clear_refs)."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status("VmRSS")
    function()
    return _status("VmHWM") - before


def memory_size(size: str, dtype: str, threads: int = 1) -> dict:
    import torch

    model = GPT(config_for(size), rng=0, dtype=DTYPES[dtype])
    objective = step_objective(model, threads)
    mirror = torch_mirror(model)
    ids = batch_ids(size)
    ids_t = torch.from_numpy(ids)
    ours, theirs = model.parameters(), list(mirror.parameters())
    numpy_step(objective, ids, ours)                            # warm: BLAS buffers
    torch_step(mirror, ids_t, theirs, set_to_none=False)        # warm, and .grad allocated
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    numpy_step(objective, ids, ours)
    traced = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return {"size": size, "dtype": dtype,
            "parameter_bytes": sum(p.data.nbytes for p in model.parameters()),
            "numpy_tf_tracemalloc": traced,
            "numpy_tf_rss": _rss_peak_of(lambda: numpy_step(objective, ids, ours)),
            "torch_rss": _rss_peak_of(lambda: torch_step(mirror, ids_t, theirs,
                                                         set_to_none=False))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("task", choices=("timing", "memory"))
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--library", choices=("numpy_tf", "torch"), default="numpy_tf",
                        help="the library a timing process runs")
    parser.add_argument("--sizes", default="tiny,small,medium,large")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--decode-sizes", default="")
    parser.add_argument("--gradcheck", action="store_true")
    args = parser.parse_args(argv)
    sizes, dtypes = args.sizes.split(","), args.dtypes.split(",")
    for size in sizes:
        if size not in SIZES:
            parser.error(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    with_torch = args.task == "memory" or args.library == "torch"
    result = {"task": args.task, "library": args.library,
              "environment": pin_threads(args.threads, with_torch), "runs": []}
    if args.task == "timing" and args.library == "numpy_tf":
        # what numpy-tf train and generate do (numpy_tf.core.memory); not in the memory task,
        # whose allocator settings make the resident set follow what is live
        result["environment"]["allocator"] = reuse_freed_memory()
    if args.task == "memory":
        result["runs"] = [memory_size(size, dtype, args.threads) for size in sizes
                          for dtype in dtypes]
    else:
        result["gemm_peak"] = {dtype: gemm_peak(dtype, args.library) for dtype in dtypes}
        for size in sizes:
            for dtype in dtypes:
                repeats = args.repeats or DEFAULT_REPEATS[size]
                result["runs"].append(time_size(size, dtype, repeats, args.library,
                                                args.threads))
                print(f"  {args.library}, {args.threads} thread(s): {size} {dtype} done",
                      file=sys.stderr)
        if args.library == "numpy_tf":
            result["decoding"] = [time_decoding(size, dtype) for size in
                                  filter(None, args.decode_sizes.split(",")) for dtype in dtypes]
            if args.gradcheck:
                result["gradcheck"] = time_gradcheck()
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
