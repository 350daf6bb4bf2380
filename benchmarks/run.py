"""numpy_tf against torch CPU eager: `python -m benchmarks` (see docs/benchmarks.md).

For each thread count, worker processes (benchmarks/worker.py) time one library and one size
each, with the thread variables set in their environment before NumPy loads, alternating
numpy_tf, torch, numpy_tf, torch, ... size by size for --rounds rounds, so that load from other
processes falls on both; the medians pool every round's runs. One library per process because the two disturb each other in
a shared one (OpenBLAS's threads keep spinning after a product). A last process measures memory
(with glibc returning freed buffers to the OS at once, so that the resident set follows what is
live). The results go to benchmarks/results/latest.json and latest.md, and, with --docs, into
docs/benchmarks.md between the benchmark markers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
TABLE_START, TABLE_END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
LOSS_RTOL = {"float64": 1e-10, "float32": 1e-5}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def run_worker(task: str, threads: int, options: list[str], extra_env: dict | None = None) -> dict:
    environment = dict(os.environ)
    environment.update({name: str(threads) for name in THREAD_VARIABLES})
    environment.update(extra_env or {})
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    if task == "memory":
        environment["MALLOC_MMAP_THRESHOLD_"] = "65536"
        environment["MALLOC_TRIM_THRESHOLD_"] = "0"
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", task, "--threads", str(threads), *options],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(completed.stdout)


def timing_rounds(threads: int, rounds: int, sizes: list[str], options: list[str],
                  extra: list[str], extra_env: dict | None = None) -> dict:
    """Time numpy_tf and torch in alternating processes and pool their runs: the "timing"
    record of one thread count (medians, minima, ratios; both GEMM peaks; decoding and the
    gradient checks from the first numpy_tf process). A round runs, size by size, a numpy_tf
    process and then a torch process timing that size, so that the two libraries' runs of a
    size are at most a minute or so apart: this machine's speed was seen to drift by up to 2x
    within an hour, and a round of whole processes (every size, ~3 minutes each) let a slow
    spell fall on one library's every size."""
    date, load = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), load_average()
    pooled: dict[str, list[dict]] = {"numpy_tf": [], "torch": []}
    for index in range(rounds):
        for size in sizes:
            for library in pooled:
                more = extra if (library == "numpy_tf" and index == 0 and size == sizes[0]) \
                    else []
                pooled[library].append(run_worker(
                    "timing", threads, ["--sizes", size, *options, "--library", library, *more],
                    extra_env))
    first, theirs = pooled["numpy_tf"][0], pooled["torch"][0]
    timing = {"environment": dict(first["environment"], torch=theirs["environment"]["torch"],
                                  torch_threads=theirs["environment"]["torch_threads"]),
              "rounds": rounds, "date": date, "load_before": load, "load_after": load_average(),
              "gemm_peak": {dtype: {"numpy": max(w["gemm_peak"][dtype] for w in
                                                 pooled["numpy_tf"]),
                                    "torch": max(w["gemm_peak"][dtype] for w in
                                                 pooled["torch"])}
                            for dtype in first["gemm_peak"]},
              "runs": []}
    for key in ("decoding", "gradcheck"):
        if key in first:
            timing[key] = first[key]
    def runs_of(library: str, size: str, dtype: str) -> list[dict]:
        return [run for worker in pooled[library] for run in worker["runs"]
                if run["size"] == size and run["dtype"] == dtype]

    cells = list(dict.fromkeys((run["size"], run["dtype"]) for worker in pooled["numpy_tf"]
                               for run in worker["runs"]))
    for size, dtype in cells:
        ours, other = runs_of("numpy_tf", size, dtype), runs_of("torch", size, dtype)
        run = ours[0]
        loss, loss_torch = run["loss"], other[0]["loss"]
        if abs(loss - loss_torch) > LOSS_RTOL[run["dtype"]] * abs(loss_torch):
            raise AssertionError(f"{run['size']} {run['dtype']}: losses differ: numpy_tf "
                                 f"{loss}, torch {loss_torch}")
        record = {"size": run["size"], "dtype": run["dtype"], "flops": run["flops"],
                  "repeats": sum(r["repeats"] for r in ours), "loss": loss,
                  "loss_torch": loss_torch,
                  "logits_max_abs_diff": max(r["logits_max_abs_diff"] for r in other)}
        for name in ("forward", "step"):
            a = [t for r in ours for t in r[name]]
            b = [t for r in other for t in r[name]]
            record[name] = {"numpy_tf": statistics.median(a), "torch": statistics.median(b),
                            "numpy_tf_min": min(a), "torch_min": min(b)}
            record[name]["ratio"] = record[name]["numpy_tf"] / record[name]["torch"]
            record[name]["ratio_of_minima"] = min(a) / min(b)
        timing["runs"].append(record)
    return timing


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:,.0f}"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.3g}"


