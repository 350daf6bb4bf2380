"""The file format: no pickle, atomic saves, deterministic bytes."""
import os
import pickle
import zipfile

import numpy as np
import pytest

from numpy_tf.checking.case_file import Case
from numpy_tf.core.npz import load_npz, save_npz


def test_roundtrip_keeps_dtype_shape_order_and_zero_d(tmp_path):
    arrays = {"b/x": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array(3.5),
              "ids": np.array([[1, 2]], dtype=np.int16), "text": np.array("héllo")}
    save_npz(tmp_path / "f.npz", arrays)
    loaded = load_npz(tmp_path / "f.npz")
    assert list(loaded) == list(arrays)
    for key in arrays:
        assert loaded[key].dtype == arrays[key].dtype and loaded[key].shape == arrays[key].shape
        np.testing.assert_array_equal(loaded[key], arrays[key])


def test_same_arrays_same_bytes(tmp_path):
    arrays = {"x": np.linspace(0, 1, 7)}
    save_npz(tmp_path / "1.npz", arrays)
    save_npz(tmp_path / "2.npz", arrays)
    assert (tmp_path / "1.npz").read_bytes() == (tmp_path / "2.npz").read_bytes()


def test_interrupted_save_keeps_the_previous_file(tmp_path):
    path = tmp_path / "checkpoint.npz"
    save_npz(path, {"x": np.zeros(3)})

    class Interrupt:
        def __array__(self, dtype=None, copy=None):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_npz(path, {"x": np.ones(3), "y": Interrupt()})
    np.testing.assert_array_equal(load_npz(path)["x"], np.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.npz"]   # no temporary left


def test_pickled_content_is_refused(tmp_path):
    path = tmp_path / "evil.npz"
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open("x.npy", "w") as member:
            np.lib.format.write_array(member, np.array([{"a": 1}], dtype=object),
                                      allow_pickle=True)
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_npz(path)
    with pytest.raises(TypeError, match="without pickle"):
        save_npz(tmp_path / "o.npz", {"x": np.array([None], dtype=object)})


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such .npz file"):
        load_npz(tmp_path / "absent.npz")
    (tmp_path / "junk.npz").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_npz(tmp_path / "junk.npz")


def test_case_meta_roundtrip(tmp_path):
    case = Case({"kind": "linear", "dtype": "float64", "inputs": ["x"]},
                {"input/x": np.ones((1, 2)), "param/weight": np.ones((3, 2))})
    case.save(tmp_path / "c.npz")
    loaded = Case.load(tmp_path / "c.npz")
    assert loaded.meta == case.meta and loaded.section("param")["weight"].shape == (3, 2)
    with pytest.raises(ValueError, match="no 'meta'"):
        save_npz(tmp_path / "n.npz", {"x": np.ones(1)})
        Case.load(tmp_path / "n.npz")
    assert os.path.exists(tmp_path / "n.npz")
