"""Jupyter notebooks as plain JSON (nbformat 4), with no extra installed.

    text = notebook([("markdown", "# Homework"), ("code", "import numpy as np")])
    source, cells = notebook_code("alice.ipynb")   # the code cells as one Python file

notebook_code is how a notebook is graded: its code cells in order, one blank line between
them, IPython's magics and shell lines (a line starting with % or !) left out (blank, so
that every line keeps its place); `cells[i]` is the (cell, line) of the source's line i + 1, both
counted from 1 as Jupyter shows them.
"""
from __future__ import annotations

import json
from pathlib import Path


def notebook(cells: list[tuple[str, str]]) -> str:
    """The text of a .ipynb holding `cells`: (kind "code" or "markdown", source)."""
    def cell(number: int, kind: str, source: str) -> dict:
        lines = source.splitlines(keepends=True)
        entry = {"cell_type": kind, "id": f"cell-{number}", "metadata": {}, "source": lines}
        if kind == "code":
            entry.update(execution_count=None, outputs=[])
        return entry
    return json.dumps({
        "cells": [cell(number, kind, source) for number, (kind, source) in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def notebook_code(path) -> tuple[str, list[tuple[int, int]]]:
    """(the code cells as one source text, the (cell, line) of each of its lines); a file
    that is not a notebook is a ValueError naming it."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        cells = document["cells"]
        assert isinstance(cells, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise ValueError(f"{path} is not a Jupyter notebook (nbformat 4 JSON with a 'cells' "
                         "list)") from None
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        for line_number, line in enumerate(source.splitlines(), start=1):
            magic = line.lstrip().startswith(("%", "!"))
            lines.append("" if magic else line)
            places.append((number, line_number))
        lines.append("")
        places.append((number, len(source.splitlines()) + 1))
    return "\n".join(lines) + "\n", places
