"""`numpy-tf check`: one table, exit status, --json."""
import json
import shutil

import numpy as np

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.cli.commands import main


def test_check_passes_on_the_committed_fixtures(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "forward err" in out and "FAIL" not in out and " 0 failed" in out


def test_check_json(capsys):
    assert main(["check", "--json", "--only", "linear*"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and {c["name"] for c in data["cases"]} == {"linear", "linear_nobias"}
    assert all(c["forward_max_abs_error"] < 1e-12 for c in data["cases"]
               if c["dtype"] == "float64")


def test_check_fails_on_a_perturbed_fixture(tmp_path, capsys):
    for path in fixtures_dir().glob("linear_float64.npz"):
        shutil.copy(path, tmp_path / path.name)
    case = Case.load(tmp_path / "linear_float64.npz")
    case.arrays["grad/weight"] = case.arrays["grad/weight"] + 1e-9
    case.save(tmp_path / "linear_float64.npz")
    assert main(["check", "--fixtures", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: grad/weight" in out


def test_check_reports_an_unreadable_file_as_a_failure(tmp_path, capsys):
    (tmp_path / "broken_float64.npz").write_bytes(b"not a zip")
    assert main(["check", "--fixtures", str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_check_with_no_match_is_an_error(capsys):
    assert main(["check", "--only", "no-such-layer"]) == 1
    assert np is not None


def test_train_then_sample(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("abc abd abe abf " * 40 + "中文 🙂\n")
    out = tmp_path / "run"
    assert main(["train", "--text", str(text), "--config", "tiny-gpt", "--steps", "6",
                 "--batch-size", "4", "--out", str(out), "--log-every", "3",
                 "--sample-tokens", "5", "--prompt", "ab"]) == 0
    printed = capsys.readouterr().out
    assert "loss" in printed and "sample: ab" in printed
    assert (out / "checkpoint.npz").is_file() and (out / "history.csv").is_file()
    assert main(["sample", str(out / "checkpoint.npz"), "--prompt", "abc", "--tokens", "12",
                 "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main(["sample", str(out / "checkpoint.npz"), "--prompt", "abc", "--tokens", "12",
                 "--seed", "3"]) == 0
    assert capsys.readouterr().out == first and first.startswith("abc")


def test_train_with_a_bpe_tokenizer_saves_it_for_sampling(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", "tiny-gpt", "--steps", "2", "--batch-size", "2",
                 "--tokenizer", "bpe:300", "--out", str(out), "--sample-tokens", "2"]) == 0
    assert "BPETokenizer" in capsys.readouterr().out
    assert main(["sample", str(out / "checkpoint.npz"), "--prompt", "Anna the", "--tokens",
                 "2"]) == 0
    assert capsys.readouterr().out.startswith("Anna the")


def test_train_and_sample_errors_are_one_line_and_status_2(tmp_path, capsys):
    assert main(["train", "--tokenizer", "bpe:many", "--steps", "1"]) == 2
    assert "--tokenizer must be 'byte' or 'bpe:N'" in capsys.readouterr().err
    assert main(["train", "--config", "no-such", "--steps", "1"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert main(["train", "--text", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read it as UTF-8" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "missing.npz"), "--prompt", "a"]) == 2
    assert "no such .npz file" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "missing.npz"), "--prompt", "a",
                 "--temperature", "-1"]) == 2
    assert "temperature must be" in capsys.readouterr().err
