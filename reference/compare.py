"""`python reference/compare.py NEW_DIR COMMITTED_DIR`: exit 1 unless both folders hold the same
case files with the same keys, the same meta and bit-identical arrays (dtype, shape, values)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def _load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def compare(new_dir: Path, committed_dir: Path) -> list[str]:
    problems = []
    new = {p.name for p in new_dir.glob("*.npz")}
    committed = {p.name for p in committed_dir.glob("*.npz")}
    problems += [f"{name}: committed but not regenerated" for name in sorted(committed - new)]
    problems += [f"{name}: regenerated but not committed" for name in sorted(new - committed)]
    for name in sorted(new & committed):
        a, b = _load(new_dir / name), _load(committed_dir / name)
        if list(a) != list(b):
            problems.append(f"{name}: keys differ: {sorted(set(a) ^ set(b))}")
            continue
        for key in a:
            x, y = a[key], b[key]
            if x.dtype != y.dtype or x.shape != y.shape:
                problems.append(f"{name}/{key}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
            elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                problems.append(f"{name}/{key}: values differ")
    return problems


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__)
        return 2
    new_dir, committed_dir = map(Path, argv)
    problems = compare(new_dir, committed_dir)
    for problem in problems:
        print(problem)
    count = len(list(committed_dir.glob("*.npz")))
    print(f"{count} committed fixtures: " + ("identical" if not problems else
                                              f"{len(problems)} differences"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
