"""The model registry: every registered family has the entry each tool needs, every command takes
every preset name it should (and the old names), and the one config reader's messages."""
import json
import re
from dataclasses import replace

import numpy as np
import pytest

from numpy_tf.checking import export, fixtures
from numpy_tf.cli import commands
from numpy_tf.cli.commands import main
from numpy_tf.interop import hf as interop_hf
from numpy_tf.interop import pretrained
from numpy_tf.models import registry
from numpy_tf.models.accounting import account, count_llama
from numpy_tf.models.llama import Llama, LlamaConfig
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint

PRESETS = list(registry.PRESETS.values())
# presets small enough to build, export and train in a test (the published ones are not: the
# Hugging Face checkpoints' shapes, and transformer-base, torch.nn.Transformer()'s)
SMALL = [p for p in PRESETS if not (p.hf or p.torch)]
ALIASES = {"tiny": "tiny-gpt", "gpt2-124m": "gpt2", "smollm2": "smollm2-135m",
           "digits": "seq2seq-tiny"}


def missing_entries() -> list[str]:
    """What a registered family lacks that a tool needs (empty when the house is in order)."""
    problems = []
    for family in registry.FAMILIES.values():
        name = family.name
        if family.config_class is not None:
            if family.objective is None:
                problems.append(f"{name}: no objective (export and the fixture runner run it)")
            if name not in export.EXPORTS:
                problems.append(f"{name}: no checking/export.py EXPORTS entry")
            elif registry.FAMILIES[registry.family(export.EXPORTS[name].default).name] \
                    is not family:
                problems.append(f"{name}: its EXPORTS default is not one of its presets")
            if not registry.presets_of(name):
                problems.append(f"{name}: no preset")
        if name not in fixtures.MODEL_INPUTS and name not in fixtures.OTHER_MODEL_KINDS.values():
            problems.append(f"{name}: the fixture runner has no entry for it")
        if not fixtures.case_paths(model=name):
            problems.append(f"{name}: no case in reference/fixtures")
        if family.hf_model_types:
            if name not in interop_hf.HF_FAMILIES:
                problems.append(f"{name}: reads model_type {family.hf_model_types} but "
                                "interop/hf.py HF_FAMILIES has no layout for it")
            if None in (family.count, family.count_hf, family.hf_config):
                problems.append(f"{name}: a Hugging Face family needs count, count_hf and "
                                "hf_config")
    for table, keys in [("interop HF_FAMILIES", interop_hf.HF_FAMILIES),
                        ("export EXPORTS", export.EXPORTS),
                        ("fixtures MODEL_INPUTS", fixtures.MODEL_INPUTS),
                        ("cli TRAIN_TASKS", commands.TRAIN_TASKS)]:
        problems += [f"{table} has {key!r}, no registered family" for key in keys
                     if key not in registry.FAMILIES]
    problems += [f"pretrained.PRETRAINED has {key!r}, no registered preset"
                 for key in pretrained.PRETRAINED if key not in registry.PRESETS]
    return problems


def test_every_family_has_every_entry_a_tool_needs():
    assert missing_entries() == []


def test_a_family_without_its_tool_entries_is_caught(monkeypatch):
    """Register a Hugging Face family and nothing else: each tool's missing entry is named."""
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    monkeypatch.setattr(registry, "_NAMES", dict(registry._NAMES))
    registry.register_family(registry.Family("qwen9", "a family with no tool entries", Llama,
                                             LlamaConfig, hf_model_types=("qwen9",)))
    problems = "\n".join(missing_entries())
    for needed in ["qwen9: no objective", "qwen9: no checking/export.py EXPORTS entry",
                   "qwen9: no preset", "qwen9: the fixture runner has no entry",
                   "qwen9: no case in reference/fixtures", "HF_FAMILIES has no layout",
                   "needs count, count_hf and hf_config"]:
        assert needed in problems, needed


def test_names_are_unique_across_families_presets_and_aliases(monkeypatch):
    monkeypatch.setattr(registry, "PRESETS", dict(registry.PRESETS))
    monkeypatch.setattr(registry, "_NAMES", dict(registry._NAMES))
    for name in ["llama", "gpt2", "tiny", "transformer"]:
        with pytest.raises(ValueError, match=f"the name '{name}' is taken"):
            registry.register_preset(registry.Preset(name, "gpt", registry.PRESETS["gpt2"]
                                                     .config, "a clash"))
    with pytest.raises(ValueError, match="names no registered family"):
        registry.register_preset(registry.Preset("x", "mamba", None, "no family"))


