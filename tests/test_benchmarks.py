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
