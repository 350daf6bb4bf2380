"""What a user of the package relies on beyond the layers: every public name of the first
release, the module paths of its flat layout, `python -m numpy_tf`, `--version`, and the files
packaging tools look for."""
import configparser
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_tf
from numpy_tf._old_paths import OLD_PATHS, SPLIT

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = (Path(__file__).parent / "public_names.txt").read_text().split()


def test_every_public_name_of_the_first_release_is_still_exported():
    assert len(PUBLIC) == 190
    missing = [name for name in PUBLIC if not hasattr(numpy_tf, name)]
    assert not missing, missing


@pytest.mark.parametrize("old", sorted(set(OLD_PATHS) - set(SPLIT)))
def test_an_old_module_path_is_the_module_that_holds_its_code_now(old):
    module = importlib.import_module(f"numpy_tf.{old}")
    assert module is importlib.import_module(f"numpy_tf.{OLD_PATHS[old]}")
    assert getattr(numpy_tf, old) is module


def test_the_functions_that_shadowed_their_modules_are_functions():
    for name in ("gradcheck", "feedforward", "generate"):
        assert callable(getattr(numpy_tf, name)) and not isinstance(getattr(numpy_tf, name), type(sys))
    from numpy_tf.cases import Case  # the README's import paths
    from numpy_tf.gguf_tokenizer import GGUFTokenizer, smollm2_chat
    from numpy_tf.pretrained import fetch_smollm2, load_gguf
    from numpy_tf.torch_bridge import run_torch
    assert Case and run_torch and fetch_smollm2 and load_gguf and GGUFTokenizer and smollm2_chat


def test_python_dash_m_is_the_console_script():
    run = subprocess.run([sys.executable, "-m", "numpy_tf", "--version"], capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == f"numpy-tf {numpy_tf.__version__}"
    usage = subprocess.run([sys.executable, "-m", "numpy_tf", "no-such-command"],
                           capture_output=True, text=True, cwd=ROOT)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_the_version_is_the_metadata_version_and_the_license_is_shipped():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"] == numpy_tf.__version__
    assert setup["metadata"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "numpy_tf" / "py.typed").exists()
    assert "py.typed" in setup["options.package_data"]["numpy_tf"]


def test_every_folder_of_the_package_is_declared():
    """A subpackage missing from setup.cfg would be absent from a non-editable install."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    declared = set(setup["options"]["packages"].split())
    folders = {".".join(path.parent.relative_to(ROOT).parts)
               for path in (ROOT / "numpy_tf").rglob("__init__.py")}
    assert folders <= declared, folders - declared


def test_an_old_module_split_in_several_still_shows_every_name():
    from numpy_tf.cbow import CBOW, Vocabulary, load_cbow, train_cbow, words
    from numpy_tf.data import default_corpus, reverse_digits
    from numpy_tf.train import Trainer, language_model_trainer
    assert train_cbow is numpy_tf.training.cbow.train_cbow and CBOW is numpy_tf.CBOW
    assert Vocabulary and load_cbow and words and reverse_digits and Trainer
    assert default_corpus is numpy_tf.text.corpus.default_corpus
    assert language_model_trainer is numpy_tf.training.tasks.language_model_trainer
    assert getattr(numpy_tf, "cbow") is importlib.import_module("numpy_tf.cbow")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        numpy_tf.cbow.nothing