def test_resolve_names_every_family_preset_and_alias():
    for family in registry.FAMILIES.values():
        for name in (family.name, *family.aliases):
            assert registry.resolve(name) == (family, None)
    for preset in PRESETS:
        for name in (preset.name, *preset.aliases):
            assert registry.resolve(name) == (registry.FAMILIES[preset.family], preset)
    for alias, name in ALIASES.items():
        assert registry.find_preset(alias) is registry.PRESETS[name]
    with pytest.raises(ValueError, match="--model 'mamba' is neither a model family nor a "
                                         "preset; families: gpt, llama, bert, seq2seq, cbow"):
        registry.resolve("mamba", "--model")


# -- the families' formulas, configs and checkpoints ---------------------------------------
@pytest.mark.parametrize("preset", SMALL, ids=[p.name for p in SMALL])
def test_small_presets_build_count_and_checkpoint(preset, tmp_path):
    family = registry.FAMILIES[preset.family]
    model = family.model_class(preset.config, rng=1)
    if family.count is not None:
        assert account(preset.name).total == model.num_parameters()
    save_checkpoint(tmp_path / "c.npz", model)
    loaded = load_checkpoint(tmp_path / "c.npz").model
    assert type(loaded) is family.model_class and loaded.config == preset.config
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("preset", [p for p in PRESETS
                                    if registry.FAMILIES[p.family].hf_config is not None
                                    and p.name != "tiny-gpt" and p.name != "char-gpt"],
                         ids=lambda p: p.name)
def test_hf_config_is_what_interop_reads_back(preset):
    """numpy_tf config -> HF config.json -> interop's config -> HF config.json is a fixed
    point, and both configs count the same."""
    family = registry.FAMILIES[preset.family]
    hf = family.hf_config(preset.config)
    ours = interop_hf.config_from_hf(hf)
    assert type(ours) is type(preset.config) and family.hf_config(ours) == hf
    assert account(ours).total == account(preset.config).total == family.count_hf(hf).total


def test_gpt_configs_outside_gpt2s_layout_have_no_hf_config():
    with pytest.raises(ValueError, match="attention_bias=False is not in GPT-2's layout"):
        registry.FAMILIES["gpt"].hf_config(registry.PRESETS["tiny-gpt"].config)


@pytest.mark.parametrize("changes", [{}, {"num_key_value_heads": 1, "tie_word_embeddings": True},
                                     {"attention_bias": True, "mlp_bias": True, "head_dim": 6},
                                     {"num_key_value_heads": 2, "intermediate_size": 7}])
def test_the_one_llama_formula_matches_the_built_model_row_by_row(changes):
    config = LlamaConfig(**changes)
    model = Llama(config)
    counts = {row.name: 0 for row in count_llama(config).rows}
    for name, parameter in model.named_parameters():
        generic = re.sub(r"\.\d+\.", ".N.", name)
        owner, = [row for row in counts if generic == row or generic.startswith(row + ".")]
        counts[owner] += parameter.size
    assert counts == {row.name: row.total for row in count_llama(config).rows}
    assert config.num_parameters() == model.num_parameters() == sum(counts.values())


# -- every command takes every preset name it should -----------------------------------------
@pytest.mark.parametrize("name", [p.name for p in PRESETS] + ["gpt2-124m", "smollm2"])
def test_params_takes_every_preset(name, capsys):
    preset = registry.find_preset(name)
    status = main(["params", "--config", name, "--json"])
    captured = capsys.readouterr()
    if registry.FAMILIES[preset.family].count is None:
        assert status == 2 and f"counting the {preset.family} family is not implemented" \
            in captured.err
    else:
        assert status == 0 and json.loads(captured.out)["total"] == account(name).total


@pytest.mark.parametrize("name", [p.name for p in PRESETS])
def test_export_takes_every_preset_as_model_and_as_config(name):
    preset = registry.PRESETS[name]
    family, config = export.model_config(name)
    expected = registry.PRESETS["gpt2-tiny"].config if name == "gpt2" else preset.config
    assert family.name == preset.family and config == expected
    for model in [preset.family, *export.FIRST_NAMES]:
        if registry.family(model).name == preset.family:
            assert export.model_config(model, name) == (family, preset.config)


