"""The committed fixtures: complete, well-formed, and every case has a numpy_tf builder."""
import json

import numpy as np

from numpy_tf.checking.case_file import SECTIONS, Case
from numpy_tf.checking.fixtures import case_name, fixtures_dir, known_kinds


def test_every_fixture_is_a_complete_case_with_both_dtypes():
    paths = sorted(fixtures_dir().glob("*.npz"))
    assert paths, "no fixtures found"
    names = {}
    for path in paths:
        case = Case.load(path)
        meta = case.meta
        for field in ("generator", "torch", "seed", "dtype", "kind", "config", "conventions",
                      "inputs"):
            assert field in meta, f"{path.name}: meta lacks {field}"
        assert meta["generator"].startswith("reference/")
        assert meta["torch"].startswith("2.13.0")
        assert meta["kind"] in known_kinds(), f"{path.name}: no runner for {meta['kind']}"
        assert path.stem.endswith(meta["dtype"])
        for key, array in case.arrays.items():
            assert key == "loss" or key.split("/")[0] in SECTIONS, f"{path.name}: {key}"
            if array.dtype.kind == "f":
                assert array.dtype == np.dtype(meta["dtype"]), f"{path.name}: {key}"
        names.setdefault(case_name(path), set()).add(meta["dtype"])
    assert all(dtypes == {"float32", "float64"} for dtypes in names.values()), names


def test_fixtures_are_small():
    """A budget for what the package carries: 230 cases of 11 model families and every layer
    took 10.6 MiB (the largest families about 1.5 MB each); twice the GPT-2 / Llama / BERT era's
    8 MiB leaves room for the next families, not for a careless case of megabytes."""
    total = sum(p.stat().st_size for p in fixtures_dir().glob("*.npz"))
    assert total < 16 * 2**20, f"fixtures take {total / 2**20:.1f} MB"


def test_meta_is_plain_json():
    path = next(fixtures_dir().glob("*.npz"))
    with np.load(path, allow_pickle=False) as data:
        assert json.loads(str(data["meta"][()]))["kind"]
