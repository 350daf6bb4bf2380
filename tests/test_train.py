"""Training: exact resume, stopping on non-finite values, history, and checkpoints."""
import csv

import numpy as np
import pytest

from numpy_tf.core.npz import load_npz, save_npz
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.models.objectives import TargetLoss
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint
from numpy_tf.training.trainer import Trainer, TrainingStopped, TrainSettings, progress_line

CONFIG = GPTConfig.gpt2(vocab_size=12, max_context=6, width=8, heads=2, layers=1)
SETTINGS = TrainSettings(steps=10, batch_size=3, lr=1e-2, min_lr=1e-3, warmup=2,
                         eval_every=5, log_every=5)
STREAM = np.random.default_rng(0).integers(0, 12, 200)


def sample_batch(rng):
    starts = rng.integers(0, len(STREAM) - 7, SETTINGS.batch_size)
    windows = np.stack([STREAM[s:s + 7] for s in starts])
    return windows[:, :-1], windows[:, 1:]


def _trainer(dtype=np.float64, **kwargs):
    model = GPT(CONFIG, rng=3, dtype=dtype)
    return Trainer(TargetLoss(model), sample_batch, SETTINGS,
                   eval_batches=[sample_batch(np.random.default_rng(9))], **kwargs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ten_steps_equal_five_save_load_five_bit_for_bit(tmp_path, dtype):
    straight = _trainer(dtype)
    straight.run(10, log=lambda line: None)
    first = _trainer(dtype, checkpoint_path=tmp_path / "c.npz")
    first.run(5, log=lambda line: None)
    resumed = Trainer.resume(load_checkpoint(tmp_path / "c.npz"), TargetLoss, sample_batch,
                             eval_batches=[sample_batch(np.random.default_rng(9))])
    assert resumed.step == 5
    resumed.run(10, log=lambda line: None)
    for (name, a), b in zip(straight.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert a.dtype == dtype and a.tobytes() == b.tobytes(), name
    assert [r["loss"] for r in straight.history[5:]] == [r["loss"] for r in resumed.history]


def test_loss_falls_and_history_is_written(tmp_path):
    trainer = _trainer()
    lines = []
    trainer.run(log=lines.append)
    assert trainer.history[-1]["loss"] < trainer.history[0]["loss"]
    assert "eval_loss" in trainer.history[4] and len(lines) == 2
    assert "tok/s" in lines[0] and "left" in lines[0] and "eval" in lines[0]
    trainer.write_history(tmp_path / "h.csv")
    rows = list(csv.DictReader(open(tmp_path / "h.csv")))
    assert len(rows) == 10 and float(rows[0]["loss"]) == trainer.history[0]["loss"]


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tmp_path):
    trainer = _trainer(checkpoint_path=tmp_path / "c.npz")
    trainer.run(3, log=lambda line: None)             # writes the checkpoint at step 3
    saved = (tmp_path / "c.npz").read_bytes()
    trainer.model.blocks[0].norm1.weight.data[0] = np.nan
    with pytest.raises(TrainingStopped, match=r"step 4: the loss is nan; training stopped and "
                                              r"the last good checkpoint, .*c.npz \(step 3\), "
                                              r"is intact"):
        trainer.run(10, log=lambda line: None)
    assert (tmp_path / "c.npz").read_bytes() == saved


def test_non_finite_gradient_stops_too():
    class Poisoned(TargetLoss):
        def backward(self, dloss, cache):
            out = super().backward(dloss, cache)
            self.model.blocks[0].attention.qkv.weight.grad[0, 0] = np.inf
            return out

    trainer = Trainer(Poisoned(GPT(CONFIG)), sample_batch, SETTINGS)
    before = trainer.model.blocks[0].attention.qkv.weight.data.copy()
    with pytest.raises(TrainingStopped, match="step 1: the gradient of "
                                              "blocks.0.attention.qkv.weight is not finite"):
        trainer.run(1, log=lambda line: None)
    np.testing.assert_array_equal(trainer.model.blocks[0].attention.qkv.weight.data, before)


def test_overflow_in_the_forward_is_reported_not_warned():
    trainer = _trainer()
    trainer.model.tokens.weight.data[:] = 1e308
    with pytest.raises(TrainingStopped, match="step 1: the loss is nan"):
        trainer.run(1, log=lambda line: None)


def test_checkpoint_loading_is_strict(tmp_path):
    model = GPT(CONFIG)
    save_checkpoint(tmp_path / "c.npz", model, step=7)
    loaded = load_checkpoint(tmp_path / "c.npz")
    assert loaded.step == 7 and loaded.generator() is None
    arrays = load_npz(tmp_path / "c.npz")
    del arrays["param/final_norm.bias"]
    arrays["param/extra"] = np.zeros(2)
    arrays["param/tokens.weight"] = arrays["param/tokens.weight"][:, :4]
    save_npz(tmp_path / "bad.npz", arrays)
    with pytest.raises(ValueError) as error:
        load_checkpoint(tmp_path / "bad.npz")
    message = str(error.value)
    assert "missing keys: final_norm.bias" in message and "unexpected keys: extra" in message
    assert "tokens.weight: expected shape (12, 8), got (12, 4)" in message
    save_npz(tmp_path / "other.npz", {"x": np.zeros(1)})
    with pytest.raises(ValueError, match="not a numpy_tf checkpoint"):
        load_checkpoint(tmp_path / "other.npz")


def test_progress_line():
    line = progress_line({"step": 30, "loss": 1.23456, "lr": 0.001, "eval_loss": 1.5}, 100,
                         12345.6, 75.2)
    assert line == ("step    30/100  loss 1.2346  lr 1.00e-03  12,346 tok/s  1:16 left"
                    "  eval 1.5000")


def test_parameter_groups_are_the_blocks_and_the_other_modules():
    from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
    from numpy_tf.training.trainer import parameter_groups

    groups = parameter_groups(GPT(CONFIG))
    assert list(groups) == ["tokens", "positions", "blocks.0", "final_norm"]
    assert groups["blocks.0"][0] == "blocks.0.norm1.weight" and len(groups["blocks.0"]) == 12
    seq2seq = Seq2Seq(Seq2SeqConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=8, nhead=2,
                                    num_encoder_layers=2, num_decoder_layers=1,
                                    dim_feedforward=8, dropout=0.0))
    assert list(parameter_groups(seq2seq)) == [
        "src_embedding", "tgt_embedding", "transformer.encoder.layers.0",
        "transformer.encoder.layers.1", "transformer.encoder.norm",
        "transformer.decoder.layers.0", "transformer.decoder.norm", "output"]