@pytest.mark.parametrize("name", [p.name for p in SMALL] + ["gpt", "llama", "bert", "seq2seq",
                                                            "transformer", "gpt2"])
def test_export_command_writes_a_case_for_every_small_preset_and_family(name, tmp_path,
                                                                        capsys):
    out = tmp_path / "case.npz"
    assert main(["export", "--model", name, "--dtype", "float32", "-o", str(out)]) == 0
    assert f"wrote {out}: {name}" in capsys.readouterr().out


def test_export_refuses_a_model_too_large_before_building_it(capsys):
    assert main(["export", "--model", "llama-2-7b", "-o", "never.npz"]) == 2
    assert "a case of 6,738,415,616 parameters would hold them" in capsys.readouterr().err


def test_export_help_lists_every_family_and_preset(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in list(export.EXPORTS) + [p.name for p in PRESETS]:
        assert re.search(rf"\b{re.escape(name)}\b", text.replace("- ", "-")), name


def test_train_takes_every_preset_of_a_trainable_family(capsys):
    for preset in PRESETS:
        args = commands.argparse.Namespace(config=preset.name, task=None)
        if preset.family in commands.TRAIN_TASKS:
            task, config = commands.train_plan(args, vocab_size=300)
            assert task == commands.TRAIN_TASKS[preset.family]
            want = replace(preset.config, vocab_size=300) if task == "text" else preset.config
            assert config == want, preset.name
        else:
            assert main(["train", "--config", preset.name]) == 2
            assert f"--config {preset.name} is a {preset.family} model" in \
                capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny-gpt", "gpt2-tiny", "char-gpt", "seq2seq-tiny", "digits",
                                  "tiny"])
def test_train_command_runs_small_presets(name, tmp_path, capsys):
    assert main(["train", "--config", name, "--steps", "1", "--batch-size", "2", "--out",
                 str(tmp_path), "--sample-tokens", "1", "--log-every", "1"]) == 0
    assert (tmp_path / "checkpoint.npz").is_file()
    family = registry.family(name).name
    assert type(load_checkpoint(tmp_path / "checkpoint.npz").model) is \
        registry.FAMILIES[family].model_class
    capsys.readouterr()


@pytest.mark.parametrize("name", list(registry.FAMILIES) + [p.name for p in PRESETS]
                         + ["transformer", "smollm2"])
def test_check_selects_the_cases_of_every_family_and_preset(name):
    family = registry.family(name).name
    paths = fixtures.case_paths(model=name)
    assert paths and all(fixtures.case_family(fixtures._case_kind(p)) == family for p in paths)


