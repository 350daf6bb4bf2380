"""The study folder's pictures and `numpy-tf plot`: each figure is drawn with the Agg renderer,
its axes are checked before saving (how many panels, what each panel shows, the tokens on the
ticks), and the saved image is checked (its size in pixels, not blank).

What a panel shows is compared with values computed here, apart from the drawing code: the
attention maps from the model's cache, RoPE's rotation by hand with cos and sin, the
derivatives by finite differences of the drawn functions, the history from the CSV file."""
import csv
import sys

import numpy as np
import pytest

from numpy_tf import GPT, GPTConfig, ByteTokenizer, gradcheck, linear_backward, linear_forward
from numpy_tf.layers.positions import sinusoidal_table
from numpy_tf.models.objectives import TargetLoss
from numpy_tf.study import (attention_maps, plot_activations, plot_attention, plot_gradcheck,
                            plot_loss, plot_norms, plot_rope, plot_sinusoidal, read_history)
from numpy_tf.study.attention import load_attention, save_attention
from numpy_tf.study.figure import token_label
from numpy_tf.training.trainer import Trainer, TrainSettings

matplotlib = pytest.importorskip("matplotlib", reason="the pictures need matplotlib "
                                 "(pip install 'numpy-tf[plot]')")
from matplotlib.image import imread  # noqa: E402

TOKENIZER = ByteTokenizer()
TEXT = "The cat sat."
CONFIG = GPTConfig.gpt2(vocab_size=TOKENIZER.vocab_size, max_context=16, width=16, heads=4,
                        layers=2)


def _pieces(ids) -> list[str]:
    return [TOKENIZER.decode([int(t)]) for t in ids]


@pytest.fixture(scope="module")
def forward():
    """(maps, tokens, model, ids) of a small GPT on TEXT."""
    model = GPT(CONFIG, rng=0)
    ids = TOKENIZER.encode(TEXT)[None]
    _, cache = model.forward(ids)
    return attention_maps(cache), _pieces(ids[0]), model, ids


def check_image(path, figure, min_std: float = 5.0) -> np.ndarray:
    """The PNG at `path` has the figure's size at 150 dots per inch and is not blank."""
    pixels = imread(path)
    width, height = figure.get_size_inches() * 150
    assert abs(pixels.shape[1] - width) <= 2 and abs(pixels.shape[0] - height) <= 2
    gray = pixels[..., :3].mean(axis=-1) * 255
    assert gray.std() > min_std, f"{path} looks blank (std {gray.std():.2f})"
    return pixels


def ticks(labels) -> list[str]:
    return [label.get_text() for label in labels]


# -- attention --------------------------------------------------------------------------------
def test_attention_panels_show_each_layer_and_head_with_the_tokens(forward, tmp_path):
    maps, tokens, _, _ = forward
    figure = plot_attention(maps, tokens, path=tmp_path / "a.png")
    panels, colorbar = figure.axes[:-1], figure.axes[-1]
    assert len(panels) == 2 * 4 and colorbar.get_ylabel() == "attention probability"
    for index, axes in enumerate(panels):
        layer, head = divmod(index, 4)
        assert axes.get_title() == f"layer {layer}, head {head}"
        # rows are the queries, columns the keys: the image is the map itself, not transposed
        np.testing.assert_array_equal(axes.images[0].get_array(), maps[layer][0, head])
        assert ticks(axes.get_xticklabels()) == [token_label(t) for t in tokens]
        assert ticks(axes.get_yticklabels()) == [token_label(t) for t in tokens]
    assert ticks(panels[0].get_xticklabels())[:4] == ["T", "h", "e", "␣"]
    check_image(tmp_path / "a.png", figure)