def test_history_holds_each_groups_gradient_and_update_norm(tmp_path):
    """Measured apart from the Trainer: the gradient of one step's batch through a fresh copy
    of the model, and the parameters before and after the step."""
    trainer = _trainer()
    twin = _trainer()                                   # the same model and batches
    before = {name: value.copy() for name, value in trainer.model.state_dict().items()}
    batch = twin.sample_batch(twin.rng)
    loss, cache = twin.objective.forward(*batch)
    twin.objective.backward(1.0, cache)
    trainer.run(1, log=lambda line: None)
    row = trainer.history[0]
    assert row["loss"] == float(loss)
    after = trainer.model.state_dict()
    for group in ("tokens", "positions", "blocks.0", "final_norm"):
        names = [n for n, _ in twin.model.named_parameters() if n == group or
                 n.startswith(group + ".")]
        grads = [dict(twin.model.named_parameters())[n].grad for n in names]
        assert row[f"grad_norm:{group}"] == pytest.approx(
            np.sqrt(sum(np.sum(g ** 2) for g in grads)), rel=1e-12)
        moved = np.sqrt(sum(np.sum((after[n] - before[n]) ** 2) for n in names))
        assert moved > 0 and row[f"update_norm:{group}"] == pytest.approx(moved, rel=1e-12)
    groups = [row[key] for key in row if key.startswith("grad_norm:")]
    assert row["grad_norm"] == pytest.approx(np.sqrt(np.sum(np.square(groups))), rel=1e-12)
    trainer.write_history(tmp_path / "h.csv")
    header = next(csv.reader(open(tmp_path / "h.csv")))
    assert header[:7] == ["step", "loss", "lr", "grad_norm", "tokens", "seconds", "eval_loss"]
    assert header[7:] == [f"{kind}:{group}" for kind in ("grad_norm", "update_norm")
                          for group in ("tokens", "positions", "blocks.0", "final_norm")]
