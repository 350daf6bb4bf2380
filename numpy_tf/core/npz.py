"""Reading and writing .npz files the safe way: never pickle, never a half-written file.

`save_npz` writes every array as a .npy member of a zip with fixed timestamps, in the given
order, to a temporary file in the same folder, then renames it over the target: an interrupted
save leaves the previous file intact, and the same arrays always give the same bytes. A save
that is interrupted (an exception, Ctrl-C) removes its temporary file; one killed outright
(SIGKILL, a power cut) cannot, so each save first removes the temporaries that earlier saves
to the same path left behind (`.NAME.*.tmp` beside it: two processes must not write one path
at the same time).
`load_npz` reads with allow_pickle=False, so a file can never run code.

This file imports nothing of numpy_tf.
"""
from __future__ import annotations

import glob
import json
import math
import os
import tempfile
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def file_path(path) -> Path:
    """`path` as a Path: a str or os.PathLike, else a TypeError naming it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (a str or os.PathLike); got "
                        f"{type(path).__name__}")
    return Path(path)


def save_npz(path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write {name: array} to `path` atomically (temporary file, then rename). A folder at
    `path` is refused before anything is written."""
    path = file_path(path)
    if path.is_dir():
        raise IsADirectoryError(f"path {path} is a folder; an .npz is written to a file (give "
                                "a file name in it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_temporaries(path):
        stale.unlink(missing_ok=True)
    temporary = None
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                                 dir=path.parent)
        with os.fdopen(descriptor, "wb") as handle:
            with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
                for name, array in arrays.items():
                    array = np.asarray(array)
                    if array.dtype.hasobject:
                        raise TypeError(f"{name}: object arrays cannot be saved without pickle")
                    info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                    info.external_attr = 0o644 << 16
                    with archive.open(info, "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, np.asarray(array),
                                                  allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)                 # mkstemp makes the file private (0600); give it
        os.umask(umask)                     # the permissions a plain open() would
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
        raise


