"""Where a training step's CPU time goes, by layer family: `python -m benchmarks.step_profile`.

    python -m benchmarks.step_profile [--size medium] [--dtype float32] [--steps 3] [--threads 1]
                                      [--clock cpu|wall]

Runs numpy_tf's step (zero the gradients, forward, cross-entropy, backward: benchmarks/worker.py
numpy_step) under cProfile with time.process_time as its clock, so the numbers are CPU time
(of every thread of the process: BLAS threads count against the product that started them) and
mean something on a machine busy with other processes, where wall-clock times do not
(`--clock wall` profiles elapsed time instead: what a second thread gains shows there). Each
function's own time goes to the family of the file it is in; the time of NumPy's C functions
(products, ufuncs, reductions) goes to the family of the Python function that called them, in
proportion to what cProfile recorded per caller. Prints a Markdown table, ms per step.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

import numpy as np

# a file of numpy_tf (its path from the package root, without .py) -> its layer family
FAMILIES = {
    "layers/linear": "Linear", "kernels/linear": "Linear",
    "layers/attention": "attention", "layers/multihead": "attention",
    "kernels/attention": "attention", "layers/softmax": "attention",
    "layers/activations": "GELU", "kernels/gelu": "GELU", "kernels/erf": "GELU",
    "core/special": "GELU", "kernels/blocks": "GELU",
    "layers/norm": "LayerNorm", "kernels/norm": "LayerNorm",
    "layers/cross_entropy_loss": "cross-entropy", "models/objectives": "cross-entropy",
    "layers/embedding": "embeddings", "kernels/embedding": "embeddings",
    "layers/positions": "embeddings",
    "models/gpt": "blocks and model (residual sums, the listing)",
}
# --clock: the profiler's clock and what its numbers are called
CLOCKS = {"cpu": (time.process_time, "CPU"), "wall": (time.perf_counter, "wall-clock")}
ORDER = ["Linear", "attention", "GELU", "LayerNorm", "cross-entropy", "embeddings",
         "blocks and model (residual sums, the listing)", "core (Module, checks)",
         "the step (zeroing the gradients)", "other"]


def family_of(filename: str) -> str | None:
    """The family of a profiled function's file; None for C functions (no file)."""
    path = filename.replace("\\", "/")
    if "/numpy_tf/" in path:
        inside = path.rsplit("/numpy_tf/", 1)[1].removesuffix(".py")
        if inside in FAMILIES:
            return FAMILIES[inside]
        return "core (Module, checks)" if inside.startswith("core/") else "other"
    if path.endswith("benchmarks/worker.py"):
        return "the step (zeroing the gradients)"
    if path == "~" or path.startswith("<"):
        return None
    return "numpy (Python side)"


def by_family(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per family: own time of every function, C functions' time split over their
    callers' families."""
    totals: dict[str, float] = defaultdict(float)
    raw = stats.stats                      # func -> (cc, nc, tt, ct, callers)
    for func, (_, _, own, _, callers) in raw.items():
        family = family_of(func[0])
        if family is not None:
            totals[family] += own
            continue
        shares = {caller: values[2] for caller, values in callers.items()}
        whole = sum(shares.values())
        if not whole:
            totals["other"] += own
            continue
        for caller, share in shares.items():
            totals[_caller_family(caller, raw) or "other"] += own * share / whole
    return dict(totals)


def _caller_family(caller, raw, seen=None) -> str | None:
    """A C function called by NumPy's own Python code (np.sum's wrapper) belongs to whoever
    called that code: follow the heaviest caller up to a numpy_tf file."""
    family = family_of(caller[0])
    if family not in (None, "numpy (Python side)"):
        return family
    seen = seen or set()
    if caller in seen or caller not in raw:
        return None
    seen.add(caller)
    callers = raw[caller][4]
    if not callers:
        return None
    heaviest = max(callers, key=lambda c: callers[c][2] + callers[c][3])
    return _caller_family(heaviest, raw, seen)


def profile_step(size: str, dtype: str, steps: int,
                 clock=time.process_time) -> tuple[dict[str, float], float]:
    from benchmarks.models import batch_ids, config_for
    from benchmarks.worker import numpy_step
    from numpy_tf.models.gpt import GPT
    from numpy_tf.models.objectives import NextTokenLoss

    model = GPT(config_for(size), rng=0, dtype=np.dtype(dtype))
    objective, parameters, ids = NextTokenLoss(model), model.parameters(), batch_ids(size)
    numpy_step(objective, ids, parameters)                      # warm: gradients allocated
    profiler = cProfile.Profile(clock)
    start = clock()
    profiler.enable()
    for _ in range(steps):
        numpy_step(objective, ids, parameters)
    profiler.disable()
    total = (clock() - start) / steps
    totals = by_family(pstats.Stats(profiler))
    totals.pop("numpy (Python side)", None)     # its C calls are already in the families
    return {name: seconds / steps for name, seconds in totals.items()}, total


def table(families: dict[str, float], total: float, clock: str = "cpu") -> str:
    counted = sum(families.values())
    lines = [f"| layer family | {CLOCKS[clock][1]} ms per step | share |", "|---|---|---|"]
    for name in ORDER:
        if families.get(name):
            lines.append(f"| {name} | {families[name] * 1e3:.1f} | "
                         f"{100 * families[name] / counted:.0f} % |")
    lines.append(f"| **the step** (profiled; {total * 1e3:.0f} ms with the profiler's own "
                 f"cost) | {counted * 1e3:.1f} | 100 % |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="medium", choices=("tiny", "small", "medium", "large"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", default="1",
                        help="for NumPy's BLAS (numpy_tf's blocks: NUMPY_TF_NUM_THREADS, 1 "
                             "when unset)")
    parser.add_argument("--clock", default="cpu", choices=tuple(CLOCKS),
                        help="cpu (the default: every thread's CPU time) or wall (elapsed "
                             "time, which shows what threads gain; meaningful on an idle "
                             "machine only)")
    args = parser.parse_args(argv)
    from benchmarks.run import thread_counts
    from numpy_tf.core.memory import reuse_freed_memory
    from numpy_tf.core.threads import use_threads

    threads = thread_counts(args.threads)
    if len(threads) != 1:
        parser.exit(2, f"python -m benchmarks.step_profile: --threads takes one count; got "
                       f"{args.threads!r}\n")
    print(f"[{use_threads(threads[0])}; {reuse_freed_memory()}]")
    clock, name = CLOCKS[args.clock]
    families, total = profile_step(args.size, args.dtype, args.steps, clock)
    print(f"{args.size} {args.dtype}, {args.steps} steps, {name} time by layer family:\n")
    print(table(families, total, args.clock))


if __name__ == "__main__":
    main()