def test_attention_chooses_layers_and_heads_and_names_the_queries_of_a_cached_step(forward):
    maps, tokens, model, ids = forward
    figure = plot_attention(maps, tokens, layers=[1], heads=[2, 0])
    assert [axes.get_title() for axes in figure.axes[:-1]] == ["layer 1, head 2",
                                                                "layer 1, head 0"]
    # one decoding step with the KV cache: the newest token queries every key; its map is the
    # last row of the full forward's map
    _, prompt_cache = model.forward(ids[:, :-1])
    _, step_cache = model.forward(ids[:, -1:], past_kv=prompt_cache.present)
    step = attention_maps(step_cache)                                    # (B, H, 1, T) each
    np.testing.assert_allclose(step[0], maps[0][:, :, -1:], rtol=1e-12, atol=1e-15)
    figure = plot_attention(step, tokens, layers=[0], heads=[0])
    assert ticks(figure.axes[0].get_yticklabels()) == [token_label(tokens[-1])]
    assert ticks(figure.axes[0].get_xticklabels()) == [token_label(t) for t in tokens]


def test_cross_attention_takes_its_own_query_tokens():
    probs = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 3))   # (H, Tq, Tk)
    figure = plot_attention(probs, list("abcde"), query_tokens=["x", "y", "z"])
    assert ticks(figure.axes[0].get_yticklabels()) == ["x", "y", "z"]
    assert ticks(figure.axes[0].get_xticklabels()) == list("abcde")
    figure = plot_attention(probs)                        # no tokens: positions
    assert ticks(figure.axes[0].get_xticklabels()) == ["0", "1", "2", "3", "4"]


def test_token_labels_never_blank_or_two_lines():
    assert [token_label(t) for t in [" Paris", "\n", "\t", "$x$", ""]] == \
        ["␣Paris", "\\n", "\\t", "\\$x\\$", ""]


def test_attention_bad_input_is_refused_before_drawing(forward, tmp_path):
    maps, tokens, _, _ = forward
    with pytest.raises(ValueError, match="tokens must hold one token per position, 12; got 3"):
        plot_attention(maps, tokens[:3])
    with pytest.raises(ValueError, match=r"layers must be indices in \[0, 2\); got \[5\]"):
        plot_attention(maps, tokens, layers=[5])
    with pytest.raises(ValueError, match=r"heads must be indices in \[0, 4\)"):
        plot_attention(maps, tokens, heads=[4])
    with pytest.raises(ValueError, match="path must end in .png or .svg"):
        plot_attention(maps, tokens, path=tmp_path / "a.jpg")
    with pytest.raises(ValueError, match="pass a list of layers"):
        plot_attention(np.stack(maps), tokens)
    with pytest.raises(TypeError, match="maps must be attention_maps"):
        plot_attention("maps")
    assert not list(tmp_path.iterdir())


def test_saved_attention_reads_back_with_its_tokens(forward, tmp_path):
    maps, tokens, _, _ = forward
    save_attention(tmp_path / "a.npz", maps, [" x\n"] + tokens[1:])
    loaded, saved = load_attention(tmp_path / "a.npz")
    assert saved == [" x\n"] + tokens[1:] and len(loaded) == 2
    for ours, theirs in zip(loaded, maps):
        np.testing.assert_array_equal(ours, theirs[0])
    np.save(tmp_path / "one.npy", maps[1][0])
    loaded, saved = load_attention(tmp_path / "one.npy")
    assert saved is None and np.array_equal(loaded[0], maps[1][0])


def test_svg_by_suffix(forward, tmp_path):
    maps, tokens, _, _ = forward
    plot_attention(maps, tokens, layers=[0], heads=[0], path=tmp_path / "a.svg")
    text = (tmp_path / "a.svg").read_text()
    assert text.startswith("<?xml") and "<svg" in text and "layer 0, head 0" in text


# -- a run ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 12-step run of a small GPT with evaluation every 4 steps, its history written."""
    stream = np.random.default_rng(0).integers(0, 12, 300)
    config = GPTConfig.gpt2(vocab_size=12, max_context=6, width=8, heads=2, layers=2)
    settings = TrainSettings(steps=12, batch_size=3, lr=1e-2, warmup=2, eval_every=4)

    def sample_batch(rng):
        windows = np.stack([stream[s:s + 7] for s in rng.integers(0, 290, 3)])
        return windows[:, :-1], windows[:, 1:]

    trainer = Trainer(TargetLoss(GPT(config, rng=1)), sample_batch, settings,
                      eval_batches=[sample_batch(np.random.default_rng(5))])
    trainer.run(log=lambda line: None)
    folder = tmp_path_factory.mktemp("run")
    trainer.write_history(folder / "history.csv")
    return folder, trainer