def stale_temporaries(path) -> list[Path]:
    """The temporary files that saves to `path` left behind (killed before they could remove
    them): `.NAME.<random>.tmp` in the same folder."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


class FileFormatError(ValueError):
    """A file that is not what its reader expects: empty, truncated, not a zip, pickled data,
    a member of the wrong name, dtype or shape, a missing or malformed metadata field. Every
    loader of numpy_tf raises it (a missing file is a FileNotFoundError), with a message of the
    form "<path>: <what is wrong> (expected ..., got ...)". A ValueError, so code that caught
    ValueError before keeps working."""


def bad_file(path, what: str, expected=None, got=None) -> FileFormatError:
    """The FileFormatError "<path>: <what> (expected <expected>, got <got>)"."""
    detail = f" (expected {expected}, got {got})" if expected is not None else ""
    return FileFormatError(f"{path}: {what}{detail}")


def require_file(path, what: str = "file") -> Path:
    """`path` as a Path, or a FileNotFoundError naming it (a folder is not a file either)."""
    path = file_path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a folder, not a {what}")
    if not path.is_file():
        raise FileNotFoundError(f"no such {what}: {path}")
    return path


_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"                  # a zip of no members starts at its end record
_NPZ = "not a readable .npz file"


def load_npz(path, names=None) -> dict[str, np.ndarray]:
    """{name: array} from an .npz file, in file order, loaded without pickle (with `names`,
    only those members are read: `load_npz(path, ["meta"])`).

    Read member by member with zipfile and the .npy header (never np.load's guessing, which
    calls a file that is not a zip "pickled data"), so every way a file can be malformed is a
    FileFormatError naming the file: empty, not a zip, truncated or damaged (CRC), a member not
    named *.npy or named twice, a header that promises more bytes than the member holds, an
    object (pickled) array."""
    path = require_file(path, ".npz file")
    size = path.stat().st_size
    if size == 0:
        raise bad_file(path, f"{_NPZ}: the file is empty", "a zip of .npy members", "0 bytes")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head not in (_ZIP_MAGIC, _EMPTY_ZIP_MAGIC):
        raise bad_file(path, f"{_NPZ}: it is not a zip archive",
                       f"a zip of .npy members, starting with {_ZIP_MAGIC!r}",
                       f"{size} bytes starting with {head!r}")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as error:
        raise bad_file(path, f"{_NPZ}: the zip archive is truncated or damaged (zipfile: {error})",
                       "a complete zip archive", f"{size} bytes") from None
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy") or info.is_dir():
                raise bad_file(path, f"{_NPZ}: member {info.filename!r} is not an array",
                               "only .npy members", repr(info.filename))
            name = info.filename[:-len(".npy")]
            if name in arrays:
                raise bad_file(path, f"{_NPZ}: member {info.filename!r} appears twice",
                               "each name once", "two members of that name")
            arrays[name] = _read_member(path, archive, info) if names is None or name in names \
                else None
    return {name: array for name, array in arrays.items() if array is not None}


def _read_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    where = f"{_NPZ}: member {info.filename!r}"
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or info.flag_bits & 1:
        raise bad_file(path, f"{where} is encrypted or compressed in a way .npz files are not",
                       "stored or deflated, unencrypted",
                       f"compression {info.compress_type}, flags {info.flag_bits:#x}")
    try:
        with archive.open(info) as member:
            return _read_npy(path, member, info.file_size, where)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error, NotImplementedError,
            RuntimeError) as error:      # the last two: a local header contradicting the index
        raise bad_file(path, f"{where} is damaged ({type(error).__name__}: {error})") from None


def load_npy(path) -> np.ndarray:
    """The array of an .npy file, loaded without pickle; a malformed file (empty, not .npy,
    truncated, object data) is a FileFormatError naming it."""
    path = require_file(path, ".npy file")
    size = path.stat().st_size
    where = "not a readable .npy file: the array"
    with open(path, "rb") as handle:
        head = handle.read(len(_NPY_MAGIC))
        if head != _NPY_MAGIC:
            raise bad_file(path, "not a readable .npy file: it does not start as one does",
                           repr(_NPY_MAGIC), f"{size} bytes starting with {head!r}")
        handle.seek(0)
        try:
            return _read_npy(path, handle, size, where)
        except FileFormatError:
            raise
        except (OSError, EOFError, ValueError) as error:
            raise bad_file(path, f"{where} ({type(error).__name__}: {error})") from None


_NPY_MAGIC = b"\x93NUMPY"


def _read_npy(path: Path, stream, size: int, where: str) -> np.ndarray:
    """One .npy array from `stream` (`size` bytes long): header first, so that a header that
    promises more than the stream holds is refused before any memory is allocated."""
    version = np.lib.format.read_magic(stream)
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise bad_file(path, f"{where} has an .npy version numpy_tf does not read",
                       "version 1.0 or 2.0", f"{version[0]}.{version[1]}")
    try:
        shape, fortran, dtype = readers[version](stream)
    except (ValueError, SyntaxError, TypeError, tokenize.TokenError) as error:
        # NumPy parses the header (a Python dict literal) with ast.literal_eval
        raise bad_file(path, f"{where} has a damaged header ({type(error).__name__}: "
                       f"{error})") from None
    if dtype.hasobject:
        raise bad_file(path, f"{where} holds object (pickled) data, which numpy_tf never loads",
                       "numbers or strings", f"dtype {dtype}")
    count = math.prod(shape)
    expected = count * dtype.itemsize
    if expected > size:
        raise bad_file(path, f"{where} is shorter than its header says",
                       f"{expected} bytes of data for shape {shape} {dtype}",
                       f"{size} bytes in all")
    data = stream.read(expected)
    if len(data) != expected:
        raise bad_file(path, f"{where} is truncated",
                       f"{expected} bytes of data for shape {shape} {dtype}", len(data))
    if stream.read(1):                             # (in a zip, reading to the end checks the CRC)
        raise bad_file(path, f"{where} holds bytes after its array",
                       f"{expected} bytes of data for shape {shape} {dtype}", "more")
    array = np.frombuffer(bytearray(data), dtype=dtype, count=count)   # writable, own memory
    return array.reshape(shape, order="F" if fortran else "C")


def json_array(value) -> np.ndarray:
    """A 0-d unicode array holding `value` as JSON (how `meta` is stored without pickle)."""
    return np.array(json.dumps(value, sort_keys=True, indent=1))


def from_json_array(array: np.ndarray, path=None, name: str = "meta", kind: type | None = None):
    """The value a json_array holds. With `path`, a malformed one (not a 0-d string, not JSON,
    not of type `kind`) is a FileFormatError naming the file and the entry."""
    where = f"{path if path is not None else '<arrays>'}: entry {name!r}"
    if array.ndim != 0 or array.dtype.kind not in "US":
        raise FileFormatError(f"{where} is not JSON text (expected a 0-d string array, got "
                              f"shape {array.shape} dtype {array.dtype})")
    text = array[()]
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FileFormatError(f"{where} is not UTF-8 text ({error})") from None
    try:
        value = json.loads(str(text))
    except json.JSONDecodeError as error:
        raise FileFormatError(f"{where} is not valid JSON ({error}; got "
                              f"{_preview(str(text))})") from None
    if kind is not None and not isinstance(value, kind):
        raise FileFormatError(f"{where} must hold a JSON {_JSON_NAMES.get(kind, kind.__name__)} "
                              f"(expected {_JSON_NAMES.get(kind, kind.__name__)}, got "
                              f"{type(value).__name__} {_preview(json.dumps(value))})")
    return value


_JSON_NAMES = {dict: "object", list: "array", str: "string"}


def _preview(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
