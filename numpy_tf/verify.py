"""Run numpy_tf on the committed torch cases and say how close it comes.

For every case file: build the numpy_tf module the case's `kind` and `config` describe, load the
torch parameters, run forward on the torch inputs and backward on the torch upstream gradient,
and compare every output and gradient with torch's under the tolerance of the case's dtype
(numpy_tf.tolerances). The float64 case of each name is also checked by finite differences.

This is what `numpy-tf check` prints and what the fixture tests assert.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .activations import GELU, ReLU, SiLU
from .cases import Case
from .core import Module
from .embedding import Embedding
from .gradcheck import GradcheckReport, gradcheck_module
from .linear import Linear
from .loss import CrossEntropyLoss
from .norm import LayerNorm, RMSNorm
from .positions import LearnedPositions, SinusoidalPositions
from .rope import RotaryEmbedding
from .softmax import LogSoftmax, Softmax
from .tolerances import Tolerance, torch_tolerance

# kind -> (config, dtype) -> the numpy_tf module equal to the torch module of the case
BUILDERS: dict[str, Callable[[dict, np.dtype], Module]] = {
    "linear": lambda c, dtype: Linear(c["in_features"], c["out_features"], c["bias"],
                                      dtype=dtype),
    "embedding": lambda c, dtype: Embedding(c["num_embeddings"], c["embedding_dim"],
                                            c["padding_idx"], dtype=dtype),
    "relu": lambda c, dtype: ReLU(dtype),
    "gelu": lambda c, dtype: GELU(c["approximate"], dtype),
    "silu": lambda c, dtype: SiLU(dtype),
    "softmax": lambda c, dtype: Softmax(c["dim"], dtype),
    "log_softmax": lambda c, dtype: LogSoftmax(c["dim"], dtype),
    "cross_entropy": lambda c, dtype: CrossEntropyLoss(c["ignore_index"],
                                                       c["label_smoothing"], c["reduction"],
                                                       dtype),
    "layernorm": lambda c, dtype: LayerNorm(c["normalized_shape"], c["eps"],
                                            c["elementwise_affine"], c["bias"], dtype),
    "rmsnorm": lambda c, dtype: RMSNorm(c["normalized_shape"], c["eps"],
                                        c["elementwise_affine"], dtype),
    "learned_positions": lambda c, dtype: LearnedPositions(c["max_context"], c["width"],
                                                           dtype=dtype),
    "sinusoidal_positions": lambda c, dtype: SinusoidalPositions(c["width"], dtype),
    "rope": lambda c, dtype: RotaryEmbedding(c["head_dim"], c["base"], c["interleaved"], dtype),
}

# kind -> a runner for cases that are not "one module, forward then backward" (an optimizer's
# steps, a whole model's loss): run(case) -> {key: array} for the keys the case holds, and
# gradcheck(case) -> GradcheckReport, or None when finite differences do not apply.
RUNNERS: dict[str, tuple[Callable[[Case], dict], Callable[[Case], GradcheckReport | None]]] = {}

SECTION_ORDER = ("loss", "output", "act", "grad_act", "grad_input", "grad")


def fixtures_dir() -> Path:
    """The committed cases: numpy_tf/fixtures in an installed package (setup.cfg maps
    reference/fixtures there), or reference/fixtures in a checkout."""
    package = Path(__file__).resolve().parent
    installed = package / "fixtures"
    if any(installed.glob("*.npz")):
        return installed
    return package.parent / "reference" / "fixtures"


def case_name(path: Path) -> str:
    """`layernorm_float32.npz` -> `layernorm`."""
    return re.sub(r"_(float32|float64)$", "", path.stem)


def known_kinds() -> list[str]:
    return sorted(set(BUILDERS) | set(RUNNERS))


def build_module(case: Case) -> Module:
    if case.kind not in BUILDERS:
        raise ValueError(f"case kind {case.kind!r} has no numpy_tf builder; known kinds: "
                         + ", ".join(known_kinds()))
    module = BUILDERS[case.kind](case.meta["config"], case.dtype)
    module.load_state_dict(case.section("param"))
    return module


def run_case(case: Case) -> dict[str, np.ndarray]:
    """numpy_tf's arrays for every output and gradient key the case holds."""
    if case.kind in RUNNERS:
        return RUNNERS[case.kind][0](case)
    module = build_module(case)
    inputs = case.inputs()
    out, cache = module.forward(*inputs)
    module.zero_grad()
    dinputs = module.backward(case.arrays["grad_output/out"], cache)
    if not isinstance(dinputs, tuple):
        dinputs = (dinputs,)
    produced = {"output/out": out}
    float_names = [name for name, value in zip(case.meta["inputs"], inputs)
                   if value is not None and value.dtype.kind == "f"]
    for name, gradient in zip(float_names, dinputs):
        if gradient is not None:
            produced[f"grad_input/{name}"] = gradient
    for name, gradient in module.grad_dict().items():
        produced[f"grad/{name}"] = gradient
    return produced


