"""Adversarial use of `numpy-tf train` and `numpy-tf sample`: every usage mistake is one line on
stderr and exit status 2, a run is never overwritten without --force, and --resume continues a
run with the same losses, bit for bit, as a run that never stopped."""
import csv

import numpy as np
import pytest

from numpy_tf.cli import main
from numpy_tf.training.checkpoint import load_checkpoint

TEXT = "abc abd abe abf " * 40


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    return path


def _train(text, out, *extra):
    return ["train", "--text", str(text), "--config", "tiny-gpt", "--batch-size", "2",
            "--out", str(out), "--log-every", "50", "--sample-tokens", "0", *extra]


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


USAGE_MISTAKES = [
    (["--steps", "0"], "--steps must be a positive integer; got 0"),
    (["--steps", "-3"], "--steps must be a positive integer; got -3"),
    (["--batch-size", "0"], "--batch-size must be a positive integer; got 0"),
    (["--lr", "-1"], "--lr must be a number in (0, inf); got -1.0"),
    (["--lr", "0"], "--lr must be a number in (0, inf); got 0.0"),
    (["--lr", "inf"], "--lr must be a finite number in (0, inf); got inf"),
    (["--lr", "nan"], "--lr must be a number in (0, inf); got nan"),
    (["--seed", "-1"], "--seed must be a non-negative integer; got -1"),
    (["--log-every", "0"], "--log-every must be a positive integer; got 0"),
    (["--sample-tokens", "-1"], "--sample-tokens must be a non-negative integer; got -1"),
    (["--until", "0"], "--until must be a positive integer; got 0"),
    (["--steps", "4", "--until", "5"], "--until must be at most --steps (4); got 5"),
    (["--tokenizer", "bpe:x"], "--tokenizer must be 'byte' or 'bpe:N'"),
    (["--config", "llama-tiny"], "numpy-tf train trains the gpt family on a text"),
    (["--steps", "2", "--sample-tokens", "3", "--prompt", ""], "--prompt must not be empty"),
]


@pytest.mark.parametrize("arguments, message", USAGE_MISTAKES,
                         ids=[" ".join(a) for a, _ in USAGE_MISTAKES])
def test_every_train_usage_mistake_is_one_line_and_status_2(tmp_path, text, capsys, arguments,
                                                             message):
    assert main(_train(text, tmp_path / "run", *arguments)) == 2
    _one_line(capsys, "numpy-tf train: ", message)
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_a_text_too_short_for_one_window_is_one_line(tmp_path, capsys):
    short = tmp_path / "short.txt"
    for content, message in [("abc", "leaves no held-out tokens"),
                             ("a" * 9, "no training windows: 8 tokens with context 8")]:
        short.write_text(content)
        assert main(_train(short, tmp_path / "run", "--steps", "2")) == 2
        _one_line(capsys, f"numpy-tf train: --text {short}: ", message)


