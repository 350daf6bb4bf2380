"""A gradcheck report as a picture: for every tensor checked, how far the backward's gradient
is from its finite-difference estimate, relative to the estimate.

    report = gradcheck(layernorm_forward, layernorm_backward, {"x": x, "weight": w, "bias": b})
    plot_gradcheck(report, path="layernorm_check.png")
"""
from __future__ import annotations

import numpy as np

from ..checking.finite_differences import GradcheckReport
from ..core.tolerances import FINITE_DIFFERENCE
from .figure import check_path, finish, new_figure

FLOOR = 1e-18           # an error of exactly 0 is drawn here (a log scale has no 0)


def plot_gradcheck(report: GradcheckReport, *, path=None):
    """One row per tensor of the report: ||a - n|| / ||n|| (bar) and the largest elementwise
    |a - n| / |n| (dot), a the backward's gradient and n the finite-difference estimate, on a
    log scale, with the row's verdict (failed rows in red). The dashed line is rtol, the
    relative part of the pass test |a - n| <= rtol |n| + atol max(1, S) (SPEC §6): where n is
    small the absolute part dominates, and a row may pass beyond the line.
    Returns the Figure (one axes); saves it to `path` if given (.png or .svg)."""
    path = check_path(path)
    if not isinstance(report, GradcheckReport) or not report.rows:
        raise TypeError("report must be a GradcheckReport with at least one row (what "
                        f"numpy_tf.gradcheck returns); got {type(report).__name__}")
    rows = report.rows
    names = [f"{row.name} {tuple(row.shape)}" for row in rows]
    norm = np.array([max(row.norm_rel_error, FLOOR) for row in rows])
    worst = np.array([max(row.max_rel_error, FLOOR) for row in rows])
    colors = ["tab:green" if row.passed else "tab:red" for row in rows]
    figure = new_figure(9.0, 1.8 + 0.38 * len(rows))
    axes = figure.add_subplot()
    places = np.arange(len(rows))[::-1]                              # the first row on top
    from matplotlib.lines import Line2D                # present: new_figure imported it
    from matplotlib.patches import Patch

    axes.barh(places, norm, color=colors, alpha=0.75, height=0.6)
    axes.scatter(worst, places, color="black", s=18, zorder=3)
    axes.axvline(FINITE_DIFFERENCE.rtol, color="0.4", linestyle="--", linewidth=1.0)
    legend = [Patch(color="0.6", alpha=0.75, label="||a - n|| / ||n|| (green: pass, red: FAIL)"),
              Line2D([], [], color="black", marker="o", linestyle="", markersize=4,
                     label="max |a - n| / |n|"),
              Line2D([], [], color="0.4", linestyle="--",
                     label=f"rtol = {FINITE_DIFFERENCE.rtol:g} (each element may also be off "
                           f"by atol {FINITE_DIFFERENCE.atol:g} max(1, S))")]
    axes.set_xscale("log")
    low = min(norm.min(), worst.min())
    high = max(norm.max(), worst.max(), FINITE_DIFFERENCE.rtol)
    axes.set_xlim(low / 10, high * 1e3)                  # room on the right for the verdicts
    axes.set_ylim(-0.6, len(rows) - 0.4)
    axes.set_yticks(places, names, fontsize=8)
    beside = axes.get_yaxis_transform()                 # x in axes fractions, y in rows
    for place, row in zip(places, rows):
        verdict = "pass" if row.passed else "FAIL"
        if row.zero:
            verdict += " (gradient ~ 0)"
        axes.text(0.99, place, verdict, transform=beside, ha="right", va="center", fontsize=8,
                  color="black" if row.passed else "tab:red")
    axes.set_xlabel("relative error of the backward against finite differences")
    verdict = "all passed" if report.passed else \
        f"{sum(not row.passed for row in rows)} of {len(rows)} FAILED"
    axes.set_title(f"gradcheck {report.title}\n{report.mode} finite differences in float64: "
                   f"{verdict}", fontsize=9)
    axes.grid(alpha=0.3, axis="x", which="major")
    figure.legend(handles=legend, fontsize=8, loc="outside lower center", ncols=2,
                  frameon=False)
    return finish(figure, path)
