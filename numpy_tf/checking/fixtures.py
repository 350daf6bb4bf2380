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

from ..core.module import Module, Parameter
from ..core.npz import from_json_array, load_npz
from ..core.tolerances import Tolerance, torch_tolerance
from ..interop import from_hf, to_hf, torch_equivalent
from ..layers.activations import GELU, ReLU, SiLU
from ..layers.attention import ScaledDotProductAttention
from ..layers.cross_entropy_loss import CrossEntropyLoss, cross_entropy
from ..layers.embedding import Embedding
from ..layers.linear import Linear
from ..layers.mlp import SwiGLU, feedforward
from ..layers.moe import SparseMoE
from ..layers.multihead import MultiHeadAttention
from ..layers.neox_attention import NeoXAttention
from ..layers.norm import LayerNorm, RMSNorm
from ..layers.positions import LearnedPositions, SinusoidalPositions
from ..layers.rope import RotaryEmbedding
from ..layers.softcap import SoftCap
from ..layers.softmax import LogSoftmax, Softmax
from ..models import registry
from ..models.cbow import CBOW
from ..optim import SGD, Adam, AdamW, clip_grad_norm
from ..optim.schedule import warmup_cosine
from .case_file import Case
from .finite_differences import GradcheckReport, gradcheck_module

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
    "sdpa": lambda c, dtype: ScaledDotProductAttention(c["is_causal"], dtype=dtype),
    "multihead_attention": lambda c, dtype: torch_equivalent("multihead_attention", c, dtype),
    "transformer": lambda c, dtype: torch_equivalent("transformer", c, dtype),
    "neox_attention": lambda c, dtype: NeoXAttention(
        c["hidden_size"], c["num_attention_heads"], c["rotary_dim"], c["rope_theta"],
        c["attention_bias"], dtype=dtype),
    "gqa_attention": lambda c, dtype: MultiHeadAttention(
        c["width"], c["num_heads"], c["num_kv_heads"], bias=c["bias"], dtype=dtype),
    "layernorm": lambda c, dtype: LayerNorm(c["normalized_shape"], c["eps"],
                                            c["elementwise_affine"], c["bias"], dtype),
    "rmsnorm": lambda c, dtype: RMSNorm(c["normalized_shape"], c["eps"],
                                        c["elementwise_affine"], dtype),
    "learned_positions": lambda c, dtype: LearnedPositions(c["max_context"], c["width"],
                                                           dtype=dtype),
    "sinusoidal_positions": lambda c, dtype: SinusoidalPositions(c["width"], dtype),
    "rope": lambda c, dtype: RotaryEmbedding(c["head_dim"], c["base"], c["interleaved"], dtype),
    "swiglu": lambda c, dtype: SwiGLU(c["hidden_size"], c["intermediate_size"], c["mlp_bias"],
                                      dtype=dtype),
    "feedforward": lambda c, dtype: feedforward(c["width"], c["hidden"], c["activation"],
                                                c["bias"], dtype=dtype),
    "sparse_moe": lambda c, dtype: SparseMoE(c["hidden_size"], c["intermediate_size"],
                                             c["num_local_experts"], c["num_experts_per_tok"],
                                             dtype=dtype),
    "gemma_rmsnorm": lambda c, dtype: RMSNorm(c["normalized_shape"], c["eps"], dtype=dtype,
                                              unit_offset=True),
    "geglu": lambda c, dtype: SwiGLU(c["hidden_size"], c["intermediate_size"],
                                     activation="gelu_tanh", dtype=dtype),
    "softcap": lambda c, dtype: SoftCap(c["cap"], dtype),
}