def test_history_reads_every_column(run):
    folder, trainer = run
    history = read_history(folder)
    assert list(history["loss"]) == [row["loss"] for row in trainer.history]
    assert np.isnan(history["eval_loss"][0]) and history["eval_loss"][3] == \
        trainer.history[3]["eval_loss"]
    assert "update_norm:blocks.1" in history


def test_loss_plot_shows_train_and_held_out(run, tmp_path):
    folder, trainer = run
    figure = plot_loss(folder / "history.csv", path=tmp_path / "loss.png")
    (axes,) = figure.axes
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert set(lines) == {"training"} | {"held out"}
    np.testing.assert_array_equal(lines["training"].get_ydata(),
                                  [row["loss"] for row in trainer.history])
    evals = [(row["step"], row["eval_loss"]) for row in trainer.history if "eval_loss" in row]
    assert list(zip(lines["held out"].get_xdata(), lines["held out"].get_ydata())) == evals
    assert [step for step, _ in evals] == [4, 8, 12]
    assert axes.get_xlabel() == "step" and "loss" in axes.get_ylabel()
    check_image(tmp_path / "loss.png", figure)


def test_a_long_run_adds_its_running_mean():
    steps = np.arange(1, 101, dtype=float)
    loss = 3.0 / np.sqrt(steps) + np.random.default_rng(0).normal(0, 0.05, 100)
    figure = plot_loss({"step": steps, "loss": loss})
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert labels == ["training batch", "training, mean of 4 steps around each"]
    mean = figure.axes[0].get_lines()[1].get_ydata()
    assert mean[0] == pytest.approx(loss[:2].mean())                # steps 1, 2 (at the start)
    assert mean[50] == pytest.approx(loss[48:52].mean())            # steps 49 .. 52
    assert mean[-1] == pytest.approx(loss[-3:].mean())             # 98 .. 100 (at the end)


def test_norms_plot_one_line_per_group(run, tmp_path):
    folder, trainer = run
    figure = plot_norms(folder, path=tmp_path / "norms.png")
    assert len(figure.axes) == 2
    groups = ["tokens", "positions", "blocks.0", "blocks.1", "final_norm"]
    for axes, kind in zip(figure.axes, ("grad_norm", "update_norm")):
        assert axes.get_yscale() == "log"
        assert [line.get_label() for line in axes.get_lines()] == groups
        for line, group in zip(axes.get_lines(), groups):
            np.testing.assert_array_equal(line.get_ydata(),
                                          [row[f"{kind}:{group}"] for row in trainer.history])
    check_image(tmp_path / "norms.png", figure)


