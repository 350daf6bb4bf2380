"""The study path: every notebook in docs/notebooks runs from the first cell to the last in a
Jupyter kernel and shows its pictures, so none goes stale.

The notebooks are kept as percent-format scripts (`# %%` starts a code cell, `# %% [markdown]`
a text cell whose lines start with "# "; `# %matplotlib inline` is the one magic). They are
turned into notebooks here with nbformat and executed with nbclient, with the repository's
numpy_tf first on the kernel's path and a fresh folder as its working directory."""
import os
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("[0-9][0-9]_*.py"))
CELL = re.compile(r"^# %%(?: \[(markdown)\])?[^\n]*$", re.MULTILINE)
MAGIC = re.compile(r"^# (%\w)", re.MULTILINE)           # a commented magic: "# %matplotlib"
NEEDS_SMOLLM2 = {"08_pretrained_smollm2.py"}


def notebook_cells(text: str) -> list[tuple[str, str]]:
    """[(kind, source)] of a percent-format script, kind "code" or "markdown"."""
    marks = list(CELL.finditer(text))
    cells = []
    for mark, following in zip(marks, marks[1:] + [None]):
        body = text[mark.end():following.start() if following else len(text)].strip("\n")
        if mark.group(1) == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                             for line in body.splitlines())
            cells.append(("markdown", body))
        else:
            cells.append(("code", MAGIC.sub(r"\1", body)))
    return cells


def test_the_cells_are_read_as_written():
    text = ("# %% [markdown]\n# # Title\n#\n# Some *words*.\n\n# %%\n# %matplotlib inline\n"
            "import numpy as np\n# a comment stays\n\n# %%\nx = 1\n")
    assert notebook_cells(text) == [("markdown", "# Title\n\nSome *words*."),
                                    ("code", "%matplotlib inline\nimport numpy as np\n"
                                             "# a comment stays"),
                                    ("code", "x = 1")]


def test_the_study_path_is_complete():
    assert [path.name for path in NOTEBOOKS] == [
        "01_tokens_and_embeddings.py", "02_positions.py", "03_attention_and_masks.py",
        "04_the_block_and_its_norms.py", "05_backward_and_gradcheck.py", "06_training.py",
        "07_generation_with_a_kv_cache.py", "08_pretrained_smollm2.py"]
    for path in NOTEBOOKS:
        cells = notebook_cells(path.read_text())
        assert cells[0][0] == "markdown" and cells[0][1].startswith("# "), path.name
        assert "%matplotlib inline" in cells[1][1], path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_and_shows_its_pictures(path, tmp_path, monkeypatch, request):
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need nbformat "
                                   "(pip install 'numpy-tf[test]')")
    nbclient = pytest.importorskip("nbclient", reason="the notebooks need nbclient")
    pytest.importorskip("ipykernel", reason="the notebooks need ipykernel")
    pytest.importorskip("matplotlib", reason="the notebooks draw with matplotlib")
    if path.name in NEEDS_SMOLLM2:
        request.getfixturevalue("smollm2_gguf_path")     # skips, with the reason, when absent
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(source) if kind == "markdown" else
                      nbformat.v4.new_code_cell(source)
                      for kind, source in notebook_cells(path.read_text())]
    notebook.cells.append(nbformat.v4.new_code_cell("import numpy_tf; print(numpy_tf.__file__)"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    for threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        # the notebooks' arrays are small: one BLAS thread is the fastest, and a kernel that
        # spins threads on cores the test run already uses can be ten times slower
        monkeypatch.setenv(threads, "1")
    started = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - started
    imported = notebook.cells.pop().outputs[0]["text"].strip()
    assert imported == str(ROOT / "numpy_tf" / "__init__.py")          # this checkout's
    pictures = sum("image/png" in output.get("data", {}) for cell in notebook.cells
                   if cell.cell_type == "code" for output in cell.outputs)
    assert pictures >= 1, f"{path.name} shows no picture"
    print(f"{path.name}: {seconds:.1f} s, {pictures} pictures")