def run_optimizer_case(case: Case) -> dict[str, np.ndarray]:
    """Give numpy_tf's optimizer the case's gradients step by step (setting each group's lr by
    warmup_cosine when the case has a schedule): the final parameters, state and lrs."""
    config = case.meta["config"]
    params = {name: Parameter(value.copy()) for name, value in case.section("param").items()}
    groups = list(params.values()) if config["groups"] is None else [
        {**group, "params": [params[name] for name in group["params"]]}
        for group in config["groups"]]
    names = list(params) if config["groups"] is None else [
        name for group in config["groups"] for name in group["params"]]
    optimizer = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}[config["optimizer"]](
        groups, **config["hyperparameters"])
    schedule, base_lrs = config["schedule"], [group["lr"] for group in optimizer.param_groups]
    lrs: list[list[float]] = [[] for _ in base_lrs]
    for step in range(config["steps"]):
        for name, parameter in params.items():
            np.copyto(parameter.grad, case.arrays[f"input/grad_{step}/{name}"])
        for group, base_lr, used in zip(optimizer.param_groups, base_lrs, lrs):
            if schedule is not None:
                group["lr"] = warmup_cosine(step, base_lr, schedule["warmup_steps"],
                                            schedule["total_steps"],
                                            schedule["min_lr_ratio"] * base_lr)
            used.append(group["lr"])
        optimizer.step()
    produced = {f"output/{name}": parameter.data for name, parameter in params.items()}
    for index, name in enumerate(names):
        for key, value in optimizer.state.get(index, {}).items():
            if isinstance(value, np.ndarray):
                produced[f"output/{key}/{name}"] = value
    if schedule is not None:
        for number, used in enumerate(lrs):
            produced[f"output/lr/{number}"] = np.array(used, dtype=case.dtype)
    return produced


def run_clip_case(case: Case) -> dict[str, np.ndarray]:
    """clip_grad_norm on the case's gradients: the clipped gradients and the total norm."""
    config = case.meta["config"]
    params = {}
    for name, grad in case.section("input").items():
        params[name] = Parameter(np.zeros_like(grad))
        np.copyto(params[name].grad, grad)
    total_norm = clip_grad_norm(list(params.values()), config["max_norm"],
                                float(config["norm_type"]))
    return {"output/total_norm": np.array(total_norm, dtype=case.dtype),
            **{f"output/{name}": parameter.grad for name, parameter in params.items()}}


def run_schedule_case(case: Case) -> dict[str, np.ndarray]:
    """warmup_cosine at steps 0..total_steps, against both of torch's constructions."""
    c = case.meta["config"]
    lrs = np.array([warmup_cosine(step, c["base_lr"], c["warmup_steps"], c["total_steps"],
                                  c["min_lr"]) for step in range(c["total_steps"] + 1)],
                   dtype=case.dtype)
    return {"output/lambda_lr": lrs, "output/composed_lr": lrs}


def _cbow(case: Case) -> CBOW:
    model = CBOW(case.meta["config"]["vocab_size"], case.meta["config"]["dim"], dtype=case.dtype)
    model.load_state_dict(case.section("param"))
    return model


def run_cbow_case(case: Case) -> dict[str, np.ndarray]:
    """The logits, the mean cross-entropy against the centres, every parameter gradient."""
    model = _cbow(case)
    logits, cache = model.forward(case.arrays["input/contexts"])
    loss, dlogits = cross_entropy(logits, case.arrays["input/centres"])
    model.zero_grad()
    model.backward(dlogits, cache)
    return {"output/logits": logits, "loss": loss,
            **{f"grad/{name}": gradient for name, gradient in model.grad_dict().items()}}


def run_decoding_case(case: Case) -> dict[str, np.ndarray]:
    """KV-cache decoding (kind kv_decoding, a Hugging Face model's config): the first
    meta["prompt_length"] ids in one call, then one id per call with the `present` of the call
    before as past_kv; the logits of every call, concatenated along T."""
    model = from_hf(case.meta["config"], case.section("param"), case.dtype)
    ids, prompt = case.arrays["input/ids"], case.meta["prompt_length"]
    logits, cache = model.forward(ids[:, :prompt])
    steps = [logits]
    for t in range(prompt, ids.shape[1]):
        logits, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        steps.append(logits)
    return {"output/logits": np.concatenate(steps, axis=1)}


