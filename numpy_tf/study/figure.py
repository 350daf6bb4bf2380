"""What every picture of the study folder shares: matplotlib (an optional extra, imported only
here, inside functions), a Figure drawn by the Agg renderer (never a screen), and saving to PNG
or SVG by the file's suffix.

Each plot_* function returns its matplotlib Figure (look at it in a notebook, or inspect its
axes) and, given `path`, also saves it there:

    fig = plot_sinusoidal(64, 32, path="positions.png")
"""
from __future__ import annotations

import os
from pathlib import Path

SUFFIXES = (".png", ".svg")
INSTALL = "pip install 'numpy-tf[plot]'"


def check_path(path) -> Path | None:
    """`path` as a Path, refused before any drawing unless it ends in .png or .svg."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be None or a file path ending in .png or .svg; got "
                        f"{type(path).__name__}")
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"path must end in .png or .svg (the picture's format); got "
                         f"{str(path)!r}")
    return path


def new_figure(width: float, height: float):
    """An empty matplotlib Figure of width x height inches on an Agg canvas, laid out by
    matplotlib's constrained layout (labels do not overlap their neighbours)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"drawing needs matplotlib, an optional extra of numpy_tf: {INSTALL}"
                          ) from None
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def finish(figure, path):
    """Save `figure` to `path` (if given; PNG at 150 dots per inch, or SVG) and return it."""
    path = check_path(path)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format=path.suffix[1:].lower(), dpi=150)
    return figure


def token_label(token: str) -> str:
    """A token as a tick label: a space shows as '␣' (a leading space is part of many tokens),
    newlines and tabs as \\n and \\t, so that no label is blank or spans two lines; a $ is
    escaped (matplotlib would read $...$ as mathematics)."""
    return (str(token).replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
            .replace(" ", "␣").replace("$", r"\$"))
