"""The grader measured as a teacher would: wrong implementations a student would plausibly hand
in, at least two per layer, each losing points, while the correct homework keeps them all.

Each mistake is numpy_tf's own code with one idea wrong (written into the assignment skeleton
of every layer, solved): a line of a backward, or of the forward that makes its cache. The
k-th mistake of every layer goes into round k, one file per round, and the folder of the
correct file and the three rounds is graded as a teacher would (grade_folder, one process per
file, a CSV gradebook)."""
import ast
import csv
import io

import pytest

from numpy_tf.teaching.assignment import assignment
from numpy_tf.teaching.grading import grade_folder
from numpy_tf.teaching.layer_table import LAYERS
from test_grading import solved

# (function changed, what the student got wrong, [(numpy_tf's text, the student's text)])
MISTAKES = {
    "linear": [
        ("linear_backward", "dbias not summed over time (only over the batch axis)",
         [("dbias = dout_rows.sum(axis=0) if has_bias", "dbias = dout.sum(axis=0) if has_bias")]),
        ("linear_backward", "dweight transposed (x^T g instead of g^T x)",
         [("dweight = dout_rows.T @ x.reshape(-1, x.shape[-1])",
           "dweight = x.reshape(-1, x.shape[-1]).T @ dout_rows")]),
    ],
    "embedding": [
        ("embedding_backward", "dW[ids] += g, which drops repeated ids",
         [("np.add.at(dweight, ids.reshape(-1), dout.reshape(-1, dout.shape[-1]))",
           "dweight[ids.reshape(-1)] += dout.reshape(-1, dout.shape[-1])")]),
        ("embedding_backward", "the padding_idx row still gets a gradient",
         [("        dweight[padding_idx] = 0.0", "        pass")]),
    ],
    "relu": [
        ("relu_backward", "returns the mask, forgetting dout",
         [("return dout * cache.positive", "return cache.positive.astype(dout.dtype)")]),
        ("relu_backward", "ReLU applied to the gradient instead of masking it by x > 0",
         [("return dout * cache.positive", "return np.maximum(dout, 0.0)")]),
        ("relu_backward", "the mask cast to float64 (float32 in, float64 out)",
         [("return dout * cache.positive", "return dout * cache.positive.astype(np.float64)")]),
    ],
    "gelu": [
        ("gelu_backward", "the exact (erf) derivative for the tanh variant too",
         [('    if approximate == "none":\n        with', '    if True:\n        with')]),
        ("gelu_backward", "the product rule's x phi(x) term forgotten",
         [("slope = pdf * x + cdf", "slope = cdf")]),
        ("gelu_backward", "the tanh variant's inner derivative without the 3 of 3x^2",
         [("3.0 * _TANH_CUBIC", "_TANH_CUBIC")]),
    ],
    "silu": [
        ("silu_backward", "sigma(x) as the derivative (the product rule forgotten)",
         [("slope = ((1.0 - s) * x + 1.0) * s", "slope = s")]),
        ("silu_backward", "sigma recomputed as exp(x) / (1 + exp(x)), NaN at large x",
         [("    slope = ((1.0 - s) * x + 1.0) * s",
           "    s = np.exp(x) / (1.0 + np.exp(x))\n    slope = ((1.0 - s) * x + 1.0) * s")]),
    ],
    "softmax": [
        ("softmax_backward", "without the subtraction: dx = p * dout",
         [("dx = dout - (dout * probs).sum(axis=axis, keepdims=True)", "dx = dout.copy()")]),
        ("softmax_backward", "the sum always over the last axis",
         [("(dout * probs).sum(axis=axis, keepdims=True)",
           "(dout * probs).sum(axis=-1, keepdims=True)")]),
    ],
    "log_softmax": [
        ("log_softmax_backward", "dx = dout - p (the sum of dout forgotten)",
         [("return dout - probs * dout.sum(axis=axis, keepdims=True)", "return dout - probs")]),
        ("log_softmax_backward", "the sum always over the last axis",
         [("dout.sum(axis=axis, keepdims=True)", "dout.sum(axis=-1, keepdims=True)")]),
    ],
    "cross_entropy": [
        ("cross_entropy_backward", "label smoothing left out of the gradient",
         [("targets.reshape(-1)] -= 1.0 - smoothing", "targets.reshape(-1)] -= 1.0"),
          ("        dlogits -= smoothing / classes", "        pass")]),
        ("cross_entropy_backward", "'mean' divides by every position, ignored ones included",
         [("dloss = dloss / count if count else np.zeros_like(dloss)",
           "dloss = dloss / keep.size")]),
        ("cross_entropy_backward", "softmax without the max shift: exp overflows",
         [("dlogits = np.exp((logits - row_max) - log_sum)",
           "dlogits = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)")]),
    ],
    "dropout": [
        ("dropout_backward", "the kept units not rescaled by 1 / (1 - p)",
         [("else dout * cache.mask", "else dout * (cache.mask != 0)")]),
        ("dropout_backward", "the mask forgotten",
         [("return dout if cache.mask is None else dout * cache.mask", "return dout")]),
    ],
    "attention": [
        ("attention_backward", "the scale 1/sqrt(d) left out of dq and dk",
         [("dq = (dscores_grouped @ k).reshape(q.shape) * scale",
           "dq = (dscores_grouped @ k).reshape(q.shape)"),
          ("dk = (dscores_grouped.swapaxes(-1, -2) @ _grouped(q, groups)) * scale",
           "dk = dscores_grouped.swapaxes(-1, -2) @ _grouped(q, groups)")]),
        ("attention_backward", "the dropout mask ignored in the backward",
         [("weights = probs if dropout is None else probs * dropout", "weights = probs"),
          ("dprobs = dweights if dropout is None else dweights * dropout",
           "dprobs = dweights")]),
        ("attention_backward", "the mask ignored: P recomputed from q and k alone",
         [("    groups = k.shape[1]\n",
           "    groups = k.shape[1]\n"
           "    scores = (_grouped(q, groups) @ k.swapaxes(-1, -2)).reshape(probs.shape) * scale\n"
           "    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))\n"
           "    probs = probs / probs.sum(axis=-1, keepdims=True)\n")]),
    ],
    "flash_attention": [
        ("flash_attention_backward", "the scale left out of dq and dk",
         [("dq[:, :, rows] += scale * (dscores @ k_tile)", "dq[:, :, rows] += dscores @ k_tile"),
          ("dk_heads[:, :, cols] += scale * (dscores.swapaxes(-1, -2) @ q_tile)",
           "dk_heads[:, :, cols] += dscores.swapaxes(-1, -2) @ q_tile")]),
        ("flash_attention_backward", "D = rowsum(dout * out) forgotten",
         [("dscores = probs * (dprobs - delta[:, :, rows, None])", "dscores = probs * dprobs")]),
        ("flash_attention_backward", "grouped heads: dk and dv from the first head of each "
         "group, not summed",
         [("dk = dk_heads.reshape(batch, groups, ratio, tk, width).sum(axis=2)",
           "dk = dk_heads.reshape(batch, groups, ratio, tk, width)[:, :, 0]"),
          ("dv = dv_heads.reshape(batch, groups, ratio, tk, v.shape[3]).sum(axis=2)",
           "dv = dv_heads.reshape(batch, groups, ratio, tk, v.shape[3])[:, :, 0]")]),
    ],
    "layernorm": [
        ("layernorm_forward", "unbiased variance (divides by C - 1, not torch's C)",
         [("var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)",
           "var = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / max(x.shape[-1] - 1, 1)")]),
        ("layernorm_forward", "eps outside the square root",
         [("inv_std = 1.0 / np.sqrt(var + eps)", "inv_std = 1.0 / (np.sqrt(var) + eps)")]),
        ("layernorm_backward", "the mean term of dx missing",
         [("dx = (g - mean_g - x_hat * mean_g_x_hat) * inv_std",
           "dx = (g - x_hat * mean_g_x_hat) * inv_std")]),
    ],
    "rmsnorm": [
        ("rmsnorm_backward", "the weight left out of dx",
         [("g = dout * weight if weight is not None else dout", "g = dout")]),
        ("rmsnorm_forward", "eps outside the square root",
         [("inv_rms = 1.0 / np.sqrt(mean_square + eps)",
           "inv_rms = 1.0 / (np.sqrt(mean_square) + eps)")]),
    ],
    "learned_positions": [
        ("learned_positions_backward", "dweight from the first sequence only, not summed",
         [("dweight[offset:offset + length] = dout.sum(axis=0)",
           "dweight[offset:offset + length] = dout[0]")]),
        ("learned_positions_backward", "the offset ignored",
         [("dweight[offset:offset + length] = dout.sum(axis=0)",
           "dweight[:length] = dout.sum(axis=0)")]),
    ],
    "sinusoidal_positions": [
        ("sinusoidal_positions_backward", "summed over the batch, as if PE were a parameter",
         [("return dout.copy()", "return dout.sum(axis=0)")]),
        ("sinusoidal_positions_backward", "d(x + PE)/dx = 1 returned without dout",
         [("return dout.copy()", "return np.ones_like(dout)")]),
    ],
    "rope": [
        ("rope_backward", "always the halves layout (the interleaved pairs ignored)",
         [("da_out, db_out = _pairs(dout, interleaved)", "da_out, db_out = _pairs(dout, False)"),
          ("da, db = _pairs(dx, interleaved)", "da, db = _pairs(dx, False)")]),
        ("rope_backward", "rotated by +theta again instead of back by -theta",
         [("da[...] = da_out * cos + db_out * sin", "da[...] = da_out * cos - db_out * sin"),
          ("db[...] = db_out * cos - da_out * sin", "db[...] = db_out * cos + da_out * sin")]),
    ],
    "swiglu_gate": [
        ("swiglu_gate_backward", "silu's derivative left out of dgate",
         [("dgate = silu_backward(dhidden * up, act_cache)", "dgate = dhidden * up")]),
        ("swiglu_gate_backward", "sigma(g) used as silu's derivative",
         [("dgate = silu_backward(dhidden * up, act_cache)",
           "dgate = dhidden * up * act_cache.sigmoid")]),
    ],
    "swiglu": [
        ("swiglu_backward", "dx from the gate path only",
         [("return dx_gate + dx_up, dgate, dup", "return dx_gate, dgate, dup")]),
        ("swiglu_backward", "dgate_weight and dup_weight returned in each other's place",
         [("return dx_gate + dx_up, dgate, dup", "return dx_gate + dx_up, dup, dgate")]),
    ],
    "softcap": [
        ("softcap_backward", "tanh's derivative taken as 1 - tanh, not 1 - tanh^2",
         [("return dout * (1.0 - t * t)", "return dout * (1.0 - t)")]),
        ("softcap_backward", "a sign slip: 1 + tanh^2",
         [("return dout * (1.0 - t * t)", "return dout * (1.0 + t * t)")]),
    ],
    "partial_rope": [
        ("partial_rope_backward", "the features that pass through get no gradient",
         [("np.concatenate([drotated, dout[..., rotary_dim:]], axis=-1)",
           "np.concatenate([drotated, np.zeros_like(dout[..., rotary_dim:])], axis=-1)")]),
        ("partial_rope_backward", "the rotated and the passed-through parts in swapped places",
         [("np.concatenate([drotated, dout[..., rotary_dim:]], axis=-1)",
           "np.concatenate([dout[..., rotary_dim:], drotated], axis=-1)")]),
    ],
    "moe": [
        ("moe_backward", "dx without the router's part",
         [("return (dtokens + drouter_x).reshape(cache.shape)",
           "return dtokens.reshape(cache.shape)")]),
        ("moe_backward", "the renormalization of the top-k weights left out (dq = dw)",
         [("dtop = (dweights - (dweights * cache.weights).sum(axis=-1, keepdims=True)) / sums",
           "dtop = dweights")]),
    ],
    "load_balancing_loss": [
        ("load_balancing_loss_backward", "the factor E forgotten",
         [("scale = float(dloss) * experts / cache.rows", "scale = float(dloss) / cache.rows")]),
        ("load_balancing_loss_backward", "padding rows get a gradient too",
         [("dprobs = (scale * cache.fractions)[None, :] * cache.keep[:, None]",
           "dprobs = np.tile(scale * cache.fractions, (cache.keep.shape[0], 1))")]),
    ],
    "cbow": [
        ("cbow_backward", "the mean's 1 / 2c forgotten",
         [("dshare = dmean / context_size", "dshare = dmean")]),
        ("cbow_backward", "dW[ids] += g, which drops a word seen twice in a context",
         [("    return embedding_backward(dlooked_up, embedding)",
           "    ids = embedding.ids.reshape(-1)\n"
           "    dweight = np.zeros((embedding.num_embeddings, dmean.shape[-1]), dmean.dtype)\n"
           "    dweight[ids] += dlooked_up.reshape(-1, dmean.shape[-1])\n"
           "    return dweight")]),
    ],
}
ROUNDS = max(len(mistakes) for mistakes in MISTAKES.values())


