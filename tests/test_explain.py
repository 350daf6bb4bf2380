"""numpy-tf explain and numpy-tf gradcheck: a layer's source with its derivation, and its
finite-difference check, from the terminal."""
import inspect
import json

from numpy_tf.cli.commands import main
from numpy_tf.layers.norm import LayerNormCache, layernorm_backward, layernorm_forward
from numpy_tf.teaching.explain import explain


def test_explain_prints_cache_forward_and_backward_with_the_derivation():
    text = explain("layernorm", width=100)
    for function in (LayerNormCache, layernorm_forward, layernorm_backward):
        assert inspect.getsource(function).rstrip() in text
    assert text.index("class LayerNormCache") < text.index("def layernorm_forward") < \
        text.index("def layernorm_backward")
    assert "inv_std (g_j - mean(g) - x_hat_j mean(g * x_hat))" in text      # the derivation
    assert "biased variance" in text                                        # the family text
    assert "numpy-tf gradcheck layernorm" in text


def test_side_by_side_puts_the_backward_next_to_the_forward():
    text = explain("rope", side_by_side=True, width=120)
    body = [line for line in text.splitlines() if " | " in line]
    assert body and all(len(line) <= 120 for line in body)
    first = body[0].split(" | ")
    assert first[0].startswith("# the cache") and first[1].startswith("# backward")
    assert any("def rope_forward" in line.split(" | ")[0] for line in body)
    assert any("def rope_backward" in line.split(" | ")[1] for line in body)
    # a layer without a cache class still explains
    assert "def sinusoidal_positions_backward" in explain("sinusoidal_positions", width=80)