def markdown(results: dict) -> str:
    """The tables of one run."""
    loads = "; ".join(f"{t['environment']['threads']} thread(s) {t.get('date', '?')}, load "
                      f"average before / after {t.get('load_before')} / {t.get('load_after')}"
                      for t in results["timing"])
    lines = [f"Run on {results['machine']}: {loads}. numpy {results['numpy']}, "
             f"torch {results['torch']}; NumPy's BLAS: {results['blas']}; "
             f"OPENBLAS_CORETYPE={results['openblas_coretype']}, "
             f"OPENBLAS_L2_SIZE={results['openblas_l2_size']}" +
             "".join(f"; timed with {name}={value}" for name, value in
                     results.get("extra_environment", {}).items()) + ".", ""]
    rounds = results["timing"][0].get("rounds", 1)
    lines += [f"Times are medians (ms) of {rounds} alternating rounds, each, size by size, a "
              "numpy_tf process and then a torch process timing its own runs after warm-up "
              "(one library per "
              "process: OpenBLAS's threads keep spinning for ~0.1 s after a product and took a "
              "core from torch when the two alternated in one process); ratio = numpy_tf / torch (below 1: numpy_tf is faster); the ratio of "
              "the fastest runs is shown too, as a check against load from other processes "
              "(it moves less when the machine is busy). The step is "
              "forward, cross-entropy and backward, no optimizer; at N > 1 threads "
              "numpy_tf's step is what `numpy-tf train --threads N` runs, the batch in N parts "
              "on N threads, one BLAS thread each (numpy_tf.training.split.BatchSplit), and its "
              "memory includes the gradient arrays the extra parts add into, each from a "
              "module's first add to its return. GFLOP/s counts the matmul "
              "FLOPs of the step; % is of the machine's GEMM peak (the faster of NumPy's and "
              "torch's 1024^3 product at that dtype and thread count). Memory is the step's "
              "peak beyond the parameters and their gradient buffers, MiB (2^20 bytes): "
              "numpy_tf by tracemalloc (and by peak-RSS delta), torch by peak-RSS delta.", ""]
    header = ("| threads | dtype | size | forward ms numpy_tf / torch | ratio | step ms "
              "numpy_tf / torch | **step ratio** | step ratio of minima | step GFLOP/s "
              "numpy_tf / torch (% of peak) | step memory MiB numpy_tf (RSS) / torch RSS |")
    lines += [header, "|---" * 10 + "|"]
    memory = {(m["threads"], m["size"], m["dtype"]): m for m in results["memory"]}
    for timing in results["timing"]:
        threads = timing["environment"]["threads"]
        for run in timing["runs"]:
            peak = max(timing["gemm_peak"][run["dtype"]].values())
            flops = run["flops"]["step"]
            ours = flops / run["step"]["numpy_tf"] / 1e9
            theirs = flops / run["step"]["torch"] / 1e9
            m = memory.get((threads, run["size"], run["dtype"]))
            mem = "-" if m is None else (f"{_mb(m['numpy_tf_tracemalloc'])} "
                                         f"({_mb(m['numpy_tf_rss'])}) / {_mb(m['torch_rss'])}")
            lines.append(
                f"| {threads} | {run['dtype']} | {run['size']} | "
                f"{_ms(run['forward']['numpy_tf'])} / {_ms(run['forward']['torch'])} | "
                f"{run['forward']['ratio']:.2f} | {_ms(run['step']['numpy_tf'])} / "
                f"{_ms(run['step']['torch'])} | **{run['step']['ratio']:.2f}** | "
                f"{run['step'].get('ratio_of_minima', float('nan')):.2f} | "
                f"{ours:.3g} / {theirs:.3g} ({100 * ours / peak:.0f}% / "
                f"{100 * theirs / peak:.0f}%) | {mem} |")
    peaks = [f"{t['environment']['threads']} thread(s) {dtype}: NumPy "
             f"{p['numpy']:.0f}, torch {p['torch']:.0f}"
             for t in results["timing"] for dtype, p in t["gemm_peak"].items()]
    lines += ["", "GEMM peak GFLOP/s: " + "; ".join(peaks) + "."]
    decoding = [(t["environment"]["threads"], d) for t in results["timing"]
                for d in t.get("decoding", [])]
    if decoding:
        lines += ["", "Decoding (greedy, one-token prompt to T = 256, batch 1, numpy_tf):", "",
                  "| threads | size | dtype | KV cache tokens/s | recompute tokens/s | speed-up "
                  "| same tokens |", "|---|---|---|---|---|---|---|"]
        for threads, d in decoding:
            lines.append(f"| {threads} | {d['size']} | {d['dtype']} | "
                         f"{d['cache']['tokens_per_s']:.0f} | "
                         f"{d['recompute']['tokens_per_s']:.1f} | {d['speedup']:.1f}x | "
                         f"{d['same_tokens']} |")
    checks = [t["gradcheck"] for t in results["timing"] if "gradcheck" in t]
    for g in checks:
        lines += ["", f"Finite-difference gradient check of the {g['parameters']:,}-parameter "
                      f"Pre-LN GPT, GPTConfig.tiny() (ids {tuple(g['ids_shape'])}, float64): full "
                      f"{g['full_seconds']:.2f} s (passed: {g['full_passed']}, norm-relative "
                      f"error {g['full_max_norm_rel_error']:.1e}); fast mode "
                      f"({g['fast_directions']} directions) {g['fast_seconds'] * 1e3:.1f} ms."]
    return "\n".join(lines) + "\n"


