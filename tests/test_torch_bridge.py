"""numpy_tf.torch_bridge.run_torch: export a case, run a torch model on it, compare. The torch
models are the mirrors in reference/ (TinyGPT: the 7,232-parameter Pre-LN GPT; the
torch.nn.Transformer sequence-to-sequence model) and Hugging Face GPT-2 and Llama built offline."""
import importlib
import sys
import warnings
from pathlib import Path

import pytest

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.compare import compare_files
from numpy_tf.checking.export import export_case
from numpy_tf.checking.torch_bridge import run_torch
from numpy_tf.interop import gpt2_layout

pytestmark = pytest.mark.torch
REFERENCE = Path(__file__).resolve().parent.parent / "reference"


def reference(name: str):
    """A module of reference/ (they import each other by plain name)."""
    pytest.importorskip("torch")
    if str(REFERENCE) not in sys.path:
        sys.path.insert(0, str(REFERENCE))
    return importlib.import_module(name)


def tiny_gpt_activations(case: Case) -> dict:
    """Every activation but `positions`: TinyGPT's is the table alone, numpy_tf's adds it."""
    return {name: name for name in case.section("act") if name != "positions"}


def export(tmp_path, model, **kwargs):
    path = tmp_path / f"{model}.npz"
    export_case(model, **kwargs).save(path)
    return path, Case.load(path)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_tiny_pre_ln_gpt_agrees_number_by_number(tmp_path, dtype):
    path, case = export(tmp_path, "tiny-gpt", seed=5, dtype=dtype)
    theirs = tmp_path / "torch.npz"
    run_torch(reference("gpt").TinyGPT(20, 8, 16, 4, 2), path, theirs,
              activations=tiny_gpt_activations(case))
    result = compare_files(path, theirs, allow_missing=True)     # positions: P alone
    assert result.passed, str(result)
    assert result.only_reference == ["act/positions", "grad_act/positions"]
    assert not result.only_theirs and len(result.rows) == len(case.arrays) - 2
    worst = max(row.comparison.max_abs_error for row in result.rows)
    assert worst < (1e-13 if dtype == "float64" else 2e-5)


def test_a_different_eps_in_one_norm_is_found_at_that_norm(tmp_path):
    """The torch model differs in one place, blocks.1.norm1's eps: compare names exactly that
    activation, though everything after it differs too."""
    path, case = export(tmp_path, "tiny-gpt", seed=6)
    model = reference("gpt").TinyGPT(20, 8, 16, 4, 2)
    model.blocks[1].norm1.eps = 1e-3
    theirs = tmp_path / "torch.npz"
    run_torch(model, path, theirs, activations=tiny_gpt_activations(case))
    result = compare_files(path, theirs)
    assert result.first_divergence.comparison.key == "act/blocks.1.norm1"
    rows = {row.comparison.key: row.comparison for row in result.rows}
    assert rows["act/tokens"].passed and rows["act/blocks.0"].passed     # before: equal
    assert not any(rows[key].passed for key in ("act/blocks.1.norm1", "output/logits",
                                                "grad/tokens.weight"))


def test_hugging_face_gpt2_with_padding_through_the_layout_table(tmp_path):
    transformers = pytest.importorskip("transformers")
    path, case = export(tmp_path, "gpt2", config="gpt2-tiny", seed=7, pad=3)
    c = case.meta["config"]
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=c["vocab_size"], n_positions=c["max_context"], n_embd=c["width"],
        n_layer=c["layers"], n_head=c["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager"))
    activations = {"tokens": "transformer.wte", "final_norm": "transformer.ln_f",
                   "output": "lm_head"}
    for i in range(c["layers"]):
        activations.update({f"blocks.{i}": f"transformer.h.{i}",
                            f"blocks.{i}.norm1": f"transformer.h.{i}.ln_1",
                            f"blocks.{i}.attention": f"transformer.h.{i}.attn",
                            f"blocks.{i}.attention.qkv": f"transformer.h.{i}.attn.c_attn",
                            f"blocks.{i}.feedforward.1": f"transformer.h.{i}.mlp.act"})
    theirs = tmp_path / "hf.npz"
    run_torch(model, path, theirs, activations=activations,
              params={ours: (hf, transposed) for ours, hf, transposed in
                      gpt2_layout(c["layers"]).rows},
              call=lambda m, x: m(input_ids=x["ids"],
                                  attention_mask=(~x["key_padding_mask"]).long()))
    result = compare_files(path, theirs, allow_missing=True)     # 13 activations mapped
    assert result.passed, str(result)
    assert len([row for row in result.rows if row.comparison.key.startswith("act/")]) == 13


