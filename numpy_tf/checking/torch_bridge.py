"""Run a PyTorch module on a numpy_tf case and write its numbers as a case file, so that

    numpy-tf export --model tiny-gpt -o case.npz                          # numpy_tf's numbers
    python -c "...; run_torch(MyGPT(...), 'case.npz', 'mine.npz', activations={...})"
    numpy-tf compare case.npz mine.npz                                    # where do we differ?

compares a torch model with numpy_tf number by number, down to the first activation that
differs. torch is imported inside run_torch only; numpy_tf never needs it otherwise.

    run_torch(module, case_path, out_path=None, *, activations=None, params=None, call=None,
              loss_fn=None, dtype=None) -> Case

- The module is converted to the case's dtype, put in eval mode (no dropout), and given the
  case's parameters. `params` maps numpy_tf names to the module's parameter names,
  {numpy_tf name: torch name} or {numpy_tf name: (torch name, True)} for a weight stored
  transposed (HF GPT-2's Conv1D: numpy_tf.interop.gpt2_layout(n).rows are such triples);
  by default every case parameter whose name the module also has. Every torch parameter must
  receive a value.
- `call(module, inputs) -> logits` runs the forward on the case's inputs ({name: tensor}: ids
  int64, key_padding_mask bool, True at padding); by default module(*inputs in meta["inputs"]
  order). A tuple result, or an object with `.logits`, gives its logits.
- `loss_fn(logits, inputs) -> 0-d tensor`; by default the case's own loss (meta["loss"]
  ["name"], written here in torch: LOSSES).
- `activations` = {numpy_tf activation name: torch module name}: a forward hook records each
  named module's output (the first element of a tuple), and a hook on that output tensor its
  gradient, written as act/<numpy_tf name> and grad_act/<numpy_tf name>. "matching" takes
  every activation of the case whose name is also a submodule of the module; a module of the
  same name must then compute the same thing (reference/gpt.py's TinyGPT names its position
  table `positions` and adds it outside; numpy_tf's `positions` returns x + P: leave it out).

- `dtype` runs the module in another format than the case's: "bfloat16" or "float16" (the
  case's weights rounded to it exactly, by numpy_tf.checking.precision, before torch sees
  them), "float32", "float64". A bfloat16 or float16 run is written as float32 arrays holding
  its values; judge it with `numpy-tf compare --precision bf16|fp16`.

The written file holds param/, input/, act/, output/, loss, grad_act/ and grad/ (gradients
under the numpy_tf names, transposed back where needed) and a meta naming torch's version.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .case_file import Case


def _next_token_loss(logits, inputs, ignore_index: int = -100):
    """Mean cross-entropy of ids[:, t + 1] given position t; the last position, padding and
    positions followed by padding ignored (numpy_tf.objectives.shifted_targets, in torch)."""
    import torch.nn.functional as F

    ids = inputs["ids"]
    targets = ids.new_full(ids.shape, ignore_index)
    targets[:, :-1] = ids[:, 1:]
    padding = inputs.get("key_padding_mask")
    if padding is not None:
        ignored = padding.clone()
        ignored[:, :-1] |= padding[:, 1:]
        targets[ignored] = ignore_index
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=ignore_index)


def _target_loss(logits, inputs, ignore_index: int = -100):
    """Mean cross-entropy of inputs["target"], ignore_index skipped (the encoder-decoder's)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           inputs["target"].reshape(-1), ignore_index=ignore_index)


def _masked_lm_loss(logits, inputs, ignore_index: int = -100):
    """Mean cross-entropy of inputs["labels"], ignore_index skipped (BERT's)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           inputs["labels"].reshape(-1), ignore_index=ignore_index)


# meta["loss"]["name"] of a case -> the same loss in torch: loss(logits, inputs)
LOSSES: dict[str, Callable] = {"next_token_cross_entropy": _next_token_loss,
                               "target_cross_entropy": _target_loss,
                               "masked_lm_cross_entropy": _masked_lm_loss}


def parameter_map(params, case_params: Mapping[str, np.ndarray], named: dict) -> dict:
    """{numpy_tf name: (their name, transposed)}, checked both ways; `named` = {their name:
    parameter} (torch's named_parameters, or the leaves of a JAX pytree: jax_bridge)."""
    if params is None:
        mapping = {name: (name, False) for name in case_params if name in named}
        if not mapping:
            raise ValueError("no parameter name of the case matches the module's; pass params="
                             "{numpy_tf name: the module's name for it}")
    else:
        mapping = {ours: (theirs, False) if isinstance(theirs, str) else
                   (theirs[0], bool(theirs[1])) for ours, theirs in params.items()}
    unknown = [ours for ours in mapping if ours not in case_params]
    absent = [theirs for theirs, _ in mapping.values() if theirs not in named]
    covered = {id(named[theirs]) for theirs, _ in mapping.values() if theirs in named}
    unset = [name for name, parameter in named.items() if id(parameter) not in covered]
    problems = [f"{label}: {', '.join(names)}" for label, names in [
        ("not parameters of the case", unknown), ("not parameters of the module", absent),
        ("module parameters given no value", unset)] if names]
    if problems:
        raise ValueError("params does not fit: " + " | ".join(problems))
    return mapping


def _hooks(torch, module, activations, acts_in_case, acts: dict, grads: dict) -> tuple:
    """A forward hook per named module, recording its output and the output's gradient;
    returns (hook handles, the {numpy_tf name: torch name} used)."""
    def record(name):
        def hook(_, __, output):
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(tensor, torch.Tensor):
                return
            key, count = name, 1
            while key in acts:
                count += 1
                key = f"{name}#{count}"
            acts[key] = _numpy(torch, tensor)
            if tensor.requires_grad:
                tensor.register_hook(lambda g: grads.__setitem__(key, _numpy(torch, g)))
        return hook

    if activations == "matching":
        submodules = dict(module.named_modules())
        names = [key[len("act/"):] for key in acts_in_case if key.startswith("act/")]
        activations = {name: name for name in names if name in submodules}
    handles = []
    for ours, theirs in activations.items():
        try:
            submodule = module.get_submodule(theirs)
        except AttributeError:
            raise ValueError(f"activations[{ours!r}] = {theirs!r} is not a submodule of "
                             f"{type(module).__name__}") from None
        handles.append(submodule.register_forward_hook(record(ours)))
    return handles, dict(activations)


def _numpy(torch, tensor) -> np.ndarray:
    """A copy as NumPy; bfloat16 and float16 as float32 (NumPy has no bfloat16)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.numpy().copy()


LOW_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}   # torch dtype -> precision format


def _logits(output):
    if hasattr(output, "logits"):
        return output.logits
    return output[0] if isinstance(output, (tuple, list)) else output


def run_torch(module, case_path, out_path=None, *,
              activations: Mapping[str, str] | str | None = None,
              params: Mapping | None = None, call: Callable | None = None,
              loss_fn: Callable | None = None, dtype: str | None = None) -> Case:
    """Run `module` on the case at `case_path`; return (and write to `out_path`) its case.
    See the module text for every argument."""
    import torch

    case = Case.load(case_path)
    dtype = case.meta["dtype"] if dtype is None else dtype
    formats = {"float64": torch.float64, "float32": torch.float32,
               "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in formats:
        raise ValueError(f"dtype must be one of {', '.join(formats)}; got {dtype!r}")
    module.to(formats[dtype]).eval()
    named = dict(module.named_parameters(remove_duplicate=False))
    case_params = case.section("param")
    mapping = parameter_map(params, case_params, named)
    if dtype in LOW_PRECISION:                  # exact rounding (torch rounds via float32)
        from .precision import FORMATS
        rounded = FORMATS[LOW_PRECISION[dtype]].round
        case_params = {name: rounded(value) for name, value in case_params.items()}
    with torch.no_grad():
        for ours, (theirs, transposed) in mapping.items():
            value = case_params[ours].T if transposed else case_params[ours]
            named[theirs].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    inputs = {name: torch.from_numpy(value.copy()) for name, value in
              case.section("input").items()}
    if call is None:
        if case.meta.get("keyword_inputs"):
            raise ValueError(f"the case has keyword inputs {case.meta['keyword_inputs']}: "
                             "pass call=lambda module, inputs: ... to hand them to the module")
        call = lambda m, x: m(*[x[name] for name in case.meta["inputs"]])  # noqa: E731
    if loss_fn is None:
        name = case.meta.get("loss", {}).get("name")
        if name not in LOSSES:
            raise ValueError(f"the case's loss {name!r} has no torch definition here; pass "
                             f"loss_fn (known: {', '.join(LOSSES)})")
        loss_fn = LOSSES[name]
    acts: dict[str, np.ndarray] = {}
    grads: dict[str, np.ndarray] = {}
    handles, activations = _hooks(torch, module, activations or {}, case.arrays, acts, grads)
    try:
        module.zero_grad(set_to_none=True)
        logits = _logits(call(module, inputs))
        loss = loss_fn(logits, inputs)
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    numpy = lambda t: _numpy(torch, t)  # noqa: E731
    output_name = case.meta.get("outputs", ["logits"])[0]
    arrays = {f"param/{ours}": numpy(named[theirs]).T.copy() if transposed else
              numpy(named[theirs]) for ours, (theirs, transposed) in mapping.items()}
    arrays.update({f"input/{name}": value for name, value in case.section("input").items()})
    arrays.update({f"act/{name}": value for name, value in acts.items()})
    arrays[f"output/{output_name}"] = numpy(logits)
    arrays["loss"] = numpy(loss)
    arrays.update({f"grad_act/{name}": value for name, value in grads.items()})
    for ours, (theirs, transposed) in mapping.items():
        grad = named[theirs].grad
        grad = np.zeros_like(numpy(named[theirs])) if grad is None else numpy(grad)
        arrays[f"grad/{ours}"] = grad.T.copy() if transposed else grad
    meta = {"generator": "numpy_tf.torch_bridge.run_torch", "torch": torch.__version__,
            "module": type(module).__name__, "dtype": dtype, "kind": case.kind,
            "level": case.meta.get("level", "model"), "source_case": str(case_path),
            "inputs": case.meta.get("inputs", []), "activations": activations}
    result = Case(meta, arrays)
    if out_path is not None:
        result.save(out_path)
    return result
