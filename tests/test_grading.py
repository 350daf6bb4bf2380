"""numpy-tf assignment and numpy-tf grade: the skeleton fails, the skeleton with numpy_tf's own
backward passes, and every way a submission can break is reported per function."""
import ast
import csv
import inspect
import io
import json
import sys

import numpy as np
import pytest

import numpy_tf.layers.norm
from numpy_tf.cli.commands import main
from numpy_tf.teaching.assignment import assignment
from numpy_tf.teaching.grading import grade
from numpy_tf.teaching.layer_table import LAYERS, grading_cases


def solved(skeleton: str) -> str:
    """The skeleton with every backward stub replaced by numpy_tf's own backward."""
    lines = skeleton.splitlines()
    stubs = [node for node in ast.parse(skeleton).body if isinstance(node, ast.FunctionDef)
             and node.name.endswith("_backward")
             and "NotImplementedError" in ast.get_source_segment(skeleton, node)]
    for node in sorted(stubs, key=lambda node: -node.lineno):
        source = inspect.getsource(LAYERS[node.name[:-len("_backward")]].backward)
        lines[node.lineno - 1:node.end_lineno] = source.splitlines()
    return "\n".join(lines) + "\n"


def write(tmp_path, text: str, name: str = "submission.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_skeleton_fails_and_the_solved_skeleton_passes_for_every_layer(tmp_path):
    skeleton = assignment(list(LAYERS), "homework.py")
    assert skeleton.count("raise NotImplementedError") == len(LAYERS)
    homework = write(tmp_path, skeleton, "homework.py")
    report = grade(homework)
    # only the functions the student has to write earn points: the forwards handed out
    # complete are graded only when asked for
    assert [f.function for f in report.functions] == [f"{name}_backward" for name in LAYERS]
    assert all(not f.passed and f.points == 0 and "NotImplementedError" in f.first_failure
               for f in report.functions)
    assert report.points == 0
    forwards = [f for f in grade(homework, forwards=True).functions
                if f.function.endswith("_forward")]
    assert len(forwards) == len(LAYERS)
    assert all(f.passed for f in forwards)            # the forwards are numpy_tf's own
    report = grade(write(tmp_path, solved(skeleton), "solved.py"))
    assert report.passed, str(report)
    total = report.to_dict()
    assert total["points"] == total["possible"] == 10 * len(LAYERS)
    # every case in float64 and in float32
    assert [len(f.cases) for f in report.functions] == \
        [2 * len(grading_cases(spec)) for spec in LAYERS.values()]


def test_the_skeleton_reads_as_homework():
    skeleton = assignment(["layernorm", "swiglu"], "hw.py")
    assert "numpy-tf grade hw.py" in skeleton
    tree = ast.parse(skeleton)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert {"LayerNormCache", "SwiGLUCache"} <= classes
    assert {"layernorm_forward", "swiglu_forward", "_leading_axes"} <= set(functions)
    stub = ast.get_docstring(functions["layernorm_backward"])
    assert "inv_std = (var + eps)^(-1/2)" in stub and "Return (dx, dweight, dbias)" in stub
    assert "closed form" not in stub and "x_hat_j mean(g * x_hat)" not in stub  # no derivation
    assert "from numpy_tf.layers.mlp import GateCache, swiglu_gate_backward" in skeleton
    assert "from numpy_tf.layers.linear import LinearCache, linear_backward, linear_forward" in skeleton
    with pytest.raises(ValueError, match="unknown layer 'conv'"):
        assignment(["conv"])


def test_the_skeleton_gives_the_check_a_backward_opens_with_and_the_caches_as_they_are(tmp_path):
    from numpy_tf.layers.embedding import EmbeddingCache
    skeleton = assignment(["embedding", "softcap", "sinusoidal_positions"], "hw.py")
    tree = ast.parse(skeleton)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    # embedding_backward opens with numpy_tf's check: given, then the exercise
    check, stop = functions["embedding_backward"].body[1:]
    assert ast.unparse(check) == "validate.backward_inputs(dout, cache, EmbeddingCache)"
    assert isinstance(stop, ast.Raise)
    assert "from numpy_tf.core import validate" in skeleton
    check, stop = functions["softcap_backward"].body[1:]
    assert ast.unparse(check) == "validate.backward_inputs(dout, cache, SoftCapCache)"
    assert isinstance(stop, ast.Raise)
    # sinusoidal_positions_backward opens otherwise (its cache may be None): nothing but the
    # exercise
    assert [type(node) for node in functions["sinusoidal_positions_backward"].body[1:]] == \
        [ast.Raise]
    fields = [node.target.id for node in classes["EmbeddingCache"].body
              if isinstance(node, ast.AnnAssign)]
    assert fields == list(EmbeddingCache._fields)
    # a student's backward that keeps the check is the student's own, not numpy_tf's
    path = write(tmp_path, skeleton.replace(
        'raise NotImplementedError("embedding_backward: derive it, then write it")',
        "ids, vocab, padding_idx, dim, dtype = cache\n"
        "    dweight = np.zeros((vocab, dim), dtype=dtype)\n"
        "    np.add.at(dweight, ids.reshape(-1), dout.reshape(-1, dim))\n"
        "    if padding_idx is not None:\n"
        "        dweight[padding_idx] = 0.0\n"
        "    return dweight"))
    embedding = grade(path).functions[0]
    assert embedding.function == "embedding_backward"
    assert embedding.passed and embedding.flag is None, embedding.verdict()


def test_a_correct_derivation_of_another_shape_passes(tmp_path):
    """The step-by-step LayerNorm backward (through dvar and dmean) is not numpy_tf's closed
    form, and is right: it passes, rows of near-zero variance included."""
    path = write(tmp_path, '''
import numpy as np

def layernorm_backward(dout, cache):
    x_hat, inv_std, weight, has_bias = cache
    C = x_hat.shape[-1]
    g = dout * weight if weight is not None else dout
    centered = x_hat / inv_std
    dvar = np.sum(g * centered, axis=-1, keepdims=True) * -0.5 * inv_std ** 3
    dmean = -np.sum(g * inv_std, axis=-1, keepdims=True)
    dx = g * inv_std + dvar * 2.0 * centered / C + dmean / C
    lead = tuple(range(dout.ndim - 1))
    return (dx, np.sum(dout * x_hat, axis=lead) if weight is not None else None,
            dout.sum(axis=lead) if has_bias else None)
''')
    report = grade(path)
    assert [f.function for f in report.functions] == ["layernorm_backward"]
    assert report.passed, str(report)
    assert all(case.fd_norm_rel_error < 1e-6 for case in report.functions[0].cases
               if case.fd_norm_rel_error is not None)


def test_each_way_of_breaking_is_reported_per_function(tmp_path):
    path = write(tmp_path, '''
import numpy as np
print("debugging output the grader must swallow")

def linear_backward(dout, cache):                   # forgets to sum the bias over rows
    x, weight, has_bias = cache
    dx = dout @ weight
    dweight = dout.reshape(-1, dout.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    return dx, dweight, dout if has_bias else None

def relu_backward(dout, cache):                     # float64 whatever came in
    return (dout * cache.positive).astype(np.float64)

def gelu_backward(dout, cache):
    return dout * np.nan

def silu_backward(dout, cache):
    raise ZeroDivisionError("oops")

def softmax_backward(dout, cache):                  # a tuple where numpy_tf returns one array
    return (dout,)

def log_softmax_backward(dout, cache):              # changes its input
    dout -= cache.probs * dout.sum(axis=cache.axis, keepdims=True)
    return dout.copy()

def embedding_backward(dout, cache):                # right, then clears the ids it was given
    ids, vocab, padding_idx, dim, dtype = cache
    dweight = np.zeros((vocab, dim), dtype=dtype)
    np.add.at(dweight, ids.reshape(-1), dout.reshape(-1, dout.shape[-1]))
    if padding_idx is not None:
        dweight[padding_idx] = 0.0
    ids[...] = 0
    return dweight

def rmsnorm_backward(dout, cache):                  # misses the weight's factor in dx
    x_hat, inv_rms, weight = cache
    dx = dout - x_hat * np.mean(dout * x_hat, axis=-1, keepdims=True)
    dweight = np.sum(dout * x_hat, axis=tuple(range(dout.ndim - 1))) if weight is not None else None
    return dx * inv_rms, dweight
''')
    report = grade(path)
    results = {f.function: f for f in report.functions}
    assert not report.passed and not any(f.passed for f in results.values())
    assert "dbias has shape (2, 3, 5); expected (5,)" in results["linear_backward"].first_failure
    assert "dx has dtype float64; expected float32" in results["relu_backward"].first_failure
    relu = results["relu_backward"]                             # the float64 cases pass
    assert [case.passed for case in relu.cases] == [case.dtype == "float64" for case in relu.cases]
    assert relu.points == relu.possible / 2
    assert "dx is nan at (0, 0, 0)" in results["gelu_backward"].first_failure
    assert "ZeroDivisionError: oops (line 18)" in results["silu_backward"].first_failure
    assert "must return 1 values; got" not in results["softmax_backward"].first_failure
    assert "must be a numpy array; got tuple" in results["softmax_backward"].first_failure
    assert "changed dout in place" in results["log_softmax_backward"].first_failure
    assert "changed its cache in place" in results["embedding_backward"].first_failure
    rms = results["rmsnorm_backward"]
    assert "no weight" in [c.case for c in rms.cases if c.passed][0]   # right without weight
    assert "dx differs from numpy_tf's" in rms.first_failure


def test_a_gradient_off_by_a_tenth_of_a_percent_fails(tmp_path):
    path = write(tmp_path, '''
from numpy_tf.layers.activations import gelu_backward as reference

def gelu_backward(dout, cache):
    return reference(dout, cache) * 1.001
''')
    failure = grade(path).functions[0].cases[0]
    assert not failure.passed and "dx differs from numpy_tf's by" in failure.message


def test_finite_differences_catch_what_the_reference_would_miss(tmp_path, monkeypatch):
    """Were numpy_tf's own backward wrong (the exact-GELU derivative applied to the tanh
    variant, numpy-ml's mistake), a submission copying it would agree with it, and finite
    differences of the forward would still fail it."""
    from numpy_tf import grading
    from numpy_tf.layers.activations import gelu_backward, gelu_forward

    def wrong(dout, cache):
        return gelu_backward(dout, gelu_forward(cache.x, "none")[1])

    spec, forward, _ = grading._REFERENCE["gelu"]
    monkeypatch.setitem(grading._REFERENCE, "gelu", (spec, forward, wrong))
    path = write(tmp_path, '''
from numpy_tf.layers.activations import gelu_backward as exact_backward, gelu_forward

def gelu_backward(dout, cache):
    return exact_backward(dout, gelu_forward(cache.x, "none")[1])
''')
    cases = {(case.case, case.dtype): case for case in grade(path).functions[0].cases}
    assert cases["exact (erf)", "float64"].passed        # there the two derivatives agree
    tanh = cases["tanh approximation", "float64"]
    assert not tanh.passed and tanh.message.startswith("finite differences of numpy_tf's "
                                                       "forward disagree for x")


def test_a_syntax_error_fails_every_function_with_one_message(tmp_path):
    path = write(tmp_path, "import numpy as np\n\ndef layernorm_backward(dout, cache):\n"
                           "    return dout +\n\ndef gelu_forward(x, approximate='none'):\n"
                           "    return x\n")
    report = grade(path, forwards=True)
    assert [f.function for f in report.functions] == ["layernorm_backward", "gelu_forward"]
    messages = {f.error for f in report.functions}
    assert len(messages) == 1 and messages.pop().startswith("SyntaxError: invalid syntax "
                                                            "(line 4)")
    assert report.to_dict()["points"] == 0
    crash = write(tmp_path, "raise RuntimeError('at import')\n", "crash.py")
    report = grade(crash)
    assert report.functions[0].error == "RuntimeError: at import (line 1)"


def test_only_functions_the_file_defines_are_graded(tmp_path):
    path = write(tmp_path, "from numpy_tf.layers.norm import layernorm_backward\n")
    with pytest.raises(ValueError, match="defines none of numpy_tf's layer functions"):
        grade(path)
    with pytest.raises(FileNotFoundError, match="no such submission file"):
        grade(tmp_path / "missing.py")


def test_a_submission_cannot_change_the_reference(tmp_path):
    saved = numpy_tf.norm.layernorm_backward, dict(LAYERS)
    path = write(tmp_path, '''
import numpy as np
import numpy_tf.layers.norm
import numpy_tf.teaching.layer_table

def layernorm_backward(dout, cache):
    return np.zeros_like(dout), None, None

numpy_tf.norm.layernorm_backward = layernorm_backward
numpy_tf.layers_registry.LAYERS.clear()
''')
    try:
        report = grade(path)
    finally:
        numpy_tf.norm.layernorm_backward = saved[0]
        LAYERS.update(saved[1])
    assert not report.passed and report.functions[0].points == 0


def test_grade_and_assignment_commands(tmp_path, capsys):
    homework = tmp_path / "homework.py"
    assert main(["assignment", "gelu", "softmax", "-o", str(homework)]) == 0
    assert f"numpy-tf grade {homework}" in capsys.readouterr().out
    assert main(["assignment", "gelu", "-o", str(homework)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["assignment", "conv", "-o", str(tmp_path / "x.py")]) == 2
    assert "unknown layer 'conv'" in capsys.readouterr().err
    assert main(["grade", str(homework)]) == 1
    out = capsys.readouterr().out
    assert "gelu_backward" in out and "FAIL: exact (erf) (float64): NotImplementedError" in out
    assert "debugging" not in out
    homework.write_text(solved(homework.read_text()))
    assert main(["grade", str(homework), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["points"] == data["possible"] == 2 * 10   # two backwards, 10 each
    assert main(["grade", str(tmp_path / "missing.py")]) == 2
    assert "no such submission file" in capsys.readouterr().err
    assert "numpy_tf_submission" not in " ".join(sys.modules)


def test_report_text_and_json_agree(tmp_path):
    path = write(tmp_path, "def relu_backward(dout, cache):\n    return dout * cache.positive\n")
    report = grade(path)
    text, data = str(report), report.to_dict()
    assert report.passed and "relu_backward" in text and "10/10 points" in text
    assert data["functions"][0]["cases"][0]["fd_norm_rel_error"] < 1e-8
    assert np.isfinite(json.loads(json.dumps(data))["points"])


def test_an_endless_loop_fails_its_cases_and_the_grader_goes_on(tmp_path):
    """Each call into the submission has a time limit; a loop that swallows Exception cannot
    hold the grader either (the limit is a BaseException), nor can an import that never ends."""
    path = write(tmp_path, "from numpy_tf.layers.activations import gelu_backward as exact\n\n"
                           "def gelu_backward(dout, cache):\n"
                           "    while True:\n"
                           "        try:\n"
                           "            pass\n"
                           "        except Exception:\n"
                           "            pass\n\n"
                           "def relu_backward(dout, cache):\n"
                           "    return dout * cache.positive\n")
    report = grade(path, time_limit=0.2)
    results = {f.function: f for f in report.functions}
    assert results["relu_backward"].passed
    assert not any(case.passed for case in results["gelu_backward"].cases)
    assert all("TimeLimitExceeded: still running after 0.2 s" in case.message
               for case in results["gelu_backward"].cases)
    hangs = write(tmp_path, "while True:\n    pass\n\ndef relu_backward(dout, cache):\n"
                            "    return dout\n", "hangs.py")
    report = grade(hangs, time_limit=0.2)
    assert report.functions[0].error.startswith("TimeLimitExceeded: still running after 0.2 s")
    assert main(["grade", str(hangs), "--time-limit", "-1"]) == 2


def test_a_notebook_is_handed_out_and_graded_like_a_python_file(tmp_path):
    """assignment(format="ipynb") writes plain nbformat-4 JSON holding the same code; a
    notebook is graded by its code cells (magics left out), with messages naming the cell."""
    from numpy_tf.teaching.notebook import notebook

    text = assignment(["relu", "gelu"], "homework.ipynb", format="ipynb")
    document = json.loads(text)
    assert document["nbformat"] == 4 and document["cells"][0]["cell_type"] == "markdown"
    code = "\n".join("".join(cell["source"]) for cell in document["cells"]
                     if cell["cell_type"] == "code")
    assert code.count("raise NotImplementedError") == 2
    assert ast.parse(code) and "def gelu_forward" in code
    report = grade(write(tmp_path, text, "homework.ipynb"))
    assert [f.function for f in report.functions] == ["relu_backward", "gelu_backward"]
    assert all("NotImplementedError" in f.first_failure and "(cell " in f.first_failure
               for f in report.functions)
    path = write(tmp_path, notebook([
        ("markdown", "# Alice's homework"),
        ("code", "%matplotlib inline\n!pip list\nimport numpy as np"),
        ("code", "def relu_backward(dout, cache):\n    return dout * cache.positive"),
        ("code", "def silu_backward(dout, cache):\n    x, s = cache\n"
                 "    raise ValueError('not yet')")]), "alice.ipynb")
    results = {f.function: f for f in grade(path).functions}
    assert results["relu_backward"].passed
    assert results["silu_backward"].first_failure.endswith("ValueError: not yet (cell 4, line 3)")


def test_the_notebook_assignment_is_valid_nbformat():
    nbformat = pytest.importorskip("nbformat")
    text = assignment(["layernorm"], "homework.ipynb", format="ipynb")
    nbformat.validate(nbformat.reads(text, as_version=4))


def test_a_folder_becomes_a_gradebook_and_gradescope_results(tmp_path, capsys):
    from numpy_tf.teaching.notebook import notebook

    folder = tmp_path / "submissions"
    folder.mkdir()
    write(folder, "def relu_backward(dout, cache):\n    return dout * cache.positive\n",
          "alice.py")
    write(folder, notebook([("code", "def relu_backward(dout, cache):\n    return dout\n")]),
          "bob.ipynb")
    write(folder, "print('I did not do the homework')\n", "carol.py")
    assert main(["grade", str(folder)]) == 0                  # the CSV on stdout
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(row["student"], row["relu_backward"], row["total"], row["max"]) for row in rows] \
        == [("alice", "10.0", "10.0", "10.0"), ("bob", rows[1]["relu_backward"],
                                                  rows[1]["total"], "10.0"),
            ("carol", "0.0", "0.0", "10.0")]
    assert 0 < float(rows[1]["total"]) < 10                   # right where x > 0 only
    assert "defines none of numpy_tf's layer functions" in rows[2]["notes"]
    book, results = tmp_path / "gradebook.csv", tmp_path / "results"
    assert main(["grade", str(folder), "--csv", str(book), "--results-json", str(results)]) == 0
    assert "alice" in capsys.readouterr().out
    assert list(csv.DictReader(io.StringIO(book.read_text())))[0]["total"] == "10.0"
    alice = json.loads((results / "alice.json").read_text())
    assert alice["score"] == 10 and alice["tests"][0]["name"] == "relu_backward"
    assert alice["tests"][0]["max_score"] == 10 and "cases" in alice["tests"][0]["output"]
    single = tmp_path / "results.json"
    assert main(["grade", str(folder / "bob.ipynb"), "--results-json", str(single)]) == 1
    capsys.readouterr()
    assert json.loads(single.read_text())["score"] == pytest.approx(float(rows[1]["total"]),
                                                                   abs=0.01)
    assert main(["grade", str(folder / "alice.py"), "--csv", str(book)]) == 2
    assert "--csv" in capsys.readouterr().err
