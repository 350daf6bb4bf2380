"""Hostile submissions: whatever a file does (exit the process, raise a BaseException, loop in C,
write to file descriptor 1, patch numpy, call numpy_tf's own backward) the grader survives,
keeps to its time limit, keeps its --json output valid and its own numpy untouched, and gives
no points for it. Each file runs in one child process (a new one only after a crash)."""
import json
import math
import time

import numpy as np
import pytest

from numpy_tf.cli.commands import main
from numpy_tf.teaching.grading import grade
from numpy_tf.teaching.layer_table import LAYERS, grading_cases

CORRECT_RELU = "def relu_backward(dout, cache):\n    return dout * cache.positive\n"


def write(tmp_path, text: str, name: str = "hostile.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def functions(report) -> dict:
    return {f.function: f for f in report.functions}


def test_hostile_functions_fail_alone_and_the_grader_goes_on(tmp_path):
    """One file, a different attack in each function, graded in one run: each attacked
    function earns nothing, the correct one keeps all its points, and numpy in the grader's
    process is still numpy."""
    allclose, array_equal, isfinite = np.allclose, np.array_equal, np.isfinite
    source = '''
import importlib
import os
import sys

import numpy as np
import numpy_tf as n
from numpy_tf.layers.linear import linear_backward as borrowed
from numpy_tf.kernels.embedding import embedding_backward_into


def linear_backward(dout, cache):                   # delegation under another name
    return borrowed(dout, cache)


def embedding_backward(dout, cache):                # delegation to the kernel
    ids, vocab, padding_idx, dim, dtype = cache
    dweight = np.zeros((vocab, dim), dtype=dtype)
    embedding_backward_into(dweight, dout, ids, padding_idx)
    return dweight


def relu_backward(dout, cache):                     # ends the process
    os._exit(3)


def gelu_backward(dout, cache):                     # one C call that never returns
    return dout * sum(range(10 ** 13))


class Escape(BaseException):
    pass


def silu_backward(dout, cache):                     # a BaseException no `except Exception` sees
    raise Escape("out of here")


def softmax_backward(dout, cache):                  # numpy patched to say yes to everything
    np.allclose = lambda *args, **kwargs: True
    np.array_equal = lambda *args, **kwargs: True
    np.isfinite = lambda x: np.ones(np.shape(x), dtype=bool)
    np.testing.assert_allclose = lambda *args, **kwargs: None
    return dout * 0.5


def log_softmax_backward(dout, cache):              # writes on file descriptor 1 and 2
    os.write(1, b"{not json")
    os.write(2, b"noise")
    print("more noise", flush=True)
    return dout - cache.probs * dout.sum(axis=cache.axis, keepdims=True)


def layernorm_backward(dout, cache):                # delegation through the package
    return n.layers.norm.layernorm_backward(dout, cache)


def rmsnorm_backward(dout, cache):                  # delegation through importlib
    return importlib.import_module("numpy_tf.layers.norm").rmsnorm_backward(dout, cache)


def dropout_backward(dout, cache):                  # right: every point
    return dout if cache.mask is None else dout * cache.mask


def cbow_backward(dout, cache):                     # exits "cleanly"
    sys.exit(0)
'''
    path = write(tmp_path, source)
    lines = source.splitlines()
    escape_line = lines.index('    raise Escape("out of here")') + 1
    exit_line = lines.index("    sys.exit(0)") + 1
    started = time.monotonic()
    report = grade(path, time_limit=3.0)
    elapsed = time.monotonic() - started
    results = functions(report)
    assert (np.allclose, np.array_equal, np.isfinite) == (allclose, array_equal, isfinite)
    assert set(results) == {"linear_backward", "embedding_backward", "relu_backward",
                            "gelu_backward", "silu_backward", "softmax_backward",
                            "log_softmax_backward", "layernorm_backward", "rmsnorm_backward",
                            "dropout_backward", "cbow_backward"}
    assert results["dropout_backward"].passed and results["dropout_backward"].points == 10
    assert results["log_softmax_backward"].passed        # its noise reaches nobody
    for name in ("linear_backward", "layernorm_backward", "rmsnorm_backward",
                 "embedding_backward"):
        flagged = results[name]
        assert flagged.points == 0 and not flagged.passed and flagged.flag, name
    assert "numpy_tf's linear_backward" in results["linear_backward"].flag
    assert "numpy_tf.kernels.embedding.embedding_backward_into" in \
        results["embedding_backward"].flag
    assert all(case.passed for case in results["layernorm_backward"].cases)  # right, but not theirs
    relu = results["relu_backward"]
    assert relu.points == 0 and "ended (exit status 3) during a call" in relu.cases[0].message
    assert all("later cases were not run" in case.message for case in relu.cases[1:])
    gelu = results["gelu_backward"]
    assert gelu.points == 0
    assert gelu.cases[0].message.startswith("TimeLimitExceeded: still running after 3 s")
    assert results["silu_backward"].cases[0].message == \
        f"Escape: out of here (line {escape_line})"
    assert results["softmax_backward"].points == 0
    assert "dx differs from numpy_tf's" in results["softmax_backward"].first_failure
    assert f"SystemExit: 0 (line {exit_line})" in results["cbow_backward"].cases[0].message
    # one C loop cut at 3 s, two new processes (after the exit and the loop): no more
    assert elapsed < 3.0 + 60.0
    json.dumps(report.to_dict(), allow_nan=False)


@pytest.mark.parametrize("attack, message", [
    ("import os\nos._exit(0)\n", "ended (exit status 0)"),
    ("class Escape(BaseException):\n    pass\nraise Escape('bye')\n", "Escape: bye (line 3)"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt (line 1)"),
    ("import sys\nsys.exit(4)\n", "SystemExit: 4 (line 2)"),
    ("x = sum(range(10 ** 13))\n", "TimeLimitExceeded: still running after 2 s"),
])
def test_an_import_that_attacks_fails_every_function_with_one_message(tmp_path, attack, message):
    path = write(tmp_path, attack + "\n" + CORRECT_RELU)
    started = time.monotonic()
    report = grade(path, time_limit=2.0)
    assert time.monotonic() - started < 60.0
    (relu,) = report.functions
    assert relu.function == "relu_backward" and relu.points == 0
    assert message in relu.error, relu.error


def test_json_stays_valid_whatever_the_file_writes(tmp_path, capfd):
    """Writes to file descriptors 1 and 2, at import and in every call: the grader's stdout
    holds the JSON report and nothing else."""
    path = write(tmp_path, '''
import os
os.write(1, b"]]] not json at import\\n")
os.write(2, b"stderr at import\\n")

def relu_backward(dout, cache):
    os.write(1, b"{{{")
    print("print in a call")
    return dout * cache.positive
''')
    capfd.readouterr()
    assert main(["grade", str(path), "--json"]) == 0
    out, err = capfd.readouterr()
    data = json.loads(out)
    assert data["passed"] and data["points"] == data["possible"] == 10
    assert "not json" not in err and "print in a call" not in out + err


def test_a_patched_numpy_cannot_make_a_wrong_answer_pass(tmp_path):
    """At import, every check a naive grader would use says yes; the wrong backward still
    earns nothing, and the grader's numpy is untouched."""
    saved = np.allclose, np.testing.assert_allclose, np.isfinite, np.abs
    path = write(tmp_path, '''
import numpy as np
np.allclose = lambda *args, **kwargs: True
np.testing.assert_allclose = lambda *args, **kwargs: None
np.isfinite = lambda x: np.ones(np.shape(x), dtype=bool)
np.abs = lambda x: np.zeros(np.shape(x))

def relu_backward(dout, cache):
    return dout * 2.0
''')
    report = grade(path)
    assert report.functions[0].points == 0 and not report.passed
    assert (np.allclose, np.testing.assert_allclose, np.isfinite, np.abs) == saved


def test_a_backward_that_only_calls_numpy_tf_is_flagged_by_every_route(tmp_path):
    """Five routes to numpy_tf's own code in one file (one process), and a composite that
    uses what an assignment hands out (numpy_tf's linear inside swiglu), which is no
    delegation."""
    path = write(tmp_path, '''
import importlib

import numpy_tf
import numpy_tf as n
from numpy_tf.layers.activations import silu_backward as f
from numpy_tf.layers.linear import linear_backward
from numpy_tf.layers.mlp import swiglu_gate_backward


def silu_backward(dout, cache):                     # an alias
    return f(dout, cache)


def relu_backward(dout, cache):                     # through the package
    return n.layers.activations.relu_backward(dout, cache)


def softmax_backward(dout, cache):                  # numpy_tf's top-level name
    return numpy_tf.softmax_backward(dout, cache)


def log_softmax_backward(dout, cache):              # importlib and getattr
    module = importlib.import_module("numpy_tf.layers." + "softmax")
    return getattr(module, "log_softmax_" + "backward")(dout, cache)


def gelu_backward(dout, cache):                     # the layer class (it runs the kernel)
    layer = numpy_tf.GELU(cache.approximate)
    out, own = layer.forward(cache.x)
    return layer.backward(dout, own)


def swiglu_backward(dout, cache):
    dh, ddown_weight, ddown_bias = linear_backward(dout, cache.down)
    dgate, dup = swiglu_gate_backward(dh, cache.product)
    dx_gate, dgate_weight, dgate_bias = linear_backward(dgate, cache.gate)
    dx_up, dup_weight, dup_bias = linear_backward(dup, cache.up)
    return (dx_gate + dx_up, dgate_weight, dup_weight, ddown_weight, dgate_bias, dup_bias,
            ddown_bias)
''')
    results = functions(grade(path))
    for name in ("silu_backward", "relu_backward", "softmax_backward", "log_softmax_backward",
                 "gelu_backward"):
        assert results[name].points == 0 and "numpy_tf" in results[name].flag, name
    assert "numpy_tf's relu_backward" in results["relu_backward"].flag
    assert "numpy_tf.kernels.gelu" in results["gelu_backward"].flag
    assert results["swiglu_backward"].flag is None and results["swiglu_backward"].passed


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf"])
def test_a_time_limit_that_is_not_a_number_of_seconds_is_refused(tmp_path, capsys, value):
    path = write(tmp_path, CORRECT_RELU)
    assert main(["grade", str(path), f"--time-limit={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--time-limit" in err and value in err
    with pytest.raises(ValueError, match="time_limit must be a finite number"):
        grade(path, time_limit=float(value))


def test_no_time_limit_and_a_fraction_of_a_second_both_grade_a_correct_file(tmp_path):
    path = write(tmp_path, CORRECT_RELU)
    assert grade(path, time_limit=0).passed
    report = grade(path, time_limit=0.5)
    assert math.isclose(report.points, 10)
    assert len(grading_cases(LAYERS["relu"])) * 2 == len(report.functions[0].cases)