def test_norms_of_an_old_history_say_what_is_missing(tmp_path):
    with open(tmp_path / "history.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["step", "loss"], [1, 2.0]])
    with pytest.raises(ValueError, match="no grad_norm:<group> and update_norm:<group> columns"):
        plot_norms(tmp_path)
    with pytest.raises(FileNotFoundError, match="no history file"):
        read_history(tmp_path / "nowhere")


@pytest.mark.parametrize("plot", [plot_loss, plot_norms])
@pytest.mark.parametrize("history, error, message", [
    ([1.0, 2.0], TypeError, "history must be read_history's dict, a history.csv or a run "
                            "folder; got list"),
    (None, TypeError, "got NoneType"),
    ({}, ValueError, "history must hold the columns step.* .*got no columns"),
    ({"loss": [1.0, 0.5]}, ValueError, "got 'loss'"),
    ({"step": [1, 2, 3], "loss": [1.0, 0.5]}, ValueError,
     r"history\['loss'\] must be one number per step, as step \(3,\); got shape \(2,\)"),
    ({"step": [1, 2], "loss": ["a", "b"]}, TypeError, r"history\['loss'\] must be numbers"),
])
def test_a_history_that_is_not_one_is_refused_by_name(plot, history, error, message):
    """These were NumPy's or Python's own errors: KeyError 'step', 'path must be a file path'
    (an argument the caller did not pass), a shape mismatch inside matplotlib."""
    with pytest.raises(error, match=message):
        plot(history)


def test_a_picture_path_or_range_of_the_wrong_kind_is_refused_by_name():
    history = {"step": [1, 2, 3], "loss": [2.0, 1.5, 1.2]}
    assert plot_loss(history) is not None                   # lists of numbers are a history
    with pytest.raises(TypeError, match="path must be None or a file path ending in .png or "
                                        ".svg; got int"):
        plot_loss(history, path=3)
    with pytest.raises(TypeError, match="low must be a real number; got None"):
        plot_activations(None)


# -- positions --------------------------------------------------------------------------------
def test_sinusoidal_plot_shows_the_table(tmp_path):
    figure = plot_sinusoidal(40, 16, path=tmp_path / "s.png")
    table, curves, colorbar = figure.axes
    np.testing.assert_array_equal(table.images[0].get_array(), sinusoidal_table(40, 16))
    t = np.arange(40)
    for line in curves.get_lines():
        feature = int(line.get_label().split(", ")[1].split(")")[0])         # PE(t, 2i)
        np.testing.assert_allclose(line.get_ydata(),
                                   np.sin(t / 10000 ** (feature / 16)), atol=1e-12)
    assert len(curves.get_lines()) >= 2 and table.get_ylabel() == "position t"
    check_image(tmp_path / "s.png", figure)


@pytest.mark.parametrize("head_dim", [4, 8])
def test_rope_plot_rotates_each_pair_in_both_layouts(head_dim, tmp_path):
    vector = np.random.default_rng(1).standard_normal(head_dim)
    figure = plot_rope(head_dim, 10, vector=vector, path=tmp_path / "r.png")
    half = head_dim // 2
    assert len(figure.axes) == 2 * (half + 1) + 1                   # + the colour bar
    grid = np.array(figure.axes[:-1]).reshape(2, half + 1)
    t = np.arange(10)
    for row, pair_of in ((0, lambda i: (2 * i, 2 * i + 1)), (1, lambda i: (i, i + half))):
        for i in range(half):
            first, second = pair_of(i)
            angle = t * 10000.0 ** (-2 * i / head_dim)
            a, b = vector[first], vector[second]
            expected = np.stack([a * np.cos(angle) - b * np.sin(angle),
                                 a * np.sin(angle) + b * np.cos(angle)], axis=1)
            points = grid[row, i + 1].collections[0].get_offsets()
            np.testing.assert_allclose(points, expected, atol=1e-12)
            assert f"(x{first}, x{second})" in grid[row, i + 1].get_title()
    assert grid[0, 0].get_title().startswith("interleaved")
    assert grid[1, 0].get_title().startswith("halves")
    check_image(tmp_path / "r.png", figure)


def test_position_plots_refuse_bad_sizes():
    with pytest.raises(ValueError, match="width"):
        plot_sinusoidal(8, 5)
    with pytest.raises(ValueError, match="head_dim"):
        plot_rope(7)
    with pytest.raises(ValueError, match=r"vector must have shape \(8,\)"):
        plot_rope(8, vector=np.ones(4))


# -- activations and gradients ----------------------------------------------------------------
def test_activation_derivatives_are_the_slopes_of_the_drawn_functions(tmp_path):
    figure = plot_activations(path=tmp_path / "act.png")
    values, slopes = [[line for line in axes.get_lines() if not line.get_label().startswith("_")]
                      for axes in figure.axes]           # the curves, not the x and y axes
    assert len(values) == len(slopes) == 4
    for f, df in zip(values, slopes):
        x, y = f.get_xdata(), f.get_ydata()
        away = np.abs(x) > 0.05                                  # ReLU's kink at 0
        numerical = np.gradient(y, x)
        np.testing.assert_allclose(df.get_ydata()[away][1:-1], numerical[away][1:-1],
                                   atol=1e-3, err_msg=f.get_label())
    assert [line.get_label() for line in slopes] == ["GELU", "GELU (tanh)", "SiLU", "ReLU"]
    check_image(tmp_path / "act.png", figure)


def test_gradcheck_picture_one_bar_per_tensor_failures_in_red(tmp_path):
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((3, 4)), "weight": rng.standard_normal((2, 4)),
              "bias": rng.standard_normal(2)}

    def wrong_backward(dout, cache):                 # dweight off by 0.1 %
        dx, dweight, dbias = linear_backward(dout, cache)
        return dx, dweight * 1.001, dbias

    report = gradcheck(linear_forward, wrong_backward, inputs)
    figure = plot_gradcheck(report, path=tmp_path / "g.png")
    (axes,) = figure.axes
    row_of = dict(zip(axes.get_yticks(), ticks(axes.get_yticklabels())))
    assert [row_of[y] for y in sorted(row_of, reverse=True)] == [
        "x (3, 4)", "weight (2, 4)", "bias (2,)"]                    # the report's order, top down
    bars = {row_of[bar.get_y() + bar.get_height() / 2]: bar for bar in axes.patches}
    assert bars["weight (2, 4)"].get_width() == pytest.approx(report.rows[1].norm_rel_error)
    assert bars["weight (2, 4)"].get_width() == pytest.approx(1e-3, rel=1e-3)
    red, green = matplotlib.colors.to_rgba("tab:red"), matplotlib.colors.to_rgba("tab:green")
    assert bars["weight (2, 4)"].get_facecolor()[:3] == red[:3]
    assert bars["x (3, 4)"].get_facecolor()[:3] == green[:3]
    texts = [text.get_text() for text in axes.texts]                 # top down
    assert texts == ["pass", "FAIL", "pass"] and "1 of 3 FAILED" in axes.get_title()
    check_image(tmp_path / "g.png", figure)