# kind -> a runner for cases that are not "one module, forward then backward" (an optimizer's
# steps, CBOW's loss; the whole models of the registry's families run through run_model_case,
# below): run(case) -> {key: array} for the keys the case holds, and gradcheck(case) ->
# GradcheckReport, or None when finite differences do not apply.
RUNNERS: dict[str, tuple[Callable[[Case], dict], Callable[[Case], GradcheckReport | None]]] = {
    "optimizer": (run_optimizer_case, lambda case: None),
    "clip_grad_norm": (run_clip_case, lambda case: None),
    "lr_schedule": (run_schedule_case, lambda case: None),
    "kv_decoding": (run_decoding_case, lambda case: None),
    "cbow": (run_cbow_case, lambda case: gradcheck_module(
        _cbow(case), case.arrays["input/contexts"], title="cbow")),
}


# -- whole models: logits, the model's loss and every parameter gradient ---------------------
# A model case's kind says which registered family it belongs to and whose names its arrays
# use: hf_<model_type> (from_hf / to_hf: a Hugging Face model's names and layout), or one of
# OWN_NAMES (a torch mirror of the numpy_tf model, under numpy_tf's own parameter names).
OWN_NAMES = {"tiny_gpt": "gpt", "bert": "bert", "seq2seq": "seq2seq"}


def _lm_inputs(case: Case):
    """ids (and labels for masked LM) positionally; key_padding_mask and token_type_ids by
    keyword."""
    names = ("ids", "labels") if "input/labels" in case.arrays else ("ids",)
    kwargs = {"key_padding_mask": case.arrays.get("input/key_padding_mask")}
    if "input/token_type_ids" in case.arrays:
        kwargs["token_type_ids"] = case.arrays["input/token_type_ids"]
    return tuple(case.arrays[f"input/{name}"] for name in names), kwargs


def _seq2seq_inputs(case: Case):
    return tuple(case.arrays.get(f"input/{name}") for name in
                 ("src_ids", "tgt_ids", "target", "src_key_padding_mask",
                  "tgt_key_padding_mask")), {}


# registry family name -> case -> (positional, keyword) inputs of the family's objective
MODEL_INPUTS: dict[str, Callable[[Case], tuple[tuple, dict]]] = {
    "gpt": _lm_inputs, "llama": _lm_inputs, "bert": _lm_inputs, "seq2seq": _seq2seq_inputs,
    "neox": _lm_inputs, "mixtral": _lm_inputs, "gemma": _lm_inputs, "qwen2": _lm_inputs,
    "qwen3": _lm_inputs, "phi3": _lm_inputs}


def model_case_family(kind: str):
    """The registered family of a whole-model case kind, or None for any other kind."""
    if kind in OWN_NAMES:
        return registry.FAMILIES[OWN_NAMES[kind]]
    if kind.startswith("hf_"):
        return registry.family_of_model_type(kind[3:])
    return None


def _load_model(case: Case) -> Module:
    if case.kind.startswith("hf_"):
        return from_hf(case.meta["config"], case.section("param"), case.dtype)
    family = model_case_family(case.kind)
    model = family.model_class(family.config_class(**case.meta["config"]), dtype=case.dtype)
    model.load_state_dict(case.section("param"))
    return model


def _model_objective(case: Case):
    family = model_case_family(case.kind)
    args, kwargs = MODEL_INPUTS[family.name](case)
    return family.objective(_load_model(case)), args, kwargs


def run_model_case(case: Case) -> dict[str, np.ndarray]:
    objective, args, kwargs = _model_objective(case)
    loss, cache = objective.forward(*args, **kwargs)
    objective.zero_grad()
    objective.backward(1.0, cache)
    model = objective.model
    grads = to_hf(model, case.meta["config"], True) if case.kind.startswith("hf_") \
        else model.grad_dict()
    return {"output/logits": cache.logits, "loss": loss,
            **{f"grad/{name}": g for name, g in grads.items()}}