def test_an_absurd_learning_rate_stops_the_run_in_one_line_and_saves_nothing(tmp_path, text,
                                                                            capsys):
    """--lr 1e30 is finite, so it is not refused up front; the run diverges within a few
    steps, and the Trainer's finiteness checks stop it: one line, status 2, no checkpoint."""
    assert main(_train(text, tmp_path / "run", "--steps", "20", "--lr", "1e30")) == 2
    line = _one_line(capsys, "numpy-tf train: step ", "training stopped and no checkpoint "
                     "was written", "a smaller --lr may help")
    assert "not finite" in line or "the loss is nan" in line
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_train_refuses_to_overwrite_a_run_unless_forced(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert main(_train(text, out, "--steps", "2")) == 0
    saved = (out / "checkpoint.npz").read_bytes()
    capsys.readouterr()
    for task in (["--steps", "2"], ["--task", "reverse-digits", "--config", "seq2seq-tiny"]):
        arguments = _train(text, out, *task) if task[0] == "--steps" else \
            ["train", *task, "--steps", "1", "--out", str(out)]
        assert main(arguments) == 2
        _one_line(capsys, f"--out {out} already holds a run", "--force",
                  f"--resume {out / 'checkpoint.npz'}")
        assert (out / "checkpoint.npz").read_bytes() == saved
    assert main(_train(text, out, "--steps", "3", "--force")) == 0
    assert load_checkpoint(out / "checkpoint.npz").step == 3
    assert main(["sample", str(out / "checkpoint.npz"), "--prompt", "ab", "--tokens", "2"]) == 0


def _losses(path):
    with open(path, newline="") as handle:
        return [(row["step"], row["loss"], row["lr"], row["grad_norm"], row["eval_loss"])
                for row in csv.DictReader(handle)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_resume_continues_the_run_bit_for_bit(tmp_path, text, capsys, dtype):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    common = ["--steps", "6", "--dtype", dtype]
    assert main(_train(text, straight, *common)) == 0
    assert main(_train(text, halves, *common, "--until", "3")) == 0
    assert "continue with numpy-tf train --resume" in capsys.readouterr().out
    assert load_checkpoint(halves / "checkpoint.npz").step == 3
    assert main(["train", "--resume", str(halves / "checkpoint.npz"), "--sample-tokens",
                 "0"]) == 0
    assert "from step 3" in capsys.readouterr().out
    assert _losses(halves / "history.csv") == _losses(straight / "history.csv")
    assert len(_losses(straight / "history.csv")) == 6
    a = load_checkpoint(straight / "checkpoint.npz")
    b = load_checkpoint(halves / "checkpoint.npz")
    assert a.step == b.step == 6 and a.meta["rng"] == b.meta["rng"]
    for name, value in a.arrays.items():
        if name != "history":                   # its seconds differ
            assert value.tobytes() == b.arrays[name].tobytes(), name
    history = a.arrays["history"]
    columns = a.meta["history_columns"]
    keep = [i for i, c in enumerate(columns) if c != "seconds"]
    np.testing.assert_array_equal(history[:, keep], b.arrays["history"][:, keep])


def test_resume_continues_the_encoder_decoder_run_bit_for_bit(tmp_path, capsys):
    common = ["train", "--task", "reverse-digits", "--config", "seq2seq-tiny", "--steps", "3",
              "--log-every", "50"]
    assert main([*common, "--out", str(tmp_path / "straight")]) == 0
    assert main([*common, "--until", "1", "--out", str(tmp_path / "halves")]) == 0
    assert main(["train", "--resume", str(tmp_path / "halves" / "checkpoint.npz")]) == 0
    straight = _losses(tmp_path / "straight" / "history.csv")
    assert len(straight) == 3 and _losses(tmp_path / "halves" / "history.csv") == straight


def test_an_interrupted_run_saved_every_tenth_continues_bit_for_bit(tmp_path, text, capsys,
                                                                   monkeypatch):
    """Ctrl-C during step 5 of 10: one line, exit status 130, and the checkpoint of step 4
    (train saves every tenth of the run) continues to the same history as a run that was
    never interrupted."""
    from numpy_tf.training.trainer import Trainer

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert main(_train(text, straight, "--steps", "10")) == 0
    step = Trainer.train_step

    def interrupted(self):
        if self.step == 4:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_status:
        main(_train(text, stopped, "--steps", "10"))
    assert exit_status.value.code == 130
    _one_line(capsys, "numpy-tf train: interrupted at step 4; continue from step 4 with "
              f"numpy-tf train --resume {stopped / 'checkpoint.npz'}")
    monkeypatch.setattr(Trainer, "train_step", step)
    assert main(["train", "--resume", str(stopped / "checkpoint.npz"), "--sample-tokens",
                 "0"]) == 0
    assert _losses(stopped / "history.csv") == _losses(straight / "history.csv")


def test_resume_mistakes_are_one_line(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert main(_train(text, out, "--steps", "4", "--until", "2")) == 0
    capsys.readouterr()
    checkpoint = str(out / "checkpoint.npz")
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper())
    for arguments, message in [
            (["--steps", "8"], "--resume continues a run as it was set up, so --steps cannot "
                               "be given with it"),
            (["--lr", "0.1", "--seed", "2"], "so --lr, --seed cannot be given"),
            (["--text", str(other)], "is not the text the run was trained on"),
            (["--until", "2"], "--until must be in (2, 4]"),
            (["--until", "5"], "--until must be in (2, 4]")]:
        assert main(["train", "--resume", checkpoint, *arguments]) == 2
        _one_line(capsys, message)
    assert main(["train", "--resume", str(tmp_path / "missing.npz")]) == 2
    _one_line(capsys, "not a checkpoint numpy-tf train can continue", "no such .npz file")
    assert main(["train", "--resume", checkpoint]) == 0
    assert main(["train", "--resume", checkpoint]) == 2
    _one_line(capsys, "that run is complete (4 of 4 steps)")


@pytest.mark.parametrize("arguments, message", [
    (["--tokens", "-1"], "--tokens must be a non-negative integer; got -1"),
    (["--seed", "-2"], "--seed must be a non-negative integer; got -2"),
    (["--temperature", "inf"], "temperature must be a number >= 0"),
    (["--temperature", "nan"], "temperature must be a number >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--top-k", "0"], "top_k must be an integer >= 1")])
def test_sample_usage_mistakes_are_one_line(tmp_path, capsys, arguments, message):
    assert main(["sample", str(tmp_path / "x.npz"), "--prompt", "a", *arguments]) == 2
    _one_line(capsys, "numpy-tf sample: ", message)


def test_gradcheck_usage_mistake_is_one_line(capsys):
    """It was NumPy's 'expected non-negative integer', naming no option."""
    assert main(["gradcheck", "gelu", "--seed", "-3"]) == 2
    _one_line(capsys, "numpy-tf gradcheck: ", "--seed must be a non-negative integer; got -3")


@pytest.mark.parametrize("arguments, message", [
    (["--batch", "0"], "--batch must be a positive integer; got 0"),
    (["--seed", "-1"], "--seed must be a non-negative integer; got -1"),
    (["--pad", "-1"], "--pad must be a non-negative integer; got -1"),
    (["--set", "layers=-1"], "layers must be a positive integer; got -1"),
    (["--set", "init_std=NaN"], "init_std must be a number in [0, inf); got nan")])
def test_export_usage_mistakes_are_one_line(tmp_path, capsys, arguments, message):
    out = tmp_path / "case.npz"
    assert main(["export", "--model", "tiny-gpt", *arguments, "-o", str(out)]) == 2
    _one_line(capsys, "numpy-tf export: ", message)
    assert not out.exists()
