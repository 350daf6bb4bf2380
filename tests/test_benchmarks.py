"""The benchmark script runs end to end at the tiny size (a smoke test: nothing here is timed
against a limit; a benchmark is not a test)."""
import json

import pytest

pytest.importorskip("torch")

from benchmarks.run import main  # noqa: E402


@pytest.mark.torch
def test_benchmark_runs_end_to_end_at_the_tiny_size(tmp_path):
    main(["--sizes", "tiny", "--dtypes", "float64", "--threads", "1", "--repeats", "2",
          "--rounds", "1", "--decode-sizes", "", "--no-gradcheck", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "latest.json").read_text())
    run = results["timing"][0]["runs"][0]
    assert run["size"] == "tiny" and run["dtype"] == "float64"
    assert run["logits_max_abs_diff"] < 1e-9          # the two models agreed before timing
    assert run["step"]["ratio"] > 0
    assert abs(run["loss"] - run["loss_torch"]) < 1e-10 * abs(run["loss_torch"])
    memory = results["memory"][0]
    assert memory["numpy_tf_tracemalloc"] > 0
    table = (tmp_path / "latest.md").read_text()
    assert "| 1 | float64 | tiny |" in table


def test_the_smollm2_benchmarks_numpy_tf_worker_runs(smollm2_gguf_path):
    """One worker process's work, numpy_tf side, at two tokens (the wheel is needed; its HF
    side is what tests/test_smollm2.py compares against)."""
    from benchmarks.smollm2 import worker

    result = worker("numpy_tf", 1, tokens=2, repeats=1)
    assert len(result["ids"]) == 5 + 2                 # the 5-token prompt and 2 new tokens
    assert len(result["generation"]) == len(result["step"]) == 1
    assert result["parameter_mb"] > 500 and result["step_tracemalloc_mb"] > 0
