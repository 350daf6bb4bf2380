"""Parameter accounting from configs: the presets' known totals, the formulas against real models
(numpy_tf's GPT here, Hugging Face models in the torch tests), the 12 d^2 column, bad input and
the `numpy-tf params` command."""
import json
import re
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import GPT, GPTConfig
from numpy_tf.cli.commands import main
from numpy_tf.models.accounting import PRESETS, account, load_config


def per_row(accounting, named_parameters) -> dict:
    """Each real parameter counted under the row whose module path holds it (block indices
    read as N); every parameter must belong to exactly one row."""
    counts = {row.name: 0 for row in accounting.rows}
    for name, size in named_parameters:
        generic = re.sub(r"\.\d+\.", ".N.", name)
        owners = [row for row in counts if generic == row or generic.startswith(row + ".")]
        assert len(owners) == 1, f"{name} belongs to {owners}"
        counts[owners[0]] += size
    return counts


def assert_rows_match(accounting, named_parameters):
    expected = {row.name: row.total for row in accounting.rows}
    assert per_row(accounting, named_parameters) == expected
    assert accounting.total == sum(size for _, size in named_parameters)


@pytest.mark.parametrize("name, total, tied", [("gpt2", 124_439_808, True),
                                               ("llama-2-7b", 6_738_415_616, False),
                                               ("tiny-gpt", 7_232, False),
                                               ("bert-base-uncased", 109_514_298, True)])
def test_presets_reproduce_known_totals(name, total, tied):
    accounting = account(name)
    assert accounting.total == total and accounting.tied == tied


def test_the_twelve_d_squared_column():
    gpt2 = account("gpt2")
    # ln 2d, qkv 3d^2 + 3d, output d^2 + d, ln 2d, FFN 8d^2 + 5d: 12 d^2 + 13 d
    assert gpt2.block == 12 * 768**2 + 13 * 768 == 7_087_872
    assert gpt2.block_estimate == 7_077_888
    summary = gpt2.to_dict()
    assert summary["block_estimate_rel_diff"] == pytest.approx(-9984 / 7_087_872)
    assert summary["total_estimate"] == 12 * 12 * 768**2 + 50257 * 768
    llama = account("llama-2-7b")
    assert llama.block == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096 == 202_383_360
    assert llama.to_dict()["block_estimate_rel_diff"] == pytest.approx(
        (12 * 4096**2 - 202_383_360) / 202_383_360)
    assert account("tiny-gpt").block == 12 * 16**2 + 9 * 16      # the module docstring's claim
    text = str(gpt2)
    assert "12·d² = 7,077,888 (off by -0.14%)" in text and "124,439,808" in text


def test_grouped_query_attention_counts_llama_3_8b():
    """Llama-3-8B's published 8,030,261,248: 8 key/value heads of 32, an untied head."""
    config = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "tie_word_embeddings": False}
    assert account(config).total == 8_030_261_248


@given(vocab=st.integers(1, 30), context=st.integers(1, 9), heads=st.integers(1, 3),
       head_dim=st.integers(1, 4), layers=st.integers(1, 3),
       hidden=st.one_of(st.none(), st.integers(1, 20)), attention_bias=st.booleans(),
       ffn_bias=st.booleans(), tied=st.booleans())
def test_gpt_formula_equals_the_built_model(vocab, context, heads, head_dim, layers, hidden,
                                            attention_bias, ffn_bias, tied):
    config = GPTConfig(vocab_size=vocab, max_context=context, width=heads * head_dim,
                       heads=heads, layers=layers, hidden=hidden, attention_bias=attention_bias,
                       ffn_bias=ffn_bias, tied=tied)
    model = GPT(config)
    accounting = account(config)
    assert accounting.total == model.num_parameters()
    assert_rows_match(accounting, [(n, p.size) for n, p in model.named_parameters()])


def test_gpt_config_json_file(tmp_path):
    config = GPTConfig.gpt2(vocab_size=40, max_context=6, width=8, heads=2, layers=2)
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(config.to_dict()))
    assert account(str(path)).total == GPT(config).num_parameters()
    assert account(config).tied and account(load_config(str(path))).family == "gpt"


