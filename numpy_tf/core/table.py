"""The one plain-text table printer behind every report numpy_tf prints (`numpy-tf check`,
`grade`, `compare`, `gradcheck`, `params`).

    print(format_table(("tensor", "shape", "verdict"), rows))

Each column is as wide as its widest cell (the header included), columns are separated by two
spaces, and no line ends in spaces. A column is left-aligned unless `align` says "r" for it
(counts read best right-aligned, so their digits line up).
"""
from __future__ import annotations

from typing import Iterable, Sequence


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "",
                 sep: str = "  ") -> str:
    """The header and the rows as aligned lines joined by newlines. `align` holds one letter per
    column, "l" or "r" (missing letters are "l"); every row must have the header's length."""
    table = [tuple(str(cell) for cell in header)] + [tuple(str(cell) for cell in row)
                                                     for row in rows]
    columns = len(table[0])
    bad = [row for row in table if len(row) != columns]
    if bad:
        raise ValueError(f"every row must have {columns} cells, as the header; got "
                         f"{len(bad[0])} in {bad[0]!r}")
    if set(align) - {"l", "r"} or len(align) > columns:
        raise ValueError(f"align must be at most {columns} letters 'l' or 'r'; got {align!r}")
    align = align.ljust(columns, "l")
    widths = [max(len(row[i]) for row in table) for i in range(columns)]
    return "\n".join(
        sep.join(cell.rjust(width) if side == "r" else cell.ljust(width)
                 for cell, width, side in zip(row, widths, align)).rstrip()
        for row in table)