def test_without_matplotlib_the_error_names_the_extra(monkeypatch, forward):
    maps, tokens, _, _ = forward
    for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'numpy-tf\[plot\]'"):
        plot_attention(maps, tokens)


# -- numpy-tf plot ----------------------------------------------------------------------------
def _main(*argv):
    from numpy_tf.cli.commands import main
    return main(list(argv))


@pytest.mark.parametrize("kind", [["sinusoidal", "--length", "16", "--width", "8"],
                                  ["rope", "--head-dim", "4", "--positions", "6"],
                                  ["activations"],
                                  ["gradcheck", "layernorm"]])
def test_plot_command_draws_each_kind(kind, tmp_path, capsys):
    assert _main("plot", *kind, "-o", str(tmp_path / "p.png")) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'p.png'}: ")
    assert imread(tmp_path / "p.png")[..., :3].std() > 0.02


def test_plot_command_draws_a_run(run, tmp_path, capsys):
    folder, _ = run
    assert _main("plot", "loss", str(folder), "-o", str(tmp_path / "l.svg")) == 0
    assert "<svg" in (tmp_path / "l.svg").read_text()
    assert _main("plot", "norms", str(folder / "history.csv"), "-o",
                 str(tmp_path / "n.png")) == 0
    assert (tmp_path / "n.png").stat().st_size > 10_000