@dataclass
class TensorComparison:
    key: str
    max_abs_error: float
    max_rel_error: float
    worst_index: tuple | None
    passed: bool


@dataclass
class CaseResult:
    name: str
    path: str
    kind: str
    dtype: str
    comparisons: list[TensorComparison] = field(default_factory=list)
    gradcheck: GradcheckReport | None = None
    error: str | None = None        # an exception while running numpy_tf on the case

    @property
    def passed(self) -> bool:
        return (self.error is None and all(c.passed for c in self.comparisons)
                and (self.gradcheck is None or self.gradcheck.passed))

    def max_error(self, sections) -> float:
        errors = [c.max_abs_error for c in self.comparisons
                  if c.key.split("/")[0] in sections]
        return max(errors, default=float("nan"))

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "kind": self.kind, "dtype": self.dtype,
                "passed": self.passed, "error": self.error,
                "forward_max_abs_error": self.max_error(("output", "loss", "act")),
                "backward_max_abs_error": self.max_error(("grad", "grad_input", "grad_act")),
                "tensors": [c.__dict__ | {"worst_index": None if c.worst_index is None
                                          else list(c.worst_index)}
                            for c in self.comparisons],
                "gradcheck": None if self.gradcheck is None else self.gradcheck.to_dict()}


def compare_arrays(key: str, ours: np.ndarray, theirs: np.ndarray,
                   tolerance: Tolerance) -> TensorComparison:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.shape != theirs.shape:
        return TensorComparison(key, float("inf"), float("inf"), None, False)
    error = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    magnitude = np.abs(theirs.astype(np.float64))
    within = tolerance.within(ours, theirs)
    if error.size == 0:
        return TensorComparison(key, 0.0, 0.0, None, True)
    worst_score = np.where(np.isnan(error), np.inf,
                           error / (tolerance.atol + tolerance.rtol * magnitude))
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(worst_score), error.shape))
    nonzero = magnitude > 0
    max_rel = float((error[nonzero] / magnitude[nonzero]).max(initial=0.0))
    return TensorComparison(key, float(np.nanmax(error)) if not np.isnan(error).all()
                            else float("nan"), max_rel, worst, bool(within.all()))


def compare_case(case: Case, produced: dict[str, np.ndarray]) -> list[TensorComparison]:
    """One comparison per output/gradient key of the case (a key numpy_tf did not produce
    fails), in SECTION_ORDER."""
    tolerance = torch_tolerance(case.dtype, case.meta.get("level", "layer"))
    keys = [key for key in case.arrays if key.split("/")[0] in SECTION_ORDER]
    keys.sort(key=lambda key: SECTION_ORDER.index(key.split("/")[0]))
    results = []
    for key in keys:
        if key not in produced:
            results.append(TensorComparison(key, float("inf"), float("inf"), None, False))
        else:
            results.append(compare_arrays(key, produced[key], case.arrays[key], tolerance))
    return results


def gradcheck_case(case: Case, fast: bool | None = None,
                   title: str = "") -> GradcheckReport | None:
    """Finite differences of numpy_tf's own forward at the case's inputs and parameters
    (in float64); full for a layer, random directions for a model."""
    if case.kind in RUNNERS:
        return RUNNERS[case.kind][1](case)
    module = build_module(case)
    if fast is None:
        fast = case.meta.get("level", "layer") == "model"
    return gradcheck_module(module, *case.inputs(), fast=fast, title=title or case.kind)


def check_file(path: Path, with_gradcheck: bool = True) -> CaseResult:
    path = Path(path)
    try:
        case = Case.load(path)
    except Exception as error:     # a broken file is a failed row, not a crash
        return CaseResult(case_name(path), str(path), "?", "?", error=str(error))
    result = CaseResult(case_name(path), str(path), case.kind, case.meta["dtype"])
    try:
        result.comparisons = compare_case(case, run_case(case))
        if with_gradcheck:
            result.gradcheck = gradcheck_case(case, title=result.name)
    except Exception as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


def check_all(directory: Path | None = None, pattern: str = "*") -> list[CaseResult]:
    """Every case in `directory` (default: the committed fixtures); finite differences on the
    float64 case of each name."""
    directory = fixtures_dir() if directory is None else Path(directory)
    paths = sorted(directory.glob(f"{pattern}.npz"))
    return [check_file(path, with_gradcheck=path.stem.endswith("float64")) for path in paths]