def test_check_command_with_a_model(capsys):
    assert main(["check", "--model", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert "llama_gqa" in out and "gpt2_tied" not in out and " 0 failed" in out
    assert main(["check", "--model", "mamba"]) == 2
    assert "--model 'mamba' is neither a model family nor a preset" in capsys.readouterr().err


class _FakeTokenizer:
    def encode(self, text):
        return np.array([ord(c) % 32 for c in text], dtype=np.int64)

    def decode(self, ids, skip_special=False):
        return "|" + ",".join(str(int(i)) for i in ids)


@pytest.fixture
def fake_weights(monkeypatch):
    """smollm2-135m's released weights replaced by a toy Llama (nothing fetched)."""
    def load(dtype, cache_dir=None):
        return Llama(registry.PRESETS["llama-tiny"].config, dtype=dtype), _FakeTokenizer()
    monkeypatch.setitem(pretrained.PRETRAINED, "smollm2-135m", load)


@pytest.mark.parametrize("name", [p.name for p in PRESETS] + ["smollm2", "llama"])
def test_sample_takes_every_preset(name, fake_weights, capsys):
    status = main(["sample", name, "--prompt", "ab", "--tokens", "2"])
    captured = capsys.readouterr()
    preset = registry.find_preset(name)
    if preset is not None and preset.name in pretrained.PRETRAINED:
        assert status == 0 and captured.out.startswith("ab|")
    elif preset is None:
        assert status == 2 and "is a model family, not a checkpoint" in captured.err
    else:
        assert status == 2 and "is a preset without released weights" in captured.err
        if commands.TRAIN_TASKS.get(preset.family) == "text":
            assert f"numpy-tf train --config {name} --out run" in captured.err


@pytest.mark.parametrize("name", ["smollm2-135m", "smollm2", "tiny-gpt"])
def test_generate_takes_the_presets_with_weights(name, fake_weights, capsys):
    status = main(["generate", "--model", name, "--prompt", "ab", "--tokens", "2"])
    captured = capsys.readouterr()
    if name == "tiny-gpt":
        assert status == 2 and "has no released weights numpy_tf can load; those that have: " \
            "smollm2-135m" in captured.err
    else:
        assert status == 0 and captured.out.startswith("ab|")


# -- the one config reader ---------------------------------------------------------------------
def test_read_config_reads_presets_files_folders_and_inline_json(tmp_path):
    assert registry.read_config("tiny") is registry.PRESETS["tiny-gpt"]
    (tmp_path / "c.json").write_text('{"layers": 1}')
    assert registry.read_config(str(tmp_path / "c.json")) == {"layers": 1}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "gpt2"}')
    assert registry.read_config(tmp_path / "model") == {"model_type": "gpt2"}
    assert registry.read_config(' {"width": 8}') == {"width": 8}
    given = {"width": 8}
    assert registry.read_config(given) == given and registry.read_config(given) is not given


@pytest.mark.parametrize("source, message", [
    ("{oops", r"--config \{oops: not valid JSON \(Expecting"),
    ("[1]", r"--config \[1\] must hold a JSON object; got list"),
    ("missing/config.json", r"--config: no such file: 'missing/config.json'"),
    ("no-such", r"--config 'no-such' is neither a file nor a preset; presets: gpt2, gpt2-tiny"),
    ('{"a": 1', r"--config \{\"a\": 1: not valid JSON"),
])
def test_read_config_errors_name_the_argument(source, message):
    with pytest.raises(ValueError, match=message):
        registry.read_config(source, "--config")


def test_read_config_file_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"--config .*bad.json is not a JSON file: Expecting"):
        registry.read_config(str(tmp_path / "bad.json"), "--config")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="list.json must hold a JSON object; got list"):
        registry.read_config(str(tmp_path / "list.json"), "--config")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is a folder without a config.json"):
        registry.read_config(str(tmp_path / "empty"), "--config")
    with pytest.raises(ValueError, match="--config 'x' is neither a preset numpy-tf train "
                                         r"trains \(a, b\) nor a JSON file"):
        registry.read_config("x", "--config", offered="numpy-tf train trains (a, b)")


def test_a_run_folder_named_like_a_preset_is_not_read_as_a_config(tmp_path, monkeypatch):
    """`train --out tiny-gpt` leaves a folder without config.json: the name still means the
    preset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-gpt").mkdir()
    assert registry.read_config("tiny-gpt") is registry.PRESETS["tiny-gpt"]


def test_every_command_reads_config_fields_the_same_way(tmp_path, capsys):
    fields = {"family": "gpt", "vocab_size": 300, "max_context": 8, "width": 8, "heads": 2,
              "layers": 1}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(fields))
    for spec in [str(path), json.dumps(fields)]:
        assert main(["params", "--config", spec, "--json"]) == 0
        total = json.loads(capsys.readouterr().out)["total"]
        args = commands.argparse.Namespace(config=spec, task=None)
        _, config = commands.train_plan(args, vocab_size=261)
        assert account(config).total == total
        assert export.model_config("gpt", spec)[1] == config
    (tmp_path / "s.json").write_text('{"family": "seq2seq", "d_model": 8, "nhead": 2}')
    args = commands.argparse.Namespace(config=str(tmp_path / "s.json"), task=None)
    task, config = commands.train_plan(args, vocab_size=261)
    assert task == "reverse-digits" and config.d_model == 8
    assert export.model_config("seq2seq", str(tmp_path / "s.json"))[1] == config
    with pytest.raises(ValueError, match="config family 'mamba' is not a model family"):
        export.model_config("gpt", '{"family": "mamba"}')
    with pytest.raises(ValueError, match="config 'bert-tiny' is a bert config; --model "
                                         "tiny-gpt is gpt"):
        export.model_config("tiny-gpt", "bert-tiny")
