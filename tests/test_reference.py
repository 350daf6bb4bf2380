"""reference/ stands on its own, and regenerating gives the committed arrays."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_reference_never_imports_numpy_tf():
    for path in (ROOT / "reference").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+numpy_tf", text, re.M), path.name


@pytest.mark.torch
@pytest.mark.parametrize("family", ["layers", "optim", "cbow"])
def test_regenerating_the_fixtures_gives_the_same_arrays(tmp_path, family):
    pytest.importorskip("torch")
    subprocess.run([sys.executable, str(ROOT / "reference" / "generate.py"), "--out",
                    str(tmp_path), "--only", family], check=True, capture_output=True)
    sys.path.insert(0, str(ROOT / "reference"))
    from compare import _load
    for path in tmp_path.glob("*.npz"):
        fresh, committed = _load(path), _load(ROOT / "reference" / "fixtures" / path.name)
        assert list(fresh) == list(committed)
        for key in fresh:
            assert fresh[key].tobytes() == committed[key].tobytes(), f"{path.name}/{key}"