def with_mistake(text: str, function: str, edits) -> str:
    """`text` with each (old, new) applied once inside the top-level function `function`."""
    node = next(node for node in ast.parse(text).body
                if isinstance(node, ast.FunctionDef) and node.name == function)
    lines = text.splitlines(keepends=True)
    start = node.lineno - 1
    body = "".join(lines[start:node.end_lineno])
    for old, new in edits:
        assert body.count(old) == 1, (function, old)      # numpy_tf's code still reads so
        body = body.replace(old, new)
    return "".join(lines[:start]) + body + "".join(lines[node.end_lineno:])


def given(text: str, layer: str) -> str:
    """`text` with the layer's backward imported from numpy_tf, as an assignment hands out a
    layer it does not ask for: not graded, and still there for the functions that call it."""
    node = next(node for node in ast.parse(text).body
                if isinstance(node, ast.FunctionDef) and node.name == f"{layer}_backward")
    lines = text.splitlines(keepends=True)
    module = LAYERS[layer].module.__name__
    return "".join(lines[:node.lineno - 1]) + \
        f"from {module} import {layer}_backward  # noqa: E402\n" + \
        "".join(lines[node.end_lineno:])


def test_every_layer_has_at_least_two_mistakes():
    assert set(MISTAKES) == set(LAYERS)
    assert all(len(mistakes) >= 2 for mistakes in MISTAKES.values())


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    correct = solved(assignment(list(LAYERS), "homework.py"))
    (folder / "correct.py").write_text(correct)
    for number in range(ROUNDS):
        text = correct
        for layer, mistakes in MISTAKES.items():
            if number < len(mistakes):
                function, _, edits = mistakes[number]
                text = with_mistake(text, function, edits)
            else:                           # the correct file grades it already
                text = given(text, layer)
        (folder / f"round{number + 1}.py").write_text(text)
    return grade_folder(folder)