def table_span(path: Path) -> tuple[str, int, int]:
    """The text of `path` and where its table lies: after the start marker, up to the end one."""
    text = path.read_text()
    if text.count(TABLE_START) != 1 or text.count(TABLE_END) != 1 \
            or text.index(TABLE_START) > text.index(TABLE_END):
        raise ValueError(f"{path} must hold {TABLE_START} and then {TABLE_END}, once each")
    return text, text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)


def update_docs(table: str, path: Path | None = None) -> None:
    """Put `table` between the benchmark markers of `path` (default docs/benchmarks.md), keeping
    everything outside them."""
    path = path or DOCS
    text, start, end = table_span(path)
    path.write_text(text[:start] + "\n" + table + text[end:])


def thread_counts(text: str) -> list[int]:
    """--threads 1,2: positive integers; anything else is a usage error, one line on stderr and
    exit status 2."""
    counts = [t.strip() for t in text.split(",")]
    if not all(t.isdigit() and int(t) > 0 for t in counts):
        print(f"python -m benchmarks: --threads must be positive integers separated by commas "
              f"(1,2); got {text!r}", file=sys.stderr)
        raise SystemExit(2)
    return [int(t) for t in counts]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--sizes", default="tiny,small,medium,large")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--threads", default="1,2", metavar="N[,N...]",
                        help="the thread counts to time, each for NumPy's BLAS and torch alike "
                             "(default 1,2); numpy_tf's own elementwise blocks run on "
                             "NUMPY_TF_NUM_THREADS, 1 when unset, at every count")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per measurement and process (default: by size)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternations numpy_tf, torch (each a process; default 2)")
    parser.add_argument("--decode-sizes", default="small,medium",
                        help="sizes whose KV-cache decoding is timed ('' for none)")
    parser.add_argument("--no-gradcheck", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for both libraries' timing processes "
                             "(repeatable; recorded with the results), e.g. an allocator "
                             "setting such as MALLOC_TRIM_THRESHOLD_=1000000000")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--docs", "--readme", dest="docs", action="store_true",
                        help="put the table into docs/benchmarks.md (--readme: the old name)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other thread counts' results of the previous latest.json "
                             "(rerun one thread count when the machine was busy)")
    args = parser.parse_args(argv)
    if args.docs:
        table_span(DOCS)                # a page without its markers fails now, not after the run
    threads = thread_counts(args.threads)
    extra_env = {}
    for setting in args.env:
        name, equals, value = setting.partition("=")
        if not equals or not name:
            parser.error(f"--env takes NAME=VALUE; got {setting!r}")
        extra_env[name] = value
    sizes = [size for size in args.sizes.split(",") if size]
    options = ["--dtypes", args.dtypes]
    if args.repeats:
        options += ["--repeats", str(args.repeats)]
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "load_before": load_average(), "timing": [], "memory": [],
        "extra_environment": extra_env}
    for index, count in enumerate(threads):
        last = index == len(threads) - 1
        extra = ["--decode-sizes", args.decode_sizes if last else ""]
        if last and not args.no_gradcheck:
            extra.append("--gradcheck")
        print(f"timing at {count} thread(s) ...", file=sys.stderr)
        results["timing"].append(timing_rounds(count, args.rounds, sizes, options, extra,
                                               extra_env))
        if not args.no_memory:
            memory = run_worker("memory", count, ["--sizes", args.sizes, *options])
            results["memory"] += [dict(run, threads=count) for run in memory["runs"]]
    results["load_after"] = load_average()
    previous = args.out / "latest.json"
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        results["timing"] = sorted(
            [t for t in old["timing"] if t["environment"]["threads"] not in threads]
            + results["timing"], key=lambda t: t["environment"]["threads"])
        results["memory"] = sorted(
            [m for m in old["memory"] if m["threads"] not in threads] + results["memory"],
            key=lambda m: m["threads"])
    environment = results["timing"][0]["environment"]
    blas = environment["blas"]
    results.update(
        machine=f"{environment['machine']}, {environment['cpu_count']} cores, Python "
                f"{environment['python']}",
        numpy=environment["numpy"], torch=environment["torch"],
        blas=blas if isinstance(blas, str) else ", ".join(
            f"{pool['internal_api']} {pool['version']} ({pool['architecture']} kernel, "
            f"{pool['threading_layer']} threads)" if pool.get("architecture") else
            f"{pool['internal_api']} ({Path(pool['filepath']).name})" for pool in blas),
        openblas_coretype=environment["environment"]["OPENBLAS_CORETYPE"],
        openblas_l2_size=environment["environment"]["OPENBLAS_L2_SIZE"])
    table = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "latest.md").write_text(table)
    if args.docs:
        update_docs(table)
    print(table)