def test_counting_allocates_no_weights():
    tracemalloc.start()
    account("llama-2-7b")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20, f"{peak} bytes"        # 6.7e9 weights would be 27 GB in float32


@pytest.mark.parametrize("config, message", [
    ("no-such-model", "'no-such-model' is neither a file nor a preset; presets: gpt2"),
    ("missing/config.json", "no such file: 'missing/config.json'"),
    ({"model_type": "t5"},
     "model_type 't5' is not supported; supported: gpt2, llama, mistral, bert"),
    ({"width": 8, "depth": 2}, "no model_type and is not a numpy_tf GPTConfig .unknown keys: "
                               "depth"),
    ({"model_type": "llama", "vocab_size": 10}, "llama config lacks 'hidden_size'"),
    ({**PRESETS["gpt2"], "n_embd": 76.8}, "gpt2 config n_embd must be a positive integer"),
    ({**PRESETS["gpt2"], "add_cross_attention": True}, "cross-attention"),
    ({**PRESETS["bert-base-uncased"], "architectures": ["BertForQuestionAnswering"]},
     "architecture 'BertForQuestionAnswering' is not supported"),
])
def test_bad_configs_are_clear_errors(config, message):
    with pytest.raises((ValueError, TypeError), match=message):
        account(config)


def test_bad_files_are_clear_errors(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json is not a JSON file"):
        account(str(tmp_path / "broken.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object; got list"):
        account(str(tmp_path / "list.json"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(PRESETS["gpt2"]))
    assert account(str(tmp_path / "model")).total == 124_439_808     # an HF model folder


def test_cli_table_and_json(capsys):
    assert main(["params", "--config", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert "6,738,415,616" in out and "model.layers.N.mlp" in out and "untied" in out
    assert main(["params", "--config", "gpt2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == 124_439_808 and data["tied"] and data["config"] == "gpt2"
    assert {row["name"]: row["total"] for row in data["rows"]}["lm_head"] == 0
    assert sum(row["total"] for row in data["rows"]) == data["total"]


@pytest.mark.parametrize("argument", ["no-such-model", "nowhere/config.json"])
def test_cli_bad_input_exits_2_with_a_message(argument, capsys):
    assert main(["params", "--config", argument]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("numpy-tf params: ")
    assert "Traceback" not in captured.err


def test_cli_unsupported_model_type_exits_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    assert main(["params", "--config", str(path)]) == 2
    assert "model_type 't5' is not supported" in capsys.readouterr().err


# -- against Hugging Face models built from small configs (random weights, nothing downloaded)
def _hf_rows_match(model, config_dict):
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    accounting = account(config_dict)
    assert accounting.total == sum(p.numel() for p in model.parameters())
    assert_rows_match(accounting, named)


@pytest.mark.torch
@pytest.mark.parametrize("tied, inner", [(True, None), (False, 20)])
def test_formula_equals_hf_gpt2(tied, inner, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=37, n_positions=11, n_embd=12, n_layer=3,
                                     n_head=3, n_inner=inner, tie_word_embeddings=tied,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    _hf_rows_match(model, config.to_dict())
    config.to_json_file(tmp_path / "config.json")           # as saved: defaults left out
    assert account(str(tmp_path / "config.json")).total == model.num_parameters()


@pytest.mark.torch
@pytest.mark.parametrize("changes", [{}, {"num_key_value_heads": 1, "tie_word_embeddings": True},
                                     {"attention_bias": True, "mlp_bias": True, "head_dim": 6}])
def test_formula_equals_hf_llama(changes, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{
        "vocab_size": 41, "hidden_size": 16, "intermediate_size": 28, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, **changes})
    model = transformers.LlamaForCausalLM(config)
    _hf_rows_match(model, config.to_dict())
    config.to_json_file(tmp_path / "config.json")
    assert account(str(tmp_path / "config.json")).total == model.num_parameters()


@pytest.mark.torch
@pytest.mark.parametrize("architecture, tied", [("BertForMaskedLM", True),
                                                ("BertForMaskedLM", False),
                                                ("BertModel", True),
                                                ("BertForPreTraining", True)])
def test_formula_equals_hf_bert(architecture, tied, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=43, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=24,
                                     max_position_embeddings=13, type_vocab_size=3,
                                     tie_word_embeddings=tied, architectures=[architecture])
    model = getattr(transformers, architecture)(config)
    _hf_rows_match(model, config.to_dict())
    config.to_json_file(tmp_path / "config.json")
    assert account(str(tmp_path / "config.json")).total == model.num_parameters()


@pytest.mark.torch
def test_bert_masked_lm_has_no_pooler():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=43, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=24)
    model = transformers.BertForMaskedLM(config)
    assert not any("pooler" in name for name, _ in model.named_parameters())
    assert not any("pooler" in row.name for row in account(config.to_dict()).rows)


# -- the encoder-decoder: Seq2SeqConfig, torch.nn.Transformer kwargs, the base model -----------
BASE_KWARGS = {"d_model": 512, "nhead": 8, "num_encoder_layers": 6, "num_decoder_layers": 6,
               "dim_feedforward": 2048}


def test_the_base_model_layer_stacks_hold_44_140_544():
    """6 encoder layers (3,152,384 each), 6 decoder layers (4,204,032 each) and the two final
    LayerNorms (1,024 each) that torch.nn.Transformer always adds."""
    accounting = account("transformer-base")
    assert accounting.total == 44_140_544 and accounting.model == "torch.nn.Transformer"
    rows = {row.name: row.total for row in accounting.rows}
    encoder = sum(t for n, t in rows.items() if n.startswith("encoder.layers.N."))
    decoder = sum(t for n, t in rows.items() if n.startswith("decoder.layers.N."))
    assert (encoder, decoder) == (6 * 3_152_384, 6 * 4_204_032) == (18_914_304, 25_224_192)
    assert rows["encoder.norm"] == rows["decoder.norm"] == 2 * 512
    assert encoder + decoder + 2048 == 44_140_544
    assert account({"torch_module": "torch.nn.Transformer", **BASE_KWARGS}).total == 44_140_544
    assert account({"torch_module": "torch.nn.Transformer"}).total == 44_140_544  # the defaults
    text = str(accounting)
    for line in ["d = 512, Le = 6, Ld = 6, no embeddings and no output head",
                 "one encoder layer: 3,152,384 exact; 12·d² = 3,145,728 (off by -0.21%)",
                 "one decoder layer: 4,204,032 exact; 16·d² = 4,194,304 (off by -0.23%)",
                 "whole model: 44,140,544 exact; Le·12·d² + Ld·16·d² = 44,040,192"]:
        assert line in text, line
    summary = accounting.to_dict()
    assert [(s["name"], s["layers"], s["block"]) for s in summary["stacks"]] == [
        ("encoder layer", 6, 3_152_384), ("decoder layer", 6, 4_204_032)]


def test_torch_kwargs_in_every_form_the_config_reader_takes(tmp_path, capsys):
    spec = {"torch_module": "torch.nn.Transformer", **BASE_KWARGS, "bias": False}
    path = tmp_path / "transformer.json"
    path.write_text(json.dumps(spec))
    for source in [str(path), json.dumps(spec)]:
        assert main(["params", "--config", source, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        # no bias: 4d² per attention, d·F and F·d, a d-weight per LayerNorm
        assert data["total"] == 6 * (4 * 512**2 + 2 * 512 * 2048 + 2 * 512) + \
            6 * (8 * 512**2 + 2 * 512 * 2048 + 3 * 512) + 2 * 512 == 44_056_576
    assert load_config("transformer-base") == {"torch_module": "torch.nn.Transformer",
                                               **BASE_KWARGS, "dropout": 0.1,
                                               "activation": "relu", "layer_norm_eps": 1e-5,
                                               "norm_first": False, "bias": True,
                                               "batch_first": True}
    assert PRESETS["transformer-base"]["torch_module"] == "torch.nn.Transformer"


@pytest.mark.parametrize("config, message", [
    (BASE_KWARGS, "its keys are torch.nn.Transformer's keyword arguments .*: add "
                  "\"torch_module\": \"torch.nn.Transformer\""),
    ({"torch_module": "torch.nn.LSTM"}, "torch_module 'torch.nn.LSTM' is not supported; "
                                        "supported: torch.nn.Transformer"),
    ({"torch_module": "torch.nn.Transformer", "d_modle": 512},
     "torch.nn.Transformer has no supported argument 'd_modle'; numpy_tf reads d_model, "
     "nhead"),
    ({"torch_module": "torch.nn.Transformer", "d_model": 510},
     r"d_model \(510\) must be divisible by nhead \(8\)"),
    ({"torch_module": "torch.nn.Transformer", "nhead": 0},
     "torch.nn.Transformer kwargs nhead must be a positive integer; got 0"),
    ({"torch_module": "torch.nn.Transformer", "custom_encoder": "mine"},
     "custom_encoder must be null: a custom stack cannot be counted"),
    ({"family": "seq2seq", "d_model": 10, "nhead": 4}, r"d_model \(10\) must be divisible"),
])
def test_bad_encoder_decoder_configs_are_clear_errors(config, message):
    with pytest.raises((ValueError, TypeError), match=message):
        account(config)


def test_a_seq2seq_without_final_norms_has_no_torch_kwargs():
    from numpy_tf.models.accounting import torch_transformer_config
    from numpy_tf.models.encoder_decoder.seq2seq import Seq2SeqConfig

    with pytest.raises(ValueError, match="final_norms=False has no torch.nn.Transformer kwargs"):
        torch_transformer_config(Seq2SeqConfig(final_norms=False))


# the sinusoidal positions need an even d_model (sin and cos fill the pairs)
SEQ2SEQ_DRAWS = dict(sources=st.one_of(st.integers(1, 9), st.none()),
                     features=st.integers(1, 5), targets=st.integers(1, 9),
                     heads=st.integers(1, 3), head_dim=st.sampled_from([2, 4]),
                     encoder_layers=st.integers(1, 3), decoder_layers=st.integers(1, 3),
                     ffn=st.integers(1, 7), bias=st.booleans(), final_norms=st.booleans())


@given(**SEQ2SEQ_DRAWS)
def test_seq2seq_formula_equals_the_built_model_row_by_row(sources, features, targets, heads,
                                                           head_dim, encoder_layers,
                                                           decoder_layers, ffn, bias,
                                                           final_norms):
    from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig

    config = Seq2SeqConfig(src_vocab_size=sources,
                           src_features=None if sources is not None else features,
                           tgt_vocab_size=targets, d_model=heads * head_dim, nhead=heads,
                           num_encoder_layers=encoder_layers,
                           num_decoder_layers=decoder_layers, dim_feedforward=ffn, bias=bias,
                           final_norms=final_norms)
    model = Seq2Seq(config)
    accounting = account(config)
    assert_rows_match(accounting, [(n, p.size) for n, p in model.named_parameters()])
    assert accounting.total == model.num_parameters()
    assert account({"family": "seq2seq", **config.to_dict()}).total == accounting.total


def test_counting_the_base_model_allocates_no_weights():
    tracemalloc.start()
    account("transformer-base")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20, f"{peak} bytes"


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_the_base_model_count_is_torch_nn_transformers():
    torch = pytest.importorskip("torch")
    with torch.device("meta"):                      # shapes only: nothing allocated
        model = torch.nn.Transformer()
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    assert sum(size for _, size in named) == 44_140_544
    assert_rows_match(account("transformer-base"), named)
    assert sum(s for n, s in named if n.startswith(("encoder.norm", "decoder.norm"))) == 2048


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@given(heads=st.integers(1, 3), head_dim=st.integers(1, 3), encoder_layers=st.integers(1, 3),
       decoder_layers=st.integers(1, 3), ffn=st.integers(1, 7), bias=st.booleans(),
       norm_first=st.booleans())
def test_torch_kwargs_formula_equals_torch_nn_transformer_row_by_row(
        heads, head_dim, encoder_layers, decoder_layers, ffn, bias, norm_first):
    torch = pytest.importorskip("torch")
    kwargs = dict(d_model=heads * head_dim, nhead=heads, num_encoder_layers=encoder_layers,
                  num_decoder_layers=decoder_layers, dim_feedforward=ffn, bias=bias,
                  norm_first=norm_first, batch_first=True)
    with torch.device("meta"):
        model = torch.nn.Transformer(**kwargs)
    accounting = account({"torch_module": "torch.nn.Transformer", **kwargs})
    assert_rows_match(accounting, [(n, p.numel()) for n, p in model.named_parameters()])