def test_explain_command_and_its_errors(capsys):
    assert main(["explain", "attention", "--width", "100"]) == 0
    assert "def attention_backward" in capsys.readouterr().out
    assert main(["explain", "conv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown layer 'conv'; known layers: linear, embedding" in err


def test_gradcheck_command(capsys):
    assert main(["gradcheck", "layernorm", "--shape", "2,3,5"]) == 0
    out = capsys.readouterr().out
    assert "x       (2, 3, 5)" in out and "all passed" in out
    assert "float64 in -> float64 output and gradients" in out
    assert main(["gradcheck", "attention", "--case", "2", "--dtype", "float32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["dtype_problems"] == [] and [r["name"] for r in
                                                                data["rows"]] == ["q", "k", "v"]
    assert "fully masked" in data["title"]


def test_gradcheck_command_errors(capsys):
    for argv, message in [
            (["gradcheck", "attention", "--shape", "2,3"], "must be 4 positive sizes"),
            (["gradcheck", "rope", "--shape", "1,2,3,5"], "even last dimension"),
            (["gradcheck", "gelu", "--case", "7"], "case must be in [0, 5) for gelu"),
            (["gradcheck", "conv"], "unknown layer 'conv'")]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err


# -- what explain prints computes -----------------------------------------------------------------
import ast                                                                     # noqa: E402
import textwrap                                                                # noqa: E402

import pytest                                                                  # noqa: E402

from numpy_tf.teaching.layer_table import LAYERS                               # noqa: E402

ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.MatMult, ast.Pow, ast.FloorDiv, ast.Mod)
ARRAY_METHODS = {"sum", "mean", "max", "min", "copy", "reshape", "transpose", "swapaxes",
                 "astype", "cumsum", "prod"}
MAX_CODE_LINES = 40     # one screen: the lines that are not the docstring, blank or comments


def _is_check(call: ast.Call) -> bool:
    """validate.<check>(...) or a _check_* helper: input checks, not computation."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else \
        getattr(call.func, "id", "")
    owner = getattr(call.func, "value", None)
    return name.startswith("_check") or getattr(owner, "id", None) == "validate"


def _is_check_statement(node: ast.AST) -> bool:
    """A raise, a check call, or `if <test>: raise ...`."""
    return isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and _is_check(node)) or \
        isinstance(node, ast.If) and all(isinstance(s, ast.Raise) for s in node.body) and \
        not node.orelse


def _computation(node: ast.AST, namespace: dict) -> list[ast.AST]:
    """The nodes under `node` that compute: arithmetic operators, augmented assignments, a
    unary minus, NumPy calls and array methods, and calls of another layer's reference
    `<name>_forward` / `<name>_backward` (a composite layer, SwiGLU say, composes them),
    leaving out raise statements and checks."""
    found = []
    for child in ast.iter_child_nodes(node):
        if _is_check_statement(child):
            continue
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and \
                child.func.id.endswith(("_forward", "_backward")) and \
                getattr(namespace.get(child.func.id), "__module__", "").startswith(
                    "numpy_tf.layers"):
            found.append(child)
        if isinstance(child, ast.BinOp) and isinstance(child.op, ARITHMETIC) or \
                isinstance(child, ast.AugAssign) or \
                isinstance(child, ast.UnaryOp) and isinstance(child.op, ast.USub):
            found.append(child)
        elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and (
                getattr(child.func.value, "id", None) == "np" or
                child.func.attr in ARRAY_METHODS):
            found.append(child)
        found += _computation(child, namespace)
    return found


def reading_problems(function) -> list[str]:
    """Why `function` is not a reference a student can read as the computation itself: it
    must compute in its own body (not return a private helper's result, not call a kernel),
    with no nested functions (blocks, threads), no `out=` arrays, on one screen."""
    source = textwrap.dedent(inspect.getsource(function))
    definition = ast.parse(source).body[0]
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        docstring_end = body[0].end_lineno
        body = body[1:]
    else:
        docstring_end = definition.lineno
    problems = []
    if not any(_computation(statement, function.__globals__) for statement in body):
        problems.append("its body computes nothing itself")
    for node in ast.walk(definition):
        if node is not definition and isinstance(node, (ast.FunctionDef, ast.Lambda)):
            problems.append(f"line {node.lineno}: a nested function (blocks, threads, closures)")
        if isinstance(node, ast.keyword) and node.arg == "out":
            problems.append(f"line {node.value.lineno}: writes through out= (into a given or aliased array)")
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "").startswith("_"):
            problems.append(f"line {node.lineno}: returns what a private helper computed")
        if isinstance(node, ast.Name) and \
                getattr(function.__globals__.get(node.id), "__module__", "").startswith(
                    "numpy_tf.kernels"):
            problems.append(f"line {node.lineno}: calls the kernel {node.id}")
    if any(arg.arg == "out" for arg in definition.args.args + definition.args.kwonlyargs):
        problems.append("has an out= parameter")
    lines = source.splitlines()[docstring_end - definition.lineno + 1:] if body else []
    code = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    if len(code) > MAX_CODE_LINES:
        problems.append(f"{len(code)} lines of code, more than one screen ({MAX_CODE_LINES})")
    return problems


@pytest.mark.parametrize("name", list(LAYERS))
def test_explain_shows_a_forward_and_a_backward_that_compute(name):
    spec = LAYERS[name]
    text = explain(name, width=200)
    for function in (spec.forward, spec.backward):
        assert inspect.getsource(function).rstrip() in text
        assert not reading_problems(function), (function.__qualname__,
                                                reading_problems(function))


# Three functions as the references were before the kernels moved out (a forward that only
# checks and delegates, a blocked backward on threads, a backward writing into out=): the
# rule must refuse each.
def _linear_rows(x, weight, bias):
    return x @ weight.T + bias


def delegating_forward(x, weight, bias=None):
    """y = x W^T + b."""
    _check_linear_like(x, weight)
    return _linear_rows(x, weight, bias)


def _check_linear_like(x, weight):
    if x.shape[-1] != weight.shape[1]:
        raise ValueError("x does not fit the weight")


def blocked_backward(dout, cache):
    """dx = dout * slope, in blocks."""
    x, out = cache
    dx = np.empty_like(x)

    def evaluate(block):
        slope = np.multiply(x[block], x[block], out=dx[block])
        slope *= dout[block]

    for start in range(0, x.size, 4):
        evaluate(slice(start, start + 4))
    return dx


def backward_into(dout, cache, out=None):
    """dx = dout w."""
    weight = cache
    return np.multiply(dout, weight, out=out)


def test_the_rule_refuses_what_the_references_must_not_be():
    assert reading_problems(delegating_forward) == [
        "its body computes nothing itself", "line 4: returns what a private helper computed"]
    problems = reading_problems(blocked_backward)
    assert any("nested function" in p for p in problems) and any("out=" in p for p in problems)
    assert "has an out= parameter" in reading_problems(backward_into)
    assert not reading_problems(_linear_rows)
