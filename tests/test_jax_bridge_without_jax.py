"""Without jax the JAX bridge still imports, and run_jax names the extra to install."""
import configparser
import sys
from pathlib import Path

import pytest

import numpy_tf
from numpy_tf.checking.export import export_case

ROOT = Path(__file__).resolve().parents[1]


def test_run_jax_names_the_extra_and_the_extra_exists(tmp_path, monkeypatch):
    from numpy_tf.jax_bridge import run_jax            # the documented path, jax or not

    assert numpy_tf.jax_bridge.run_jax is run_jax
    path = tmp_path / "case.npz"
    export_case("tiny-gpt").save(path)
    monkeypatch.setitem(sys.modules, "jax", None)        # as if jax were not installed
    with pytest.raises(ImportError, match=r"needs jax .* pip install 'numpy-tf\[jax\]'"):
        run_jax(lambda variables, inputs, tap: None, path, variables={})
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extra = setup["options.extras_require"]["jax"].split()
    assert {requirement.split(">=")[0] for requirement in extra} == {"jax", "flax"}
    assert "jax:" in setup["tool:pytest"]["markers"]
