"""Pictures of positions: the sinusoidal table added to the embeddings, and RoPE rotating the
pairs of a query or key vector as its position grows, in both of RoPE's layouts. Everything
drawn is computed by numpy_tf's own sinusoidal_table and rope_forward.

    plot_sinusoidal(64, 32, path="sinusoids.png")
    plot_rope(head_dim=8, positions=24, path="rope.png")
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from ..layers.positions import SINUSOID_BASE, inverse_frequencies, sinusoidal_table
from ..layers.rope import rope_forward
from .figure import check_path, finish, new_figure


def plot_sinusoidal(length: int = 64, width: int = 32, *, path=None):
    """Left: the table PE (length, width), position down, feature across (even features sin,
    odd cos, of frequencies falling from 1 to 1/10000). Right: PE(t, 2i) against t for a few
    pairs i, one wavelength 2 pi / omega_i each. Returns the Figure (table, curves, colour
    bar); saves it to `path` if given (.png or .svg)."""
    path = check_path(path)
    length = validate.positive_int("length", length)
    table = sinusoidal_table(length, width)                                  # (T, C)
    omegas = inverse_frequencies(width, SINUSOID_BASE, np.float64)            # (C/2,)
    figure = new_figure(12.0, 4.6)
    left, right = figure.subplots(1, 2, width_ratios=[1.0, 1.3])
    image = left.imshow(table, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto",
                        interpolation="nearest")
    left.set_xlabel("feature (2i: sin, 2i + 1: cos)")
    left.set_ylabel("position t")
    left.set_title(f"sinusoidal positions, {length} x {width}")
    figure.colorbar(image, ax=left, shrink=0.8)
    positions = np.arange(length)
    wavelengths = 2 * np.pi / omegas                                          # (C/2,)
    visible = np.flatnonzero((wavelengths >= 10.0) & (wavelengths <= 4.0 * length))
    pairs = visible[np.unique(np.linspace(0, len(visible) - 1, 4).round().astype(int))] \
        if len(visible) else np.array([width // 2 - 1])
    for i in pairs:
        right.plot(positions, table[:, 2 * i], marker=".", markersize=4, linewidth=1.2,
                   label=f"PE(t, {2 * i}), wavelength {wavelengths[i]:.3g}")
    right.set_xlabel("position t")
    right.set_ylabel("value")
    right.set_ylim(-1.15, 1.15)
    right.set_title("one sine per pair, slower for larger i (dots: the positions)")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    right.grid(alpha=0.3)
    return finish(figure, path)


def rotated_positions(vector: np.ndarray, positions: int, interleaved: bool,
                      base: float = 10000.0) -> np.ndarray:
    """The vector rotated by RoPE at positions 0 .. positions - 1: (positions, D), rope_forward
    applied to one head holding the same vector at every position."""
    x = np.broadcast_to(vector, (1, 1, positions, vector.shape[-1])).copy()  # (1, 1, T, D)
    out, _ = rope_forward(x, np.arange(positions), base, interleaved)
    return out[0, 0]                                                         # (T, D)


def plot_rope(head_dim: int = 8, positions: int = 24, *, base: float = 10000.0, vector=None,
              seed: int = 0, path=None):
    """RoPE at work on one vector (default: drawn from N(0, 1) with `seed`), in both layouts
    (top row: interleaved pairs (x_2i, x_2i+1); bottom row: halves (x_i, x_i+D/2)).

    First column: the rotated vector at each position, feature across. Then one panel per
    pair: the pair (a, b) at positions 0 .. positions - 1, dark to light, on its circle, each
    step turning by omega_i = base^(-2i/D): the first pairs spin fast, the last ones barely.
    Returns the Figure (2 x (1 + D/2) panels, then the colour bar); saves it to `path` if
    given (.png or .svg)."""
    path = check_path(path)
    head_dim = validate.even_positive_int("head_dim", head_dim, "rotations act on pairs")
    positions = validate.positive_int("positions", positions)
    if vector is None:
        vector = np.random.default_rng(seed).standard_normal(head_dim)
    vector = np.asarray(vector, dtype=np.float64)
    if vector.shape != (head_dim,):
        raise ValueError(f"vector must have shape ({head_dim},) (head_dim); got {vector.shape}")
    omegas = inverse_frequencies(head_dim, base, np.float64)
    half = head_dim // 2
    from matplotlib import colormaps              # present: new_figure has imported it

    shades = colormaps["viridis"](np.linspace(0.0, 1.0, positions))
    figure = new_figure(2.3 * (half + 1) + 0.8, 5.4)
    panels = figure.subplots(2, half + 1)
    limit = 1.1 * np.abs(vector).max()
    for row, interleaved in enumerate((True, False)):
        rotated = rotated_positions(vector, positions, interleaved, base)   # (T, D)
        layout = "interleaved" if interleaved else "halves"
        image = panels[row, 0].imshow(rotated, cmap="RdBu_r", vmin=-limit, vmax=limit,
                                      aspect="auto", interpolation="nearest")
        panels[row, 0].set_title(f"{layout}: R_t x", fontsize=9)
        panels[row, 0].set_xlabel("feature", fontsize=8)
        panels[row, 0].set_ylabel("position t", fontsize=8)
        for i in range(half):
            first, second = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            axes = panels[row, i + 1]
            radius = np.hypot(vector[first], vector[second])
            circle = np.linspace(0.0, 2 * np.pi, 200)
            axes.plot(radius * np.cos(circle), radius * np.sin(circle), color="0.85",
                      linewidth=0.8)
            axes.scatter(rotated[:, first], rotated[:, second], c=shades, s=14, zorder=3)
            axes.annotate("t = 0", (rotated[0, first], rotated[0, second]), fontsize=7,
                          xytext=(4, -10), textcoords="offset points")
            reach = 1.25 * max(radius, 1e-12)
            axes.set_xlim(-reach, reach)
            axes.set_ylim(-reach, reach)
            axes.set_aspect("equal")
            axes.axhline(0.0, color="0.9", linewidth=0.6, zorder=0)
            axes.axvline(0.0, color="0.9", linewidth=0.6, zorder=0)
            axes.set_title(f"pair {i}: (x{first}, x{second}), |pair| {radius:.2f}\n"
                           f"omega = {omegas[i]:.3g} per position", fontsize=8)
            axes.set_xticks([])
            axes.set_yticks([])
    figure.colorbar(image, ax=panels[:, 0], location="right", shrink=0.7, pad=0.02)
    figure.suptitle(f"RoPE rotating one {head_dim}-dimensional vector over positions 0 .. "
                    f"{positions - 1} (dots dark to light)", fontsize=10)
    return finish(figure, path)