def gradcheck_model_case(case: Case) -> GradcheckReport:
    """Random directions over every parameter at once (two forwards per direction)."""
    objective, args, kwargs = _model_objective(case)
    return gradcheck_module(objective, *args, fast=True, title=case.kind, forward_kwargs=kwargs)


def _is_model_case(kind: str) -> bool:
    family = model_case_family(kind)
    return family is not None and family.name in MODEL_INPUTS


SECTION_ORDER = ("loss", "output", "act", "grad_act", "grad_input", "grad")


def fixtures_dir() -> Path:
    """The committed cases: numpy_tf/fixtures in an installed package (setup.cfg maps
    reference/fixtures there), or reference/fixtures in a checkout."""
    package = Path(__file__).resolve().parents[1]                    # numpy_tf
    installed = package / "fixtures"
    if any(installed.glob("*.npz")):
        return installed
    return package.parent / "reference" / "fixtures"


def case_name(path: Path) -> str:
    """`layernorm_float32.npz` -> `layernorm`."""
    return re.sub(r"_(float32|float64)$", "", path.stem)


def known_kinds() -> list[str]:
    """Every case kind numpy_tf can run (model kinds of the registered families included)."""
    models = set(OWN_NAMES) | {f"hf_{model_type}" for name in MODEL_INPUTS
                               for model_type in registry.FAMILIES[name].hf_model_types}
    return sorted(set(BUILDERS) | set(RUNNERS) | models)


def _runner(kind: str):
    if kind in RUNNERS:
        return RUNNERS[kind]
    if _is_model_case(kind):
        return run_model_case, gradcheck_model_case
    return None


def build_module(case: Case) -> Module:
    if case.kind not in BUILDERS:
        raise ValueError(f"case kind {case.kind!r} has no numpy_tf builder; known kinds: "
                         + ", ".join(known_kinds()))
    module = BUILDERS[case.kind](case.meta["config"], case.dtype)
    module.load_state_dict(case.section("param"))
    return module


def forward_kwargs(case: Case) -> dict:
    """Keyword arguments of the forward: the case's keyword inputs (masks) and options."""
    kwargs = dict(case.meta.get("forward_kwargs", {}))
    for name in case.meta.get("keyword_inputs", []):
        if f"input/{name}" in case.arrays:
            kwargs[name] = case.arrays[f"input/{name}"]
    return kwargs


def run_case(case: Case) -> dict[str, np.ndarray]:
    """numpy_tf's arrays for every output and gradient key the case holds."""
    runner = _runner(case.kind)
    if runner is not None:
        return runner[0](case)
    module = build_module(case)
    inputs = case.inputs()
    out, cache = module.forward(*inputs, **forward_kwargs(case))
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
                "forward_max_abs_error": self.max_error(FORWARD_SECTIONS),
                "backward_max_abs_error": self.max_error(("grad", "grad_input", "grad_act")),
                "tensors": [c.__dict__ | {"worst_index": None if c.worst_index is None
                                          else list(c.worst_index)}
                            for c in self.comparisons],
                "gradcheck": None if self.gradcheck is None else self.gradcheck.to_dict()}


