"""The one text-table printer: columns as wide as their widest cell, two spaces apart, counts
right-aligned where asked, no trailing spaces; the reports print through it."""
import pytest

from numpy_tf.core.table import format_table


def test_columns_align_and_lines_end_without_spaces():
    text = format_table(("name", "n", "verdict"), [("a", "1,234", "pass"), ("longer", "5", "")],
                        align="lr")
    assert text.split("\n") == ["name        n  verdict",
                                "a       1,234  pass",
                                "longer      5"]


def test_a_row_of_the_wrong_length_or_a_bad_align_is_refused():
    with pytest.raises(ValueError, match="every row must have 2 cells, as the header; got 1"):
        format_table(("a", "b"), [("x",)])
    with pytest.raises(ValueError, match="align must be at most 2 letters"):
        format_table(("a", "b"), [], align="lc")


def test_every_report_prints_through_it(monkeypatch):
    """Each report looks the printer up in its own module: replacing it there changes what the
    parameter table and the gradcheck report print (the others are checked to hold the same
    function)."""
    import importlib

    import numpy as np

    from numpy_tf.checking.finite_differences import gradcheck_module
    from numpy_tf.layers.linear import Linear
    from numpy_tf.models.accounting import account

    for name in ["numpy_tf.checking.finite_differences", "numpy_tf.models.accounting",
                 "numpy_tf.checking.compare", "numpy_tf.teaching.grading",
                 "numpy_tf.cli.commands"]:
        module = importlib.import_module(name)
        assert module.format_table is format_table, name
        monkeypatch.setattr(module, "format_table", lambda *args, **kwargs: "<TABLE>")
    assert "<TABLE>" in str(account("tiny-gpt"))
    x = np.random.default_rng(0).standard_normal((2, 3))
    assert "<TABLE>" in str(gradcheck_module(Linear(3, 2), x, title="linear"))
