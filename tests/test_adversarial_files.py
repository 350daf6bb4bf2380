"""Malformed files and misleading comparisons: every loader refuses a broken file with one
FileFormatError naming it, and `compare` never passes what it did not compare.

Loaders: load_npz / load_npy, load_checkpoint, Case.load, ByteTokenizer.load, load_cbow,
load_attention, read_history, load_gguf; compare: compare_files and `numpy-tf compare`.
Each broken file is built here from a good one, so a test fails if the loader lets it through
(it loads) or lets a bare error out (EOFError, JSONDecodeError, KeyError, ZeroDivisionError).
"""
from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from contract import finish_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.compare import compare_files, suggest_rename
from numpy_tf.checking.export import export_case
from numpy_tf.cli.commands import main
from numpy_tf.core.npz import FileFormatError, json_array, load_npy, load_npz, save_npz
from numpy_tf.models.cbow import CBOW
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.study.attention import load_attention, save_attention
from numpy_tf.study.runs import read_history
from numpy_tf.text.tokenizers import ByteTokenizer
from numpy_tf.text.vocabulary import Vocabulary
from numpy_tf.training.cbow import load_cbow, save_cbow
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint


def refused(load, path, *words):
    """load(path) raises a FileFormatError whose message starts with the path and holds
    every one of `words`."""
    with pytest.raises(FileFormatError) as error:
        load(path)
    message = str(error.value)
    assert message.startswith(str(path)), message
    for word in words:
        assert word in message, (word, message)
    return message


# --- the files every loader is tried on --------------------------------------------------

def _checkpoint(path):
    save_checkpoint(path, GPT(GPTConfig.tiny()), step=3, rng=np.random.default_rng(0),
                    extra_arrays=ByteTokenizer().to_arrays())


def _case(path):
    export_case("tiny-gpt", seed=1).save(path)


def _tokenizer(path):
    ByteTokenizer(["<|end|>"]).save(path)


def _cbow(path):
    save_cbow(path, CBOW(3, 4), Vocabulary(["a", "b", "c"]))


def _attention(path):
    rng = np.random.default_rng(0)
    save_attention(path, [rng.dirichlet(np.ones(3), (2, 3))], ["a", "b", "c"])


def _compare_theirs(path):
    return compare_files(Path(path).with_name("reference.npz"), path)


# name -> (writer of a good file, loader)
LOADERS = {
    "load_npz": (_checkpoint, load_npz),
    "load_checkpoint": (_checkpoint, load_checkpoint),
    "Case.load": (_case, Case.load),
    "ByteTokenizer.load": (_tokenizer, ByteTokenizer.load),
    "load_cbow": (_cbow, load_cbow),
    "load_attention": (_attention, load_attention),
    "compare (theirs)": (_case, _compare_theirs),
}


class Files(dict):
    """{loader: the bytes of a good file}, shown by name only in a failing example's report."""

    def __repr__(self) -> str:
        return f"<good files for {', '.join(self)}>"


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    files = Files()
    for name, (write, load) in LOADERS.items():
        path = folder / f"{name.replace(' ', '_')}.npz"
        write(path)
        if name != "compare (theirs)":
            load(path)                                        # the good file loads
        files[name] = path.read_bytes()
    return files


def _place(tmp_path, name, content: bytes, good_files) -> Path:
    path = tmp_path / "broken.npz"
    path.write_bytes(content)
    if name == "compare (theirs)":
        (tmp_path / "reference.npz").write_bytes(good_files["Case.load"])
    return path


def _member_npy(array_bytes: bytes, name="x.npy") -> bytes:
    import io
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, array_bytes)
    return buffer.getvalue()


def _npy(array, allow_pickle=False) -> bytes:
    import io
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def _npy_header(shape) -> bytes:
    import io
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue()


