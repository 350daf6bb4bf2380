"""Run a JAX or Flax model on a numpy_tf case and write its numbers as a case file, so that

    numpy-tf export --model tiny-gpt -o case.npz                          # numpy_tf's numbers
    python -c "...; run_jax(MyFlaxGPT(...), 'case.npz', 'mine.npz', params={...}, ...)"
    numpy-tf compare case.npz mine.npz                                    # where do we differ?

compares a JAX model with numpy_tf number by number, down to the first activation that
differs: the JAX counterpart of numpy_tf.torch_bridge.run_torch. jax (and flax, for a Flax
model) are imported inside run_jax only: `pip install 'numpy-tf[jax]'`.

    run_jax(model, case_path, out_path=None, *, variables=None, params=None,
            activations=None, call=None, loss_fn=None, jit=True) -> Case

- `model` is a flax.linen.Module, or a plain JAX function model(variables, inputs, tap) ->
  output that passes each activation it wants recorded through tap(numpy_tf name, x) (which
  returns x).
- `variables` is the pytree the case's parameters are written into (dicts, lists, tuples of
  arrays); each leaf is named by its path joined with "/", e.g. "params/blocks_0/norm1/scale"
  for Flax. For a Flax module it defaults to model.init(PRNGKey(0), *the case's inputs).
- `params` maps numpy_tf names to leaf names: {numpy_tf name: leaf} or {numpy_tf name: (leaf,
  True)} for a weight stored transposed (a Flax Dense kernel is (in, out), numpy_tf's weight
  (out, in)). After the transpose, a value is reshaped to its leaf's shape when the sizes
  agree (Flax DenseGeneral's (C, heads, head_dim) and (heads, head_dim, C) kernels); its
  gradient goes back the same way. By default every case parameter whose name is a leaf.
  Every leaf must receive a value.
- `call(model, variables, inputs) -> output` runs a Flax module (default: model.apply(
  variables, *inputs in meta["inputs"] order)); inputs = {name: jax array}: ids int64 (int32
  without 64-bit JAX), masks bool with the case's meaning (True = blocked / padding; Flax's
  masks mean the opposite: pass ~mask).
- `activations` = {numpy_tf name: Flax module path ("blocks_0/norm1")} records every call of
  that module's __call__ (the first element of a tuple output), and its gradient, through a
  zero probe added to that output and differentiated by jax.vjp. A second call: name#2.
- `loss_fn(output, inputs) -> scalar`: by default the case's own loss (meta["loss"]: the mean
  cross-entropy, ignore_index -100, of the targets numpy_tf's objective uses), or, for a layer
  case holding grad_output/ tensors, sum(output * grad_output): its gradients are then the
  vector-Jacobian products of that upstream gradient, and the float inputs get grad_input/.
- `jit`: the forward and jax.vjp run as one jax.jit (compiled once); jit=False runs them op by
  op, for a model whose Python code depends on the values it computes.

A float64 case runs inside jax.enable_x64(True) (JAX computes in float32 unless 64-bit is on).
Two JAX conventions make its numbers differ from numpy_tf's with no bug, and `numpy-tf compare`
says so when it sees them (numpy_tf.checking.conventions, with the numbers measured):
jax.nn.dot_product_attention takes its softmax in float32 even for float64 inputs, and
JAX / Flax attention gives a query row whose keys are all masked the mean of v, not 0.

The written file holds param/, input/, act/, output/, loss (model cases), grad_output/ (layer
cases), grad_act/, grad/ and grad_input/ (numpy_tf names, layouts restored) and a meta naming
jax's version.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Mapping

import numpy as np

from ..models.objectives import shifted_targets
from .case_file import Case
from .torch_bridge import parameter_map

# meta["loss"]["name"] of a case -> its targets (numpy, before JAX): targets(inputs)
TARGETS: dict[str, Callable[[dict], np.ndarray]] = {
    "next_token_cross_entropy": lambda x: shifted_targets(x["ids"], x.get("key_padding_mask")),
    "target_cross_entropy": lambda x: x["target"],
    "masked_lm_cross_entropy": lambda x: x["labels"],
}


def _import_jax():
    try:
        import jax
    except ImportError:
        raise ImportError("numpy_tf.jax_bridge needs jax (and flax for a Flax model); install "
                          "them with: pip install 'numpy-tf[jax]'") from None
    return jax


def _is_flax_module(model) -> bool:
    try:
        import flax.linen
    except ImportError:
        return False
    return isinstance(model, flax.linen.Module)


def _leaf_name(path) -> str:
    """'params/blocks_0/norm1/scale' from a jax key path."""
    parts = []
    for entry in path:
        for attribute in ("key", "idx", "name"):
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


class _Taps:
    """tap(name, x) -> x: records every tapped activation in call order (a name tapped again:
    name#2) and adds its probe (zeros), whose gradient is the activation's gradient."""

    def __init__(self, probes: dict | None = None):
        self.probes = probes
        self.values: dict = {}

    def __call__(self, name: str, x):
        key, count = name, 1
        while key in self.values:
            count += 1
            key = f"{name}#{count}"
        if self.probes is not None:
            x = x + self.probes[key]
        self.values[key] = x
        return x


def _flax_forward(model, call: Callable, activations: Mapping[str, str], seen: set):
    """forward(variables, inputs, taps) for a Flax module, tapping the modules `activations`
    names through flax.linen.intercept_methods."""
    import flax.linen as nn

    wanted = {path: name for name, path in activations.items()}

    def forward(variables, inputs, taps):
        def intercept(next_fun, args, kwargs, context):
            output = next_fun(*args, **kwargs)
            path = "/".join(context.module.path)
            seen.add(path)
            if context.method_name != "__call__" or path not in wanted:
                return output
            if isinstance(output, tuple):
                return (taps(wanted[path], output[0]),) + output[1:]
            return taps(wanted[path], output)

        with nn.intercept_methods(intercept):
            return call(model, variables, inputs)
    return forward


def _cross_entropy(jax, logits, targets, ignore_index: int = -100):
    """Mean of -log softmax(logits)[target] over the targets that are not ignore_index (0.0
    if every target is ignored)."""
    jnp = jax.numpy
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    kept = targets != ignore_index
    picked = jnp.take_along_axis(log_probs, jnp.where(kept, targets, 0)[..., None],
                                 axis=-1)[..., 0]
    return -jnp.sum(jnp.where(kept, picked, 0.0)) / jnp.maximum(jnp.sum(kept), 1)


def _outputs(output, names: list[str]) -> dict:
    """{output name: array} of what the model returned (an array, a tuple, or .logits)."""
    if hasattr(output, "logits"):
        output = output.logits
    if isinstance(output, (tuple, list)):
        return dict(zip(names, output))
    return {names[0]: output}


def _default_loss(jax, case: Case, numpy_inputs: dict) -> Callable:
    grad_outputs = case.section("grad_output")
    names = case.meta.get("outputs", ["logits"])
    if grad_outputs:
        def vjp_loss(output, inputs):
            outputs = _outputs(output, names)
            return sum(jax.numpy.sum(outputs[name] * grad) for name, grad in
                       grad_outputs.items())
        return vjp_loss
    name = case.meta.get("loss", {}).get("name")
    if name not in TARGETS:
        raise ValueError(f"the case's loss {name!r} has no JAX definition here; pass loss_fn "
                         f"(known: {', '.join(TARGETS)})")
    targets = TARGETS[name](numpy_inputs)
    return lambda output, inputs: _cross_entropy(jax, _outputs(output, names)[names[0]],
                                                 targets)


def _to_leaf(value: np.ndarray, leaf, transposed: bool, name: str) -> np.ndarray:
    """The case's value in the leaf's layout: transposed if asked, then one axis split in two
    where the leaf has heads ((C, H d) -> (C, H, d), (H d, C) -> (H, d, C), (H d,) -> (H, d))."""
    value = value.T if transposed else value
    shape = tuple(leaf.shape)
    split = value.size == int(np.prod(shape)) and value.ndim < len(shape) and (
        value.ndim == 1 or shape[0] == value.shape[0] or shape[-1] == value.shape[-1])
    if value.shape != shape and not split:
        raise ValueError(f"param {name!r} {'transposed ' if transposed else ''}has shape "
                         f"{value.shape}; its leaf has shape {shape}")
    return np.ascontiguousarray(value.reshape(shape))


def _from_leaf(value: np.ndarray, reference: np.ndarray, transposed: bool) -> np.ndarray:
    """A leaf-shaped array (a value or its gradient) back in numpy_tf's layout."""
    value = value.reshape(reference.T.shape if transposed else reference.shape)
    return value.T.copy() if transposed else value


def run_jax(model, case_path, out_path=None, *, variables=None, params: Mapping | None = None,
            activations: Mapping[str, str] | None = None, call: Callable | None = None,
            loss_fn: Callable | None = None, jit: bool = True) -> Case:
    """Run `model` on the case at `case_path`; return (and write to `out_path`) its case.
    See the module text for every argument."""
    jax = _import_jax()
    case = Case.load(case_path)
    x64 = case.meta["dtype"] == "float64"
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        result = _run(jax, model, case, str(case_path), variables, params, activations or {},
                      call, loss_fn, x64, jit)
    if out_path is not None:
        result.save(out_path)
    return result


def _run(jax, model, case: Case, case_path: str, variables, params, activations, call, loss_fn,
         x64: bool, jit: bool) -> Case:
    jnp = jax.numpy
    numpy_inputs = case.section("input")
    inputs = {name: jnp.asarray(value if value.dtype.kind != "i" or x64 else
                                value.astype(np.int32)) for name, value in numpy_inputs.items()}
    seen: set[str] = set()
    if _is_flax_module(model):
        if call is None:
            if case.meta.get("keyword_inputs"):
                raise ValueError(f"the case has keyword inputs {case.meta['keyword_inputs']}: "
                                 "pass call=lambda model, variables, inputs: ... to hand them "
                                 "to the module")
            call = lambda m, v, x: m.apply(v, *[x[n] for n in case.meta["inputs"]])  # noqa
        if variables is None:
            if case.meta.get("keyword_inputs"):
                raise ValueError("the case has keyword inputs: pass variables= (the module's "
                                 "init on them) as well as call=")
            variables = model.init(jax.random.PRNGKey(0),
                                   *[inputs[n] for n in case.meta["inputs"]])
        forward = _flax_forward(model, call, activations, seen)
    elif callable(model):
        if variables is None:
            raise ValueError("a plain JAX model needs variables= (the pytree its parameters "
                             "are written into)")
        if activations:
            raise ValueError("activations= names Flax module paths; a plain JAX model records "
                             "its activations through tap(name, x)")
        forward = model
    else:
        raise TypeError(f"model must be a flax.linen.Module or a function (variables, inputs, "
                        f"tap) -> output; got {type(model).__name__}")
    if loss_fn is None:
        loss_fn = _default_loss(jax, case, numpy_inputs)

    flat, treedef = jax.tree_util.tree_flatten_with_path(variables)
    leaves = {_leaf_name(path): leaf for path, leaf in flat}
    case_params = case.section("param")
    index = {name: position for position, name in enumerate(leaves)}
    mapping = parameter_map(params, case_params, index) if case_params or leaves else {}
    values = [np.asarray(leaf) for leaf in leaves.values()]
    for ours, (theirs, transposed) in mapping.items():
        values[index[theirs]] = _to_leaf(case_params[ours], values[index[theirs]], transposed,
                                         ours)
    values = [jnp.asarray(value) for value in values]
    differentiated = [name for name in numpy_inputs if f"grad_input/{name}" in case.arrays]
    float_inputs = {name: inputs[name] for name in differentiated}

    def objective(leaf_values, float_values, probes):
        taps = _Taps(probes)
        output = forward(jax.tree_util.tree_unflatten(treedef, leaf_values),
                         {**inputs, **float_values}, taps)
        return loss_fn(output, {**inputs, **float_values}), (output, taps.values)

    shapes = jax.eval_shape(lambda l, f: objective(l, f, None)[1][1], values, float_inputs)
    missing = [f"{name} = {path!r}" for name, path in activations.items() if path not in seen]
    if missing:
        raise ValueError(f"activations: {', '.join(missing)}: not the path of a module this "
                         f"model calls (its paths: {', '.join(sorted(p for p in seen if p))})")
    probes = {key: jnp.zeros(shape.shape, shape.dtype) for key, shape in shapes.items()}

    def value_and_gradients(leaf_values, float_values, probes):
        loss, vjp, aux = jax.vjp(objective, leaf_values, float_values, probes, has_aux=True)
        return loss, aux, vjp(jnp.ones_like(loss))

    run = jax.jit(value_and_gradients) if jit else value_and_gradients
    loss, (output, acts), (dvalues, dinputs, dprobes) = run(values, float_inputs, probes)

    numpy = lambda array: np.array(array)  # noqa: E731 (a writable copy)
    arrays = {f"param/{ours}": _from_leaf(numpy(values[index[theirs]]), case_params[ours],
                                          transposed)
              for ours, (theirs, transposed) in mapping.items()}
    arrays.update({f"input/{name}": value for name, value in numpy_inputs.items()})
    arrays.update({f"act/{name}": numpy(value) for name, value in acts.items()})
    outputs = _outputs(output, case.meta.get("outputs", ["logits"]))
    arrays.update({f"output/{name}": numpy(value) for name, value in outputs.items()})
    if case.section("grad_output"):
        arrays.update({f"grad_output/{name}": value for name, value in
                       case.section("grad_output").items()})
    else:
        arrays["loss"] = numpy(loss)
    arrays.update({f"grad_act/{name}": numpy(value) for name, value in dprobes.items()})
    for ours, (theirs, transposed) in mapping.items():
        arrays[f"grad/{ours}"] = _from_leaf(numpy(dvalues[index[theirs]]), case_params[ours],
                                            transposed)
    arrays.update({f"grad_input/{name}": numpy(value) for name, value in dinputs.items()})
    meta = {"generator": "numpy_tf.jax_bridge.run_jax", "jax": jax.__version__,
            "flax": _flax_version() if _is_flax_module(model) else None,
            "module": type(model).__name__ if _is_flax_module(model) else
            getattr(model, "__name__", type(model).__name__), "x64": x64,
            "dtype": case.meta["dtype"], "kind": case.kind,
            "level": case.meta.get("level", "model"), "source_case": case_path,
            "inputs": case.meta.get("inputs", []), "outputs": list(outputs),
            "activations": dict(activations) or sorted(acts)}
    return Case(meta, arrays)


def _flax_version() -> str:
    import flax

    return flax.__version__