def test_torch_nn_transformer_with_every_matching_name(tmp_path):
    path, case = export(tmp_path, "transformer", seed=8)
    c = case.meta["config"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # nn.Transformer's nested-tensor notice
        model = reference("transformer").Seq2Seq(
            c["src_vocab_size"], c["tgt_vocab_size"], c["d_model"], c["scale_embeddings"],
            nhead=c["nhead"], num_encoder_layers=c["num_encoder_layers"],
            num_decoder_layers=c["num_decoder_layers"], dim_feedforward=c["dim_feedforward"],
            dropout=0.0, activation=c["activation"], norm_first=c["norm_first"])
    theirs = tmp_path / "torch.npz"
    written = run_torch(model, path, theirs, activations="matching",
                        call=lambda m, x: m(x["src_ids"], x["decoder_input"],
                                            x["src_key_padding_mask"],
                                            x["tgt_key_padding_mask"]))
    result = compare_files(path, theirs, allow_missing=True)     # names torch lacks
    assert result.passed, str(result)
    assert "act/positions#2" in written.arrays and "grad_act/positions#2" in written.arrays
    assert sum(row.comparison.key.startswith("act/") for row in result.rows) > 40


def test_hugging_face_llamas_float32_islands_show_at_the_first_rms_norm(tmp_path):
    """HF's LlamaRMSNorm computes in float32 even in a float64 model: against numpy_tf's
    float64 case the first divergence is the first RMSNorm's output. With reference/llama.py's
    float64_faithful() (the same operations in the working dtype) everything agrees."""
    transformers = pytest.importorskip("transformers")
    path, case = export(tmp_path, "llama", seed=9, pad=2)
    c = case.meta["config"]
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], rms_norm_eps=c["rms_norm_eps"],
        attn_implementation="eager"))
    names = list(case.section("act"))
    arguments = dict(
        activations={name: f"model.{name}" if name != "lm_head" else name for name in names},
        params={name: f"model.{name}" if name != "lm_head.weight" else name
                for name in case.section("param")},
        call=lambda m, x: m(input_ids=x["ids"],
                            attention_mask=(~x["key_padding_mask"]).long()))
    theirs = tmp_path / "hf.npz"
    run_torch(model, path, theirs, **arguments)
    plain = compare_files(path, theirs)
    assert plain.first_divergence.comparison.key == "act/layers.0.input_layernorm"
    with reference("llama").float64_faithful():
        run_torch(model, path, theirs, **arguments)
    assert compare_files(path, theirs).passed


def test_bridge_errors(tmp_path):
    path, _ = export(tmp_path, "tiny-gpt", seed=1)
    TinyGPT = reference("gpt").TinyGPT
    with pytest.raises(ValueError, match="module parameters given no value: positions.weight, "):
        run_torch(TinyGPT(20, 8, 16, 4, 2), path, params={"tokens.weight": "tokens.weight"})
    with pytest.raises(ValueError, match="not parameters of the module: nope"):
        run_torch(TinyGPT(20, 8, 16, 4, 2), path, params={"tokens.weight": "nope"})
    with pytest.raises(ValueError, match=r"activations\['x'\] = 'blocks.9' is not a submodule"):
        run_torch(TinyGPT(20, 8, 16, 4, 2), path, activations={"x": "blocks.9"})
    with pytest.raises(ValueError, match="no parameter name of the case matches"):
        run_torch(reference("gpt").PreLNBlock(16, 4), path)
    padded, _ = export(tmp_path, "gpt2", seed=1, pad=1)
    with pytest.raises(ValueError, match=r"keyword inputs \['key_padding_mask'\]: pass call="):
        run_torch(TinyGPT(24, 10, 16, 4, 2), padded)
    case = Case.load(path)
    case.meta["loss"] = {"name": "contrastive"}
    case.save(tmp_path / "other_loss.npz")
    with pytest.raises(ValueError, match="the case's loss 'contrastive' has no torch"):
        run_torch(TinyGPT(20, 8, 16, 4, 2), tmp_path / "other_loss.npz")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bert_through_its_torch_mirror(tmp_path, dtype):
    """The BERT case (masked tokens, segments, right padding) against reference/bert.py's
    TorchBert, built on torch.nn.TransformerEncoder with numpy_tf's names."""
    path, case = export(tmp_path, "bert", seed=12, pad=2, dtype=dtype)
    model = reference("bert").TorchBert(case.meta["config"])
    theirs = tmp_path / "torch.npz"
    positions = "embeddings.position_embeddings"       # torch's is the table alone
    run_torch(model, path, theirs, call=lambda m, x: m(x["ids"], (~x["key_padding_mask"]).long(),
                                                       x["token_type_ids"]),
              activations={name: name for name in case.section("act")
                           if name in dict(model.named_modules()) and name != positions})
    result = compare_files(path, theirs, allow_missing=True)     # names torch lacks
    assert result.passed, str(result)
    assert (case.arrays["input/labels"] != -100).sum() >= 2
    assert sum(row.comparison.key.startswith("act/") for row in result.rows) > 20