def test_plot_command_draws_saved_attention(forward, tmp_path, capsys):
    maps, tokens, _, _ = forward
    np.save(tmp_path / "one.npy", maps[0][0])
    assert _main("plot", "attention", str(tmp_path / "one.npy"), "--tokens",
                 " ".join("abcdefghijkl"), "-o", str(tmp_path / "a.png")) == 0
    assert "4 panels" in capsys.readouterr().out
    save_attention(tmp_path / "all.npz", maps * 3, tokens)            # six layers
    assert _main("plot", "attention", str(tmp_path / "all.npz"), "-o",
                 str(tmp_path / "b.png")) == 2
    error = capsys.readouterr().err
    assert "holds 6 layers" in error and "--layers 0,3,5" in error
    assert not (tmp_path / "b.png").exists()
    assert _main("plot", "attention", str(tmp_path / "all.npz"), "--layers", "0,5",
                 "--heads", "1", "-o", str(tmp_path / "b.png")) == 0
    assert "layers 0, 5, 2 panels" in capsys.readouterr().out
    assert _main("plot", "attention", str(tmp_path / "one.npy"), "--tokens", '["a", "b"]',
                 "-o", str(tmp_path / "c.png")) == 2
    assert "tokens must hold one token per position, 12; got 2" in capsys.readouterr().err
    assert _main("plot", "activations", "-o", str(tmp_path / "d.gif")) == 2
    assert "path must end in .png or .svg" in capsys.readouterr().err


def test_train_writes_its_loss_plot_and_plot_reads_its_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert _main("train", "--config", "tiny-gpt", "--steps", "4", "--batch-size", "2",
                 "--out", str(out), "--sample-tokens", "2") == 0
    assert f"loss plot {out / 'loss.png'}" in capsys.readouterr().out
    assert imread(out / "loss.png").shape[1] > 500
    assert _main("plot", "attention", str(out / "checkpoint.npz"), "--prompt", "Anna",
                 "-o", str(tmp_path / "a.png")) == 0
    assert "layers 0, 1, 8 panels" in capsys.readouterr().out
    assert _main("plot", "attention", str(out / "checkpoint.npz"), "-o",
                 str(tmp_path / "a.png")) == 2
    assert "give the text to look at with --prompt" in capsys.readouterr().err
    assert _main("plot", "attention", str(out / "checkpoint.npz"), "--prompt", "x" * 9,
                 "-o", str(tmp_path / "a.png")) == 2
    assert "9 tokens, more than the model's max_context = 8" in capsys.readouterr().err


def test_train_without_matplotlib_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "run"
    assert _main("train", "--config", "tiny-gpt", "--steps", "2", "--batch-size", "2",
                 "--out", str(out), "--sample-tokens", "2") == 0
    printed = capsys.readouterr().out
    assert [line for line in printed.splitlines() if "loss plot" in line] == [
        "no loss plot: matplotlib is absent (pip install 'numpy-tf[plot]')"]
    assert not (out / "loss.png").exists() and (out / "history.csv").is_file()
    assert _main("plot", "activations", "-o", str(tmp_path / "a.png")) == 2
    assert "pip install 'numpy-tf[plot]'" in capsys.readouterr().err


def test_smollm2_attention_through_generate_and_plot(smollm2, tmp_path, capsys, monkeypatch):
    """generate --save-attention FILE.npz keeps every layer and the tokens; plot draws them.
    The weights are the session's SmolLM2 (read once for every test that needs them): the
    command builds its model from them as always, without reading the file again."""
    from numpy_tf.interop import pretrained

    monkeypatch.setattr(pretrained, "load_gguf", lambda *args, **kwargs: smollm2)
    monkeypatch.setattr(pretrained, "fetch_smollm2", lambda *args, **kwargs: None)
    assert _main("generate", "--prompt", "The capital of France is", "--tokens", "2",
                 "--save-attention", str(tmp_path / "a.npz")) == 0
    assert "every layer's attention probabilities and the tokens" in capsys.readouterr().err
    maps, tokens = load_attention(tmp_path / "a.npz")
    assert len(maps) == 30 and maps[0].shape == (9, 7, 7)          # 5 prompt tokens + 2
    assert tokens[:3] == ["The", " capital", " of"] and tokens[5] == " Paris"
    np.testing.assert_array_equal(np.triu(maps[29], 1), 0.0)              # causal
    assert _main("plot", "attention", str(tmp_path / "a.npz"), "--layers", "29", "-o",
                 str(tmp_path / "a.png")) == 0
    assert "9 panels" in capsys.readouterr().out
    assert _main("generate", "--prompt", "x", "--save-attention", str(tmp_path / "a.npy")) == 2
    assert "give one, or save every layer" in capsys.readouterr().err
