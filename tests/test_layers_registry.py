"""The table of pure layer functions that grade, assignment, explain and gradcheck share: it
covers every pure backward numpy_tf has, and numpy_tf's own functions pass every edge case."""
import ast
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import numpy_tf
from numpy_tf.teaching.layer_table import (LAYERS, check_layer, check_shape, dtype_problems,
                                           gradcheck_layer, layer)


def _pure_pairs() -> set[str]:
    """Every family `<name>` with top-level `<name>_forward` and `<name>_backward` in numpy_tf,
    read from the source (so a new family that is not registered fails this test)."""
    names = set()
    for info in pkgutil.walk_packages(numpy_tf.__path__, "numpy_tf."):
        if info.name.endswith("__main__"):            # running it would run the command
            continue
        module = importlib.import_module(info.name)
        defined = {node.name for node in ast.parse(inspect.getsource(module)).body
                   if isinstance(node, ast.FunctionDef)}
        names |= {name[:-len("_backward")] for name in defined if name.endswith("_backward")
                  and name[:-len("_backward")] + "_forward" in defined
                  and not name.startswith("_")}
    return names


def test_every_pure_backward_is_in_the_table():
    assert _pure_pairs() == set(LAYERS)


@pytest.mark.parametrize("name", list(LAYERS))
def test_numpy_tf_passes_finite_differences_on_every_edge_case(name):
    spec = LAYERS[name]
    for case in spec.cases:
        if case.finite_differences:
            report = check_layer(name, spec.case_inputs(case), title=case.name)
            assert report.passed, str(report)
        assert not dtype_problems(spec, spec.case_inputs(case, np.float32)), case.name


def test_the_padding_case_is_exempt_because_finite_differences_disagree_there():
    """The padding row's gradient is zero by definition (torch's rule), not by derivative."""
    spec = layer("embedding")
    case = next(case for case in spec.cases if not case.finite_differences)
    report = check_layer("embedding", spec.case_inputs(case))
    assert not report.passed


def test_edge_cases_are_what_they_say():
    attention = layer("attention").case_inputs(layer("attention").cases[2])
    assert attention["attn_mask"][0].all()                      # a fully masked query row
    out, _ = layer("attention").forward(**{**attention, "rng": None})
    np.testing.assert_array_equal(out[:, :, 0], 0.0)
    spec = layer("layernorm")
    flat = spec.case_inputs(next(c for c in spec.cases if "variance" in c.name))["x"]
    assert flat.reshape(-1, flat.shape[-1]).var(axis=-1).min() < 1e-13
    ce = layer("cross_entropy")
    ignored = ce.case_inputs(next(c for c in ce.cases if "every" in c.name))["targets"]
    assert (ignored == -100).all()
    relu = layer("relu").case_inputs(layer("relu").cases[0])["x"]
    assert np.abs(relu).min() >= 0.05                          # away from the kink


def test_dropout_draws_the_same_mask_at_every_call():
    spec = layer("dropout")
    inputs = spec.case_inputs(spec.cases[0])
    first, _ = spec.call(spec.forward, inputs)
    second, _ = spec.call(spec.forward, inputs)
    np.testing.assert_array_equal(first, second)
    assert (first == 0).any()


def test_shapes_and_cases_are_checked():
    assert check_shape(layer("linear"), (3,)) == (3,)
    with pytest.raises(ValueError, match=r"q \(B, H, Tq, d\) must be 4 positive sizes; got "
                                         r"\(2, 3\)"):
        check_shape(layer("attention"), (2, 3))
    with pytest.raises(ValueError, match="x \\(..., C\\) must be 1 or more positive sizes"):
        check_shape(layer("layernorm"), (2, 0))
    with pytest.raises(ValueError, match="unknown layer 'norm'; known layers: linear, "):
        layer("norm")
    with pytest.raises(ValueError, match=r"case must be in \[0, 5\) for gelu: 0 exact"):
        gradcheck_layer("gelu", case=5)
    report, problems = gradcheck_layer("rope", (1, 2, 3, 6), "float32", case=1)
    assert report.passed and not problems and report.rows[0].shape == (1, 2, 3, 6)
