"""The benchmark script runs end to end at the tiny size (a smoke test: nothing here is timed
against a limit; a benchmark is not a test), and its table lands in docs/benchmarks.md."""
import json
from pathlib import Path

import pytest

from benchmarks import run

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def _page(tmp_path, table="old table\n"):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# before\n\n{run.TABLE_START}\n{table}{run.TABLE_END}\n\nafter\n")
    return page


@pytest.mark.torch
def test_benchmark_runs_end_to_end_at_the_tiny_size(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    page = _page(tmp_path)
    monkeypatch.setattr(run, "DOCS", page)
    run.main(["--sizes", "tiny", "--dtypes", "float64", "--threads", "1", "--repeats", "2",
              "--rounds", "1", "--decode-sizes", "", "--no-gradcheck", "--out", str(tmp_path),
              "--docs"])
    results = json.loads((tmp_path / "latest.json").read_text())
    timing = results["timing"][0]["runs"][0]
    assert timing["size"] == "tiny" and timing["dtype"] == "float64"
    assert timing["logits_max_abs_diff"] < 1e-9          # the two models agreed before timing
    assert timing["step"]["ratio"] > 0
    assert abs(timing["loss"] - timing["loss_torch"]) < 1e-10 * abs(timing["loss_torch"])
    memory = results["memory"][0]
    assert memory["numpy_tf_tracemalloc"] > 0
    table = (tmp_path / "latest.md").read_text()
    assert "| 1 | float64 | tiny |" in table
    text = page.read_text()                              # --docs put that table in the page
    assert text == f"# before\n\n{run.TABLE_START}\n{table}{run.TABLE_END}\n\nafter\n"


def test_the_table_goes_between_the_markers_and_nothing_else_changes(tmp_path):
    page = _page(tmp_path)
    run.update_docs("| a | b |\n", page)
    expected = f"# before\n\n{run.TABLE_START}\n| a | b |\n{run.TABLE_END}\n\nafter\n"
    assert page.read_text() == expected
    run.update_docs("| c |\n", page)                      # again: the old table is replaced
    assert "| a | b |" not in page.read_text() and "| c |\n" in page.read_text()


@pytest.mark.parametrize("text", ["no markers\n", f"{run.TABLE_END}\n{run.TABLE_START}\n",
                                  f"{run.TABLE_START}\n{run.TABLE_START}\n{run.TABLE_END}\n"])
def test_a_page_without_one_pair_of_markers_is_refused_and_left_alone(tmp_path, text):
    page = tmp_path / "benchmarks.md"
    page.write_text(text)
    with pytest.raises(ValueError, match="must hold"):
        run.update_docs("| a |\n", page)
    assert page.read_text() == text


def test_docs_benchmarks_holds_the_latest_table():
    """The page `python -m benchmarks --docs` writes holds its markers once each, and between
    them the table of benchmarks/results/latest.md."""
    text, start, end = run.table_span(DOCS)
    latest = (DOCS.parents[1] / "benchmarks" / "results" / "latest.md").read_text()
    assert text[start:end] == "\n" + latest
    assert run.DOCS == DOCS


def test_the_smollm2_benchmarks_numpy_tf_worker_runs(smollm2_gguf_path):
    """One worker process's work, numpy_tf side, at two tokens (the wheel is needed; its HF
    side is what tests/test_smollm2.py compares against)."""
    pytest.importorskip("torch")
    from benchmarks.smollm2 import worker

    result = worker("numpy_tf", 1, tokens=2, repeats=1)
    assert len(result["ids"]) == 5 + 2                 # the 5-token prompt and 2 new tokens
    assert len(result["generation"]) == len(result["step"]) == 1
    assert result["parameter_mb"] > 500 and result["step_tracemalloc_mb"] > 0


def test_the_step_profile_gives_each_layer_family_its_cpu_time():
    from benchmarks import step_profile
    assert step_profile.family_of("/x/numpy_tf/kernels/erf.py") == "GELU"
    assert step_profile.family_of("/x/numpy_tf/layers/multihead.py") == "attention"
    assert step_profile.family_of("~") is None                   # a C function: its caller's
    families, total = step_profile.profile_step("tiny", "float64", 3)
    for name in ("Linear", "attention", "GELU", "LayerNorm", "cross-entropy", "embeddings",
                 "blocks and model (residual sums, the listing)"):
        assert families.get(name, 0) > 0, name
    counted = sum(families.values())
    assert families.get("other", 0) < 0.05 * counted             # every file has its family
    assert counted <= 1.05 * total
    table = step_profile.table(families, total)
    assert table.startswith("| layer family | CPU ms per step | share |")
