"""numpy-tf export and numpy-tf compare: a case file holds numbers that check out independently,
and compare names the first tensor in forward order that differs."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.compare import SEARCH_ORDER, compare_files
from numpy_tf.checking.export import EXPORTS, ORDER, export_case
from numpy_tf.cli.commands import main
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.models.objectives import NextTokenLoss


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("case") / "tiny.npz"
    export_case("tiny-gpt", seed=4).save(path)
    return path


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_keys_come_in_the_documented_order(tiny):
    keys = list(Case.load(tiny).arrays)
    sections = [key.split("/")[0] for key in keys]
    order = [entry.split("/")[0].split(" ")[0] for entry in ORDER[1:]]
    assert sections == sorted(sections, key=order.index)
    acts = [key[4:] for key in keys if key.startswith("act/")]
    grad_acts = [key[9:] for key in keys if key.startswith("grad_act/")]
    assert acts[:4] == ["tokens", "positions", "blocks.0.norm1", "blocks.0.attention.qkv"]
    assert grad_acts == acts[::-1]          # the GPT's backward is its exact reverse


def test_loss_logits_and_gradients_check_out_independently(tiny):
    case = Case.load(tiny)
    ids = case.arrays["input/ids"]
    logits = case.arrays["output/logits"]
    # the loss by hand: mean -log p(ids[t + 1]) over the first T - 1 positions
    picked = np.take_along_axis(_log_softmax(logits[:, :-1]), ids[:, 1:, None], axis=-1)
    assert float(case.arrays["loss"]) == pytest.approx(-picked.mean(), rel=1e-13)
    # dL/dlogits by hand: (softmax - one_hot) / count, zero at the last position
    count = ids[:, 1:].size
    expected = np.exp(_log_softmax(logits))
    expected[:, :-1] -= np.eye(20)[ids[:, 1:]]
    expected[:, -1] = 0.0
    np.testing.assert_allclose(case.arrays["grad_act/output"], expected / count, atol=1e-15)
    # the head has no bias: dL/d(final_norm output) = dL/dlogits W
    np.testing.assert_allclose(case.arrays["grad_act/final_norm"],
                               case.arrays["grad_act/output"] @ case.arrays["param/output.weight"],
                               rtol=1e-12, atol=1e-16)
    np.testing.assert_array_equal(case.arrays["act/output"], logits)
    # the parameter gradients: a directional finite difference of the loss
    model = GPT(GPTConfig.tiny(**case.meta["config"]))
    model.load_state_dict(case.section("param"))
    objective, g = NextTokenLoss(model), np.random.default_rng(0)
    directions = {name: g.standard_normal(p.shape) for name, p in model.named_parameters()}
    predicted = sum(float((case.arrays[f"grad/{name}"] * v).sum())
                    for name, v in directions.items())
    losses = []
    for sign in (1.0, -1.0):
        for name, p in model.named_parameters():
            p.data[...] = case.arrays[f"param/{name}"] + sign * 1e-6 * directions[name]
        losses.append(float(objective.forward(ids)[0]))
    assert (losses[0] - losses[1]) / 2e-6 == pytest.approx(predicted, rel=1e-7)


def test_meta_states_every_convention(tiny):
    meta = Case.load(tiny).meta
    assert meta["numpy_tf"] and meta["seed"] == 4 and meta["dtype"] == "float64"
    conventions = meta["conventions"]
    for key in ("gelu", "rope", "layernorm", "attention", "key_padding_mask", "dtype", "act",
                "linear_weight_layout", "tied", "dropout"):
        assert conventions[key], key
    assert "erf" in conventions["gelu"] and "eps = 1e-05" in conventions["layernorm"]
    assert meta["loss"]["name"] == "next_token_cross_entropy" and meta["order"] == ORDER
    assert meta["config"]["width"] == 16 and meta["init_std"] == pytest.approx(0.3)


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    for name in ("a", "b"):
        export_case("gpt2", "gpt2-tiny", {"layers": 1}, seed=9, pad=2).save(tmp_path / name)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    other = export_case("gpt2", "gpt2-tiny", {"layers": 1}, seed=10, pad=2)
    assert not np.array_equal(other.arrays["param/tokens.weight"],
                              Case.load(tmp_path / "a").arrays["param/tokens.weight"])


@pytest.mark.parametrize("model", list(EXPORTS))
def test_every_model_exports_in_float32(model):
    case = export_case(model, dtype="float32", seed=1)
    floats = {key: a.dtype for key, a in case.arrays.items() if a.dtype.kind == "f"}
    assert set(floats.values()) == {np.dtype(np.float32)}
    assert set(case.section("act")) == set(case.section("grad_act"))
    assert np.isfinite(case.arrays["loss"]) and float(case.arrays["loss"]) > 0
    assert all(np.isfinite(a).all() for a in case.arrays.values() if a.dtype.kind == "f")


def test_a_module_called_twice_pairs_each_gradient_with_its_call():
    """The encoder-decoder adds its sinusoids twice (source, then target): positions#2 is the
    target side's, and its gradient is the one reaching the target embedding (the sinusoids'
    backward is the identity)."""
    case = export_case("transformer", seed=3)
    a = case.arrays
    np.testing.assert_array_equal(a["act/positions#2"].shape[1],
                                  a["input/decoder_input"].shape[1])
    np.testing.assert_array_equal(a["grad_act/positions#2"], a["grad_act/tgt_embedding"])
    np.testing.assert_array_equal(a["grad_act/positions"], a["grad_act/src_embedding"])


def test_compare_a_case_with_itself_gives_zeros(tiny, capsys):
    result = compare_files(tiny, tiny)
    assert result.passed and result.first_divergence is None
    assert all(row.comparison.max_abs_error == 0.0 for row in result.rows)
    assert len(result.rows) == len(Case.load(tiny).arrays)
    assert main(["compare", str(tiny), str(tiny)]) == 0
    assert "every shared tensor agrees" in capsys.readouterr().out


def test_compare_names_the_perturbed_activation_not_a_later_one(tiny, tmp_path, capsys):
    """Perturb one activation in the middle of block 1 and everything after it: the first in
    forward order is named, though the logits, loss and gradients differ too."""
    case = Case.load(tiny)
    acts = [key for key in case.arrays if key.startswith("act/")]
    middle = acts.index("act/blocks.1.feedforward.1")
    for key in acts[middle:] + ["output/logits", "loss", "grad/tokens.weight",
                                "grad_act/blocks.0"]:
        case.arrays[key] = case.arrays[key] * (1 + 1e-6) + 1e-6
    theirs = tmp_path / "theirs.npz"
    case.save(theirs)
    result = compare_files(tiny, theirs)
    assert result.first_divergence.comparison.key == "act/blocks.1.feedforward.1"
    assert not result.passed
    assert main(["compare", str(tiny), str(theirs)]) == 1
    out = capsys.readouterr().out
    assert "first divergence: act/blocks.1.feedforward.1" in out
    assert main(["compare", str(tiny), str(theirs), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["first_divergence"] == "act/blocks.1.feedforward.1" and not data["passed"]
    assert [row["key"] for row in data["tensors"] if not row["passed"]][0] == \
        "act/blocks.1.feedforward.1"


def test_the_search_order_goes_forward_then_backward(tiny, tmp_path):
    """Only a parameter gradient and an activation gradient differ: the activation gradient,
    nearer the loss in the backward pass, is named first."""
    case = Case.load(tiny)
    case.arrays["grad/blocks.0.norm1.weight"] = case.arrays["grad/blocks.0.norm1.weight"] + 1e-3
    case.arrays["grad_act/blocks.0.norm2"] = case.arrays["grad_act/blocks.0.norm2"] + 1e-3
    theirs = tmp_path / "theirs.npz"
    case.save(theirs)
    result = compare_files(tiny, theirs)
    assert result.first_divergence.comparison.key == "grad_act/blocks.0.norm2"
    keys = [row.comparison.key.split("/")[0] for row in result.rows]
    assert keys == sorted(keys, key=SEARCH_ORDER.index)


def test_one_sided_tensors_shapes_and_plain_npz_files(tiny, tmp_path, capsys):
    arrays = dict(np.load(tiny, allow_pickle=False))
    del arrays["meta"], arrays["act/tokens"]
    arrays["act/mine_only"] = np.zeros(3)
    arrays["grad/output.weight"] = arrays["grad/output.weight"].T.copy()
    arrays["output/logits"] = arrays["output/logits"].astype(np.float32)
    plain = tmp_path / "plain.npz"
    np.savez(plain, **arrays)                       # what a C or Rust user might write
    result = compare_files(tiny, plain)
    assert result.only_reference == ["act/tokens"] and result.only_theirs == ["act/mine_only"]
    assert result.dtype == "float32"                # the less precise side sets the tolerance
    assert result.tolerance.rtol == 1e-4
    rows = {row.comparison.key: row for row in result.rows}
    assert not rows["grad/output.weight"].comparison.passed
    assert rows["output/logits"].comparison.passed  # float32 rounding is within float32's
    assert result.first_divergence.comparison.key == "grad/output.weight"
    assert main(["compare", str(tiny), str(plain)]) == 1
    out = capsys.readouterr().out
    assert "(20, 16) vs (16, 20)" in out and "only in theirs (1): act/mine_only" in out


def test_compare_and_export_errors(tiny, tmp_path, capsys):
    unrelated = tmp_path / "unrelated.npz"
    np.savez(unrelated, something=np.zeros(2))
    for argv, message in [
            (["compare", str(tiny), str(tmp_path / "missing.npz")], "no such case file"),
            (["compare", str(unrelated), str(tiny)], "is not a numpy_tf case"),
            (["compare", str(tiny), str(unrelated)], "share no tensor names"),
            (["export", "--model", "mamba", "-o", "x.npz"],
             "unknown model 'mamba'; numpy_tf exports tiny-gpt, gpt2, llama, transformer, "
             "bert"),
            (["export", "--model", "gpt2", "--set", "colour=3", "-o", "x.npz"],
             "unexpected keyword argument 'colour'"),
            (["export", "--model", "gpt2", "--set", "layers", "-o", "x.npz"],
             "--set expects KEY=VALUE"),
            (["export", "--model", "tiny-gpt", "--config", "huge", "-o", "x.npz"],
             "'huge' is neither a preset of tiny-gpt (tiny)"),
            (["export", "--model", "tiny-gpt", "--config", "{oops", "-o", "x.npz"],
             "not valid JSON"),
            (["export", "--model", "tiny-gpt", "--length", "9", "-o", "x.npz"],
             "length must be in [1, max_context = 8]; got 9"),
            (["export", "--model", "transformer", "--pad", "1", "-o", "x.npz"],
             "pad applies to the decoder-only models")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


def test_export_command(tmp_path, capsys):
    config = tmp_path / "small.json"
    config.write_text(json.dumps({"layers": 1, "width": 8, "heads": 2}))
    out = tmp_path / "case.npz"
    assert main(["export", "--model", "gpt2", "--config", str(config), "--set",
                 "vocab_size=11", "--set", "max_context=6", "--pad", "2", "--dtype", "float32",
                 "--seed", "5", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    case = Case.load(out)
    assert case.meta["config"]["vocab_size"] == 11 and case.meta["config"]["layers"] == 1
    assert case.arrays["input/key_padding_mask"][-1, -2:].all()
    assert case.meta["keyword_inputs"] == ["key_padding_mask"]
    assert case.arrays["param/tokens.weight"].dtype == np.float32
    assert main(["export", "--model", "llama", "--config", '{"num_hidden_layers": 1}',
                 "-o", str(out)]) == 0
    llama = Case.load(out)
    assert "act/layers.0.self_attn" in llama.arrays and "act/layers.1" not in llama.arrays
    assert "halves" in llama.meta["conventions"]["rope"]


def test_the_tools_never_import_torch():
    code = ("import sys, numpy_tf.checking.torch_bridge, numpy_tf.checking.export, "
            "numpy_tf.checking.compare, numpy_tf.teaching.grading, numpy_tf.teaching.assignment, "
            "numpy_tf.teaching.explain, numpy_tf.cli; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
