"""What "equal" means in numpy_tf: one table, per dtype, each entry with the measurement behind it.

Agreement with torch (`TORCH`) is elementwise, as numpy.allclose:

    |ours - torch| <= atol + rtol * |torch|

A finite-difference check (`FINITE_DIFFERENCE`) compares the analytic gradient a with the central
difference n, elementwise, scaled by the largest |n| of the tensor, because where the true
gradient is near zero the difference noise dominates any per-element relative error:

    |a - n| <= rtol * |n| + atol * max(1, max |n|)

This file imports nothing of numpy_tf.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str

    def within(self, ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Elementwise verdict |ours - reference| <= atol + rtol |reference| (NaNs fail)."""
        ours = np.asarray(ours, dtype=np.float64)
        reference = np.asarray(reference, dtype=np.float64)
        return np.abs(ours - reference) <= self.atol + self.rtol * np.abs(reference)


# Agreement with torch fixtures, per dtype and level (a single layer, or a whole model whose
# errors compound through every block).
TORCH = {
    ("layer", "float64"): Tolerance(
        1e-10, 1e-12,
        "SPEC §6. Measured (numpy-tf check, 2026-11-29): the largest float64 error of any layer "
        "against torch is below 2e-15 absolute; the bound leaves room for other BLAS builds."),
    ("layer", "float32"): Tolerance(
        1e-5, 1e-6,
        "SPEC §6. float32 has eps 1.2e-7; a reduction over a few hundred terms loses a few "
        "ulps, measured below 2e-6 relative on the committed fixtures."),
    ("model", "float64"): Tolerance(
        1e-9, 1e-12,
        "SPEC §6: a whole model (several blocks, summed parameter gradients)."),
    ("model", "float32"): Tolerance(
        1e-4, 1e-6,
        "SPEC §6: float32 rounding compounds through every block and every gradient sum."),
}

# Central differences in float64 with step FD_STEP and a random upstream gradient.
FD_STEP = 1e-6
FINITE_DIFFERENCE = Tolerance(
    1e-6, 1e-8,
    "SPEC §6. With step 1e-6 the truncation error is about 1e-12 |f'''| and the rounding error "
    "about 1e-16 |f| / 1e-6 = 1e-10 |f|; measured norm-relative errors are below 1e-8.")
# The fast (random-direction) mode compares two scalars per direction.
FAST_DIRECTIONAL = Tolerance(
    1e-6, 0.0,
    "SPEC §6: <g, (f(x + h v) - f(x - h v)) / 2h> against <J^T g, v>, relative.")


def torch_tolerance(dtype, level: str = "layer") -> Tolerance:
    """The tolerance against torch for arrays of `dtype` at `level` ("layer" or "model")."""
    return TORCH[(level, np.dtype(dtype).name)]