def test_the_correct_homework_keeps_every_point(gradebook):
    report = gradebook.reports["correct"]
    assert report.passed, str(report)
    assert report.points == report.possible == 10 * len(LAYERS)


@pytest.mark.parametrize("layer", list(MISTAKES))
def test_every_mistake_loses_points(gradebook, layer):
    for number, (function, what, _) in enumerate(MISTAKES[layer]):
        report = gradebook.reports[f"round{number + 1}"]
        graded = {f.function: f for f in report.functions}[f"{layer}_backward"]
        assert graded.points < graded.possible, (layer, what)
        assert not graded.passed and graded.flag is None, (layer, what)


def test_the_gradebook_has_a_row_per_student_and_a_column_per_function(gradebook):
    rows = list(csv.DictReader(io.StringIO(gradebook.csv())))
    assert [row["student"] for row in rows] == ["correct"] + \
        [f"round{number + 1}" for number in range(ROUNDS)]
    assert list(rows[0])[1:-3] == [f"{layer}_backward" for layer in LAYERS]
    assert float(rows[0]["total"]) == float(rows[0]["max"]) == 10 * len(LAYERS)
    for number, row in enumerate(rows[1:]):
        graded = [layer for layer, mistakes in MISTAKES.items() if number < len(mistakes)]
        assert float(row["max"]) == 10 * len(LAYERS)           # a function not defined: 0
        assert float(row["total"]) == pytest.approx(
            sum(float(row[f"{layer}_backward"]) for layer in graded), abs=0.05)
        assert all(row[f"{layer}_backward"] == "0.0" for layer in LAYERS if layer not in graded)