# name -> (bytes, words the message must hold)
def _broken_files(good: bytes) -> dict[str, tuple[bytes, tuple[str, ...]]]:
    return {
        "empty": (b"", ("empty", "0 bytes")),
        "text named .npz": (b"step,loss\n1,2.5\n" * 8, ("not a zip", "b'step'")),
        "pickle": (pickle.dumps({"x": np.zeros(3)}), ("not a zip",)),
        "truncated to half": (good[:len(good) // 2], ("truncated or damaged",)),
        "truncated by one byte": (good[:-1], ("truncated or damaged",)),
        "object member": (_member_npy(_npy(np.array([{"a": 1}], dtype=object), True)),
                          ("object (pickled) data",)),
        "not an .npy member": (_member_npy(b"hello", "notes.txt"), ("'notes.txt'",)),
        "member with a short body": (_member_npy(_npy(np.arange(8.0))[:-16]),
                                     ("is truncated", "expected 64 bytes", "got 48")),
        "header promising 32 TB": (_member_npy(_npy_header((4 * 10**12,)) + b"\0" * 32),
                                   ("shorter than its header",)),
        "bytes after the array": (_member_npy(_npy(np.arange(3.0)) + b"junk"),
                                  ("bytes after its array",)),
    }


BROKEN = list(_broken_files(b"PK\x03\x04" + b"\0" * 64))


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("kind", BROKEN)
def test_every_loader_refuses_every_broken_file(loader, kind, good_files, tmp_path):
    content, words = _broken_files(good_files[loader])[kind]
    path = _place(tmp_path, loader, content, good_files)
    refused(LOADERS[loader][1], path, *words)


def test_a_duplicate_member_and_a_folder_and_a_missing_file(tmp_path):
    path = tmp_path / "twice.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _npy(np.zeros(2)))
        with pytest.warns(UserWarning):
            archive.writestr("x.npy", _npy(np.ones(2)))
    refused(load_npz, path, "appears twice")
    with pytest.raises(FileNotFoundError, match="is a folder"):
        load_npz(tmp_path)
    for load in (load_npz, load_checkpoint, Case.load, ByteTokenizer.load, load_cbow):
        with pytest.raises(FileNotFoundError, match="absent.npz"):
            load(tmp_path / "absent.npz")


def test_a_path_that_is_no_path_or_a_folder_to_save_into_is_refused_by_name(tmp_path):
    """A None or an int was Python's 'expected str, bytes or os.PathLike object'; saving onto a
    folder wrote the whole file and then failed on the rename with the OS's message."""
    model = GPT(GPTConfig.tiny(), rng=0)
    for load in (load_checkpoint, read_history, load_npz):
        with pytest.raises(TypeError, match="path must be a file path .*got int"):
            load(3)
    with pytest.raises(TypeError, match="path must be a file path .*got NoneType"):
        save_checkpoint(None, model)
    with pytest.raises(IsADirectoryError, match="is a folder; an .npz is written to a file"):
        save_checkpoint(tmp_path, model)
    assert list(tmp_path.iterdir()) == []               # nothing written, nothing left


def test_npy_files_are_read_without_numpy_guessing(tmp_path):
    path = tmp_path / "maps.npy"
    path.write_text("not an array")
    refused(load_npy, path, "does not start as one does")
    refused(load_attention, path, "does not start as one does")
    np.save(path, np.zeros((2, 3)))
    refused(load_attention, path, "attention probabilities", "shape (2, 3)")
    path.write_bytes(_npy(np.zeros((2, 3, 3)))[:-8])
    refused(load_npy, path, "is truncated", "got 136")
    np.save(path, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(load_npy(path), np.arange(6.0).reshape(2, 3))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_or_truncated_bytes_load_the_same_arrays_or_are_refused(data, good_files,
                                                                          tmp_path):
    """Flip bytes or cut the file anywhere: load_npz gives back exactly the saved arrays (a
    byte of a timestamp or attribute) or a FileFormatError naming the file, nothing else."""
    good = good_files["load_npz"]
    path = tmp_path / "corrupt.npz"
    path.write_bytes(_corrupted(data, good))
    try:
        arrays = load_npz(path)
    except FileFormatError as error:
        assert str(error).startswith(str(path))
        return
    (tmp_path / "good.npz").write_bytes(good)
    original = load_npz(tmp_path / "good.npz")
    assert list(arrays) == list(original)
    for key in arrays:
        assert arrays[key].dtype == original[key].dtype
        np.testing.assert_array_equal(arrays[key], original[key])


@pytest.mark.parametrize("loader", [name for name in LOADERS if name != "load_npz"])
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_loader_on_corrupted_or_truncated_bytes(loader, data, good_files, tmp_path):
    """The same damage on each loader's own good file: it loads, or refuses the file with a
    FileFormatError naming it; never another exception."""
    path = _place(tmp_path, loader, _corrupted(data, good_files[loader]), good_files)
    try:
        LOADERS[loader][1](path)
    except FileFormatError as error:
        assert str(error).startswith(str(path))


def _corrupted(data, good: bytes) -> bytes:
    """`good` cut short, or with 1 to 4 bytes changed, as hypothesis draws it."""
    content = bytearray(good)
    if data.draw(st.booleans(), label="truncate"):
        content = content[:data.draw(st.integers(0, len(good) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            position = data.draw(st.integers(0, len(good) - 1), label="position")
            content[position] ^= data.draw(st.integers(1, 255), label="mask")
    return bytes(content)


# --- checkpoints: the meta and the weights -------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint_arrays(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkpoint") / "c.npz"
    _checkpoint(path)
    arrays = load_npz(path)
    return arrays, json.loads(str(arrays["meta"]))


def _with_meta(arrays, meta):
    return {**arrays, "meta": np.array(meta if isinstance(meta, str) else json.dumps(meta))}


def _model(meta, **fields):
    return {**meta, "model": {**meta["model"], **fields}}


def _config(meta, **fields):
    return _model(meta, config={**meta["model"]["config"], **fields})


CHECKPOINT_META = {
    "meta not JSON": (lambda m: "{not json", "not valid JSON"),
    "meta a list": (lambda m: [1, 2], "JSON object"),
    "meta 2-D numbers": (None, "0-d string"),
    "no format": (lambda m: {k: v for k, v in m.items() if k != "format"},
                  "not a numpy_tf checkpoint"),
    "model null": (lambda m: {**m, "model": None}, "is not a model spec"),
    "unknown kind": (lambda m: _model(m, kind="Mamba"), "unknown model kind"),
    "no config": (lambda m: _model(m, config=None), "has no config"),
    "dtype int8": (lambda m: _model(m, dtype="int8"), "'int8'"),
    "unknown config field": (lambda m: _config(m, colour=3), "'colour'"),
    "zero heads": (lambda m: _config(m, heads=0), "heads"),
    "vocabulary of 10**12": (lambda m: _config(m, vocab_size=10**12), "far larger"),
    "step a string": (lambda m: {**m, "step": "x"}, "meta['step']"),
    "step negative": (lambda m: {**m, "step": -1}, "meta['step']"),
    "rng state broken": (lambda m: {**m, "rng": {"bit_generator": "PCG64", "state": 5}},
                         "meta['rng']"),
    "rng of an unknown generator": (lambda m: {**m, "rng": {"bit_generator": "os.system"}},
                                    "meta['rng']"),
    "optimizer a string": (lambda m: {**m, "optimizer": "AdamW"}, "meta['optimizer']"),
}


@pytest.mark.parametrize("kind", list(CHECKPOINT_META))
def test_a_checkpoint_with_broken_meta_is_refused(kind, checkpoint_arrays, tmp_path):
    arrays, meta = checkpoint_arrays
    change, word = CHECKPOINT_META[kind]
    broken = {**arrays, "meta": np.zeros((2, 2))} if change is None else \
        _with_meta(arrays, change(meta))
    save_npz(tmp_path / "c.npz", broken)
    refused(load_checkpoint, tmp_path / "c.npz", word)


def _set(arrays, key, value):
    return {**arrays, key: value}


CHECKPOINT_WEIGHTS = {
    "a NaN weight": (lambda a: _set(a, "param/tokens.weight", np.where(
        np.arange(a["param/tokens.weight"].size).reshape(a["param/tokens.weight"].shape) == 17,
        np.nan, a["param/tokens.weight"])), "non-finite", "(1, 1)"),
    "an infinite weight": (lambda a: _set(a, "param/final_norm.weight",
                                          np.full_like(a["param/final_norm.weight"], np.inf)),
                           "non-finite", "final_norm.weight"),
    "a float32 weight": (lambda a: _set(a, "param/output.weight",
                                        a["param/output.weight"].astype(np.float32)),
                         "expected dtype float64, got float32"),
    "an integer weight": (lambda a: _set(a, "param/output.weight",
                                         a["param/output.weight"].astype(np.int64)),
                          "got int64"),
    "a complex weight": (lambda a: _set(a, "param/output.weight",
                                        a["param/output.weight"].astype(np.complex128)),
                         "got complex128"),
    "a string weight": (lambda a: _set(a, "param/output.weight", np.array("w")),
                        "output.weight"),
    "a transposed weight": (lambda a: _set(a, "param/output.weight",
                                           a["param/output.weight"].T.copy()),
                            "expected shape (20, 16), got (16, 20)"),
    "a missing weight": (lambda a: {k: v for k, v in a.items() if k != "param/output.weight"},
                         "missing keys: output.weight"),
    "an unexpected weight": (lambda a: _set(a, "param/extra.weight", np.zeros(2)),
                             "unexpected keys: extra.weight"),
    "no meta": (lambda a: {k: v for k, v in a.items() if k != "meta"}, "no 'meta' entry"),
}


@pytest.mark.parametrize("kind", list(CHECKPOINT_WEIGHTS))
def test_a_checkpoint_with_broken_weights_is_refused(kind, checkpoint_arrays, tmp_path):
    arrays, _ = checkpoint_arrays
    change, *words = CHECKPOINT_WEIGHTS[kind]
    save_npz(tmp_path / "c.npz", change(arrays))
    refused(load_checkpoint, tmp_path / "c.npz", *words)


def test_a_good_checkpoint_still_loads_and_resumes(checkpoint_arrays, tmp_path):
    arrays, meta = checkpoint_arrays
    save_npz(tmp_path / "c.npz", arrays)
    loaded = load_checkpoint(tmp_path / "c.npz")
    assert loaded.step == 3 and loaded.path == tmp_path / "c.npz"
    assert loaded.generator().integers(1 << 30) == np.random.default_rng(0).integers(1 << 30)


def test_a_broken_tokenizer_in_a_checkpoint_is_refused_by_sample(checkpoint_arrays, tmp_path,
                                                                 capsys):
    arrays, _ = checkpoint_arrays
    for value, word in [(np.array("{oops"), "not valid JSON"),
                        (json_array({"format": "other"}), "not a tokenizer"),
                        (np.arange(3), "0-d string")]:
        save_npz(tmp_path / "c.npz", _set(arrays, "tokenizer", value))
        assert main(["sample", str(tmp_path / "c.npz"), "--prompt", "a"]) == 2
        err = capsys.readouterr().err
        assert str(tmp_path / "c.npz") in err and word in err and err.count("\n") == 1, err


# --- other loaders' own contents -------------------------------------------------------------

def test_tokenizer_cbow_and_attention_files_with_wrong_contents(tmp_path):
    path = tmp_path / "f.npz"
    save_npz(path, {"tokenizer": json_array({"format": "numpy_tf.tokenizer", "version": 99})})
    refused(ByteTokenizer.load, path, "version 99")
    save_npz(path, {"tokenizer": json_array([1, 2])})
    refused(ByteTokenizer.load, path, "JSON object")
    save_npz(path, {"x": np.zeros(2)})
    refused(ByteTokenizer.load, path, "no 'tokenizer' array")

    good = tmp_path / "cbow.npz"
    _cbow(good)
    arrays = load_npz(good)
    meta = json.loads(str(arrays["meta"]))
    for change, word in [
            (lambda: _with_meta(arrays, {**meta, "words": ["a", "b"]}), "3 words"),
            (lambda: _with_meta(arrays, {**meta, "words": "abc"}), "list of words"),
            (lambda: _with_meta(arrays, {**meta, "words": ["a", "a", "b"]}), "distinct"),
            (lambda: _with_meta(arrays, {**meta, "format": "x"}), "not a CBOW file"),
            (lambda: _set(arrays, "param/embeddings.weight", np.zeros(3)), "(V, D)"),
            (lambda: _set(arrays, "param/embeddings.weight",
                          np.full((3, 4), np.nan)), "NaN")]:
        save_npz(path, change())
        refused(load_cbow, path, word)

    save_npz(path, {"attention/0": np.zeros((2, 3, 3)), "tokens": np.array(["a", "b"])})
    refused(load_attention, path, "attention map of its 2 tokens")
    save_npz(path, {"attention/x": np.zeros((2, 3, 3)), "tokens": np.array(["a", "b", "c"])})
    refused(load_attention, path, "holds no attention maps")
    save_npz(path, {"attention/0": np.zeros((2, 3, 3)), "tokens": np.arange(3)})
    refused(load_attention, path, "list of strings")


def test_case_files_with_wrong_contents(tmp_path):
    good = tmp_path / "good.npz"
    _case(good)
    arrays = load_npz(good)
    meta = json.loads(str(arrays["meta"]))
    path = tmp_path / "c.npz"
    for change, word in [
            (lambda: _with_meta(arrays, {k: v for k, v in meta.items() if k != "kind"}),
             "meta has no kind"),
            (lambda: _with_meta(arrays, {**meta, "dtype": "complex64"}), "'complex64'"),
            (lambda: _set(arrays, "weights/x", np.zeros(2)), "'weights/x'"),
            (lambda: _set(arrays, "output/logits",
                          arrays["output/logits"].astype(np.complex128)), "complex128"),
            (lambda: _set(arrays, "input/ids", np.array(["a", "b"])), "<U1")]:
        save_npz(path, change())
        refused(Case.load, path, word)


def test_a_training_history_that_is_not_one(tmp_path):
    path = tmp_path / "history.csv"
    for content, word in [(b"\xff\xfe\x00binary", "not a CSV text file"),
                          (b"epoch,accuracy\n1,0.5\n", "no step and loss columns"),
                          (b"step,loss\n", "holds no steps"),
                          (b"step,loss\n1,2.0,9\n", "line 2 has more cells"),
                          (b"step,loss\n1,abc\n", "not a number")]:
        path.write_bytes(content)
        refused(read_history, path, word)


# --- GGUF -------------------------------------------------------------------------------

def _gguf_file(path, *, heads=4, kv_heads=2, hidden=16, vocab=8, nan=False, blocks=1):
    """A one-block Llama GGUF with the given head counts (written with gguf's own writer;
    skipped, with the reason, where gguf is not installed)."""
    gguf = pytest.importorskip("gguf", reason="writing and reading GGUF files needs gguf")
    head_dim = 4
    writer = gguf.GGUFWriter(str(path), "llama")
    if isinstance(blocks, str):
        writer.add_string("llama.block_count", blocks)
    else:
        writer.add_block_count(blocks)
    writer.add_context_length(16)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(24)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(0)
    q_rows, kv_rows = max(heads, 1) * head_dim, max(kv_heads, 1) * head_dim
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.attn_q.weight": (q_rows, hidden),
              "blk.0.attn_k.weight": (kv_rows, hidden), "blk.0.attn_v.weight": (kv_rows, hidden),
              "blk.0.attn_output.weight": (hidden, q_rows), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.ffn_gate.weight": (24, hidden), "blk.0.ffn_up.weight": (24, hidden),
              "blk.0.ffn_down.weight": (hidden, 24)}
    for name, shape in shapes.items():
        value = rng.standard_normal(shape).astype(np.float32)
        if nan and name == "blk.0.ffn_up.weight":
            value[3, 5] = np.nan
        writer.add_tensor(name, value)
    return finish_gguf(writer, path)


GGUF_BROKEN = {
    "head_count 0": (dict(heads=0), "llama.attention.head_count", "integer >= 1, got 0"),
    "head_count_kv 0": (dict(kv_heads=0), "llama.attention.head_count_kv", "got 0"),
    "heads not dividing the width": (dict(heads=3, kv_heads=1), "does not divide", "16"),
    "kv heads not dividing the heads": (dict(heads=4, kv_heads=3), "head_count_kv does not "
                                        "divide", "got 3"),
    "vocab_size 0": (dict(vocab=0), "llama.vocab_size", "got 0"),
    "block_count a string": (dict(blocks="one"), "llama.block_count", "got 'one'"),
    "a NaN weight": (dict(nan=True), "blk.0.ffn_up.weight", "NaN or infinite", "(3, 5)"),
}


@pytest.mark.parametrize("kind", list(GGUF_BROKEN))
def test_a_gguf_file_with_impossible_counts_or_weights_is_refused(kind, tmp_path):
    from numpy_tf.interop.pretrained import load_gguf

    fields, *words = GGUF_BROKEN[kind]
    refused(load_gguf, _gguf_file(tmp_path / "m.gguf", **fields), *words)


def test_a_good_gguf_file_loads_and_broken_bytes_are_refused(tmp_path):
    from numpy_tf.interop.pretrained import load_gguf

    path = _gguf_file(tmp_path / "g.gguf")
    config, state, _ = load_gguf(path)
    assert config["num_attention_heads"] == 4 and len(state) == 11
    content = path.read_bytes()
    for name, broken, word in [("empty", b"", "not a GGUF file"),
                               ("text", b"hello world\n", "not a GGUF file"),
                               ("cut", content[:len(content) // 3], "beyond the end")]:
        (tmp_path / f"{name}.gguf").write_bytes(broken)
        refused(load_gguf, tmp_path / f"{name}.gguf", word)


# --- compare: what it did not compare never passes -------------------------------------------

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("compare") / "reference.npz"
    export_case("tiny-gpt", seed=2).save(path)
    return path


def _theirs(reference, tmp_path, change):
    arrays = load_npz(reference)
    del arrays["meta"]
    path = tmp_path / "theirs.npz"
    save_npz(path, change(arrays))
    return path


def _renamed(arrays):
    return {key.replace("blocks.", "h."): value for key, value in arrays.items()}


def test_renamed_tensors_fail_with_the_unmatched_listed_and_the_rename_suggested(
        reference, tmp_path, capsys):
    theirs = _theirs(reference, tmp_path, _renamed)
    result = compare_files(reference, theirs)
    unmatched = [key for key in load_npz(reference) if "blocks." in key]
    assert not result.passed and result.first_divergence is None
    assert result.missing == unmatched and len(unmatched) > 50
    assert main(["compare", str(reference), str(theirs)]) == 1
    out = capsys.readouterr().out
    assert "every shared tensor agrees" not in out
    assert f"FAILED: {len(unmatched)} of the reference's" in out
    assert "'blocks.' -> 'h.'" in out or "'blocks' -> 'h'" in out
    assert unmatched[0] in out
    assert main(["compare", str(reference), str(theirs), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["passed"] and data["missing"] == unmatched
    assert (data["suggested_rename"]["from"], data["suggested_rename"]["to"]) in \
        {("blocks", "h"), ("blocks.", "h.")}


def test_a_single_activation_fails_unless_partial_files_are_allowed(reference, tmp_path,
                                                                    capsys):
    theirs = _theirs(reference, tmp_path, lambda a: {"act/blocks.0.norm1":
                                                     a["act/blocks.0.norm1"]})
    assert not compare_files(reference, theirs).passed
    assert main(["compare", str(reference), str(theirs)]) == 1
    capsys.readouterr()
    partial = compare_files(reference, theirs, allow_missing=True)
    assert partial.passed and len(partial.rows) == 1
    assert main(["compare", str(reference), str(theirs), "--allow-missing"]) == 0
    assert "were not compared (--allow-missing)" in capsys.readouterr().out


def test_allow_missing_does_not_excuse_a_wrong_value(reference, tmp_path):
    theirs = _theirs(reference, tmp_path, lambda a: {"loss": a["loss"] + 1e-3})
    result = compare_files(reference, theirs, allow_missing=True)
    assert not result.passed and result.first_divergence.comparison.key == "loss"


def test_extra_tensors_in_theirs_are_listed_not_failed(reference, tmp_path, capsys):
    theirs = _theirs(reference, tmp_path, lambda a: {**a, "act/mine.only": np.zeros(3),
                                                     "debug": np.ones(2)})
    result = compare_files(reference, theirs)
    assert result.passed and result.only_theirs == ["act/mine.only", "debug"]
    assert main(["compare", str(reference), str(theirs)]) == 0
    assert "only in theirs (2): act/mine.only, debug" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["complex", "complex with zero imaginary part", "strings"])
def test_complex_or_string_values_are_refused(kind, reference, tmp_path, capsys):
    def change(arrays):
        logits = arrays["output/logits"]
        arrays["output/logits"] = {"complex": logits + 1j,
                                   "complex with zero imaginary part": logits + 0j,
                                   "strings": logits.astype(str)}[kind]
        return arrays

    theirs = _theirs(reference, tmp_path, change)
    refused(lambda path: compare_files(reference, path), theirs, "output/logits",
            "bool, integer or float")
    assert main(["compare", str(reference), str(theirs)]) == 2
    assert str(theirs) in capsys.readouterr().err


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_in_theirs_fails_there(value, reference, tmp_path):
    def change(arrays):
        arrays["act/blocks.1.norm2"] = arrays["act/blocks.1.norm2"].copy()
        arrays["act/blocks.1.norm2"][1, 2, 3] = value
        return arrays

    result = compare_files(reference, _theirs(reference, tmp_path, change))
    assert not result.passed
    assert result.first_divergence.comparison.key == "act/blocks.1.norm2"
    assert result.first_divergence.comparison.worst_index == (1, 2, 3)


@pytest.mark.parametrize("key, value, problem", [
    ("input/ids", lambda a: a.astype(np.float64), "dtype float64 for int64"),
    ("output/logits", lambda a: np.rint(a).astype(np.int64), "dtype int64 for float64"),
    ("output/logits", lambda a: a[:, :-1], "shape (2, 6, 20) for (2, 7, 20)"),
    ("loss", lambda a: a.reshape(1), "shape (1,) for ()")])
def test_a_tensor_of_the_wrong_shape_or_kind_of_number_diverges(key, value, problem, reference,
                                                                tmp_path, capsys):
    theirs = _theirs(reference, tmp_path, lambda a: {**a, key: value(a[key])})
    result = compare_files(reference, theirs)
    assert not result.passed and result.first_divergence.comparison.key == key
    assert result.first_divergence.problem == problem
    assert main(["compare", str(reference), str(theirs)]) == 1
    assert f"DIVERGES ({problem})" in capsys.readouterr().out


def test_an_empty_or_meta_only_file_is_refused(reference, tmp_path, capsys):
    for arrays, word in [({}, "an empty archive"), ({"meta": json_array({})}, "meta alone")]:
        theirs = tmp_path / "theirs.npz"
        save_npz(theirs, arrays)
        refused(lambda path: compare_files(reference, path), theirs, "holds no tensors", word)
        assert main(["compare", str(reference), str(theirs)]) == 2
        capsys.readouterr()


def test_the_rename_suggestion(reference):
    keys = list(load_npz(reference))
    renamed = _renamed({key: None for key in keys})
    missing = [key for key in keys if key not in renamed]
    extra = [key for key in renamed if key not in keys]
    rename = suggest_rename(missing, extra)
    assert (rename["from"], rename["to"]) in {("blocks", "h"), ("blocks.", "h.")}
    assert rename["matches"] == len(missing)
    prefixed = [key.replace("/", "/model.", 1) for key in keys if "/" in key]
    assert suggest_rename([k for k in keys if "/" in k], prefixed)["to"] == "model."
    assert suggest_rename(["act/a"], ["act/b"]) is None          # one pair is no pattern
    assert suggest_rename(missing, []) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
META_PLACES = ["format", "step", "rng", "optimizer", "model", "model.kind", "model.dtype",
               "model.config", *(f"model.config.{field}" for field in (
                   "vocab_size", "width", "heads", "layers", "max_context", "hidden", "tied",
                   "norm_eps", "dropout", "activation"))]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(META_PLACES), value=JSON)
def test_any_json_value_anywhere_in_a_checkpoint_meta_loads_or_is_refused(
        place, value, checkpoint_arrays, tmp_path):
    """A checkpoint whose meta holds any JSON value at any field: it loads (the value fits) or
    is refused with a FileFormatError naming the file; never a KeyError, TypeError,
    AttributeError, ZeroDivisionError or an allocation the file cannot back."""
    arrays, meta = checkpoint_arrays
    meta = json.loads(json.dumps(meta))
    *parents, last = place.split(".")
    node = meta
    for key in parents:
        node = node[key]
    node[last] = value
    path = tmp_path / "fuzzed.npz"
    save_npz(path, _with_meta(arrays, meta))
    try:
        load_checkpoint(path)
    except FileFormatError as error:
        assert str(error).startswith(str(path))


def test_resuming_from_a_checkpoint_without_usable_settings_is_refused(checkpoint_arrays,
                                                                       tmp_path):
    from numpy_tf.models.objectives import TargetLoss
    from numpy_tf.training.trainer import Trainer

    arrays, meta = checkpoint_arrays
    path = tmp_path / "c.npz"
    for settings, word in [(None, "holds no training settings"),
                           ({"steps": 10, "colour": 1}, "'colour'")]:
        save_npz(path, _with_meta(arrays, {**meta, "settings": settings}))
        refused(lambda p: Trainer.resume(load_checkpoint(p), TargetLoss, None), path, word)


def test_reading_some_members_still_checks_the_file(tmp_path):
    path = tmp_path / "f.npz"
    save_npz(path, {"meta": json_array({"kind": "x"}), "big": np.arange(5.0)})
    assert list(load_npz(path, ["meta"])) == ["meta"]
    path.write_bytes(path.read_bytes()[:-30])
    refused(lambda p: load_npz(p, ["meta"]), path, "truncated or damaged")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_gguf_file_loads_or_is_refused(data, tmp_path):
    """Cut or flip bytes of a good GGUF file: load_gguf reads it (a flipped weight is only a
    different number) or refuses it with a FileFormatError naming it."""
    from numpy_tf.interop.pretrained import load_gguf

    good = tmp_path / "good.gguf"
    if not good.exists():
        _gguf_file(good)
    path = tmp_path / "damaged.gguf"
    path.write_bytes(_corrupted(data, good.read_bytes()))
    try:
        load_gguf(path)
    except FileFormatError as error:
        assert str(error).startswith(str(path))


@pytest.mark.parametrize("position, what", [(16, "claims more entries"),     # key-value count
                                            (98, "llama.block_count")])     # 1 -> 2**31 + 1
def test_a_gguf_count_blown_up_is_refused_before_anything_is_allocated(position, what,
                                                                        tmp_path):
    """One flipped high bit in a count: gguf's reader would loop over 2**63 entries until
    memory runs out (11 GB when this was found); the layout walk refuses it first."""
    from numpy_tf.interop.pretrained import load_gguf

    content = bytearray(_gguf_file(tmp_path / "g.gguf").read_bytes())
    content[position + 3] ^= 0x80
    (tmp_path / "blown.gguf").write_bytes(bytes(content))
    refused(load_gguf, tmp_path / "blown.gguf", what)