def compare_arrays(key: str, ours: np.ndarray, theirs: np.ndarray, tolerance: Tolerance,
                   scale: float = 1.0) -> TensorComparison:
    """One tensor against the reference; `scale` is S, the largest |reference| of its set."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.shape != theirs.shape:
        return TensorComparison(key, float("inf"), float("inf"), None, False)
    if theirs.size == 0:
        return TensorComparison(key, 0.0, 0.0, None, True)
    ours64, theirs64 = ours.astype(np.float64), theirs.astype(np.float64)
    with np.errstate(invalid="ignore"):         # inf - inf: equal infinities agree
        error = np.where(ours64 == theirs64, 0.0, np.abs(ours64 - theirs64))
    magnitude = np.abs(theirs64)
    finite = np.isfinite(theirs)                # an infinite reference allows no error
    allowed = tolerance.allowed(np.where(finite, theirs, 0.0), scale)
    excess = np.where(np.isnan(error), np.inf, error / allowed)
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(excess), error.shape))
    nonzero = (magnitude > 0) & finite
    max_rel = float((error[nonzero] / magnitude[nonzero]).max(initial=0.0))
    max_abs = float("nan") if np.isnan(error).all() else float(np.nanmax(error))
    return TensorComparison(key, max_abs, max_rel, worst, bool((error <= allowed).all()))


FORWARD_SECTIONS = ("loss", "output", "act")


def compare_case(case: Case, produced: dict[str, np.ndarray]) -> list[TensorComparison]:
    """One comparison per output/gradient key of the case (a key numpy_tf did not produce
    fails), in SECTION_ORDER. The absolute floor scales with the largest reference value among
    the outputs, or among the gradients (tolerances.py says why)."""
    tolerance = torch_tolerance(case.dtype, case.meta.get("level", "layer"))
    keys = [key for key in case.arrays if key.split("/")[0] in SECTION_ORDER]
    keys.sort(key=lambda key: SECTION_ORDER.index(key.split("/")[0]))
    forward = [key for key in keys if key.split("/")[0] in FORWARD_SECTIONS]
    backward = [key for key in keys if key not in forward]
    scales = {}
    for group in (forward, backward):
        scale = max((float(np.abs(case.arrays[k]).max(initial=0.0)) for k in group), default=0.0)
        scales.update({key: scale for key in group})
    results = []
    for key in keys:
        if key not in produced:
            results.append(TensorComparison(key, float("inf"), float("inf"), None, False))
        else:
            results.append(compare_arrays(key, produced[key], case.arrays[key], tolerance,
                                          scales[key]))
    return results


def gradcheck_case(case: Case, fast: bool | None = None,
                   title: str = "") -> GradcheckReport | None:
    """Finite differences of numpy_tf's own forward at the case's inputs and parameters
    (in float64); full for a layer, random directions for a model."""
    runner = _runner(case.kind)
    if runner is not None:
        return runner[1](case)
    module = build_module(case)
    if fast is None:
        fast = case.meta.get("level", "layer") == "model"
    return gradcheck_module(module, *case.inputs(), fast=fast, title=title or case.kind,
                            forward_kwargs=forward_kwargs(case))


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


# the model cases that are not whole-model cases of MODEL_INPUTS, by the family they check
OTHER_MODEL_KINDS = {"transformer": "seq2seq", "cbow": "cbow"}


def case_family(kind: str) -> str | None:
    """The registry family a case kind checks (None: a layer, an optimizer, ...)."""
    family = model_case_family(kind)
    return family.name if family is not None else OTHER_MODEL_KINDS.get(kind)


def _case_kind(path: Path) -> str | None:
    try:
        arrays = load_npz(path, ["meta"])
        return from_json_array(arrays["meta"], path, "meta", dict).get("kind")
    except (OSError, ValueError, KeyError):   # unreadable: check_file reports it
        return None


def case_paths(directory: Path | None = None, pattern: str = "*",
               model: str | None = None) -> list[Path]:
    """The case files check_all runs: those matching `pattern`, and with `model` (a family or
    preset name, see numpy_tf.models.registry) only the cases of that model's family."""
    directory = fixtures_dir() if directory is None else Path(directory)
    paths = sorted(directory.glob(f"{pattern}.npz"))
    if model is not None:
        family = registry.family(model, "model")
        paths = [path for path in paths if case_family(_case_kind(path) or "") == family.name]
    return paths


def check_all(directory: Path | None = None, pattern: str = "*",
              model: str | None = None) -> list[CaseResult]:
    """Every case in `directory` (default: the committed fixtures), or those case_paths
    selects; finite differences on the float64 case of each name."""
    return [check_file(path, with_gradcheck=path.stem.endswith("float64"))
            for path in case_paths(directory, pattern, model)]
