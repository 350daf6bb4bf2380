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
