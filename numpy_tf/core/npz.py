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
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def save_npz(path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write {name: array} to `path` atomically (temporary file, then rename)."""
    path = Path(path)
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


def load_npz(path) -> dict[str, np.ndarray]:
    """{name: array} from an .npz file, in file order, loaded without pickle."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such .npz file: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (zipfile.BadZipFile, ValueError, OSError) as error:
        raise ValueError(f"{path} is not a readable .npz file ({error})") from None


def json_array(value) -> np.ndarray:
    """A 0-d unicode array holding `value` as JSON (how `meta` is stored without pickle)."""
    return np.array(json.dumps(value, sort_keys=True, indent=1))


def from_json_array(array: np.ndarray):
    return json.loads(str(array[()]))
