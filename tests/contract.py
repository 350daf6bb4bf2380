"""Checks every layer must pass (SPEC §3 and the STYLE.md checklist), shared by the tests.

Each takes a Module factory `make(dtype)` and the forward inputs; none asserts on a value the
code under test produced for itself without an independent expectation.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import compare_case, fixtures_dir, gradcheck_case, run_case


def random_like(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    """A random upstream gradient (never ones: with LayerNorm's default weights an all-ones
    gradient gives an input gradient of exactly zero and proves nothing)."""
    return rng.standard_normal(np.shape(array)).astype(array.dtype)


def spread_parameters(module, seed: int, std: float = 0.5):
    """Every parameter redrawn (norm weights around 1), so no default of ones and zeros hides a
    mistake and attention is far from uniform. Returns the module."""
    rng = np.random.default_rng(seed)
    for name, parameter in module.named_parameters():
        noise = rng.standard_normal(parameter.shape)
        is_norm_weight = "norm" in name and name.endswith("weight")
        parameter.data[...] = 1.0 + 0.2 * noise if is_norm_weight else std * noise
    return module


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def _snapshot(value):
    """A deep copy of arrays inside tuples / NamedTuples / lists / dicts."""
    return copy.deepcopy(value)


def _assert_same(before, after, what: str):
    if isinstance(before, np.ndarray):
        assert isinstance(after, np.ndarray) and before.dtype == after.dtype, what
        np.testing.assert_array_equal(before, after, err_msg=f"{what} changed")
    elif isinstance(before, (tuple, list)):
        assert len(before) == len(after), what
        for i, (b, a) in enumerate(zip(before, after)):
            _assert_same(b, a, f"{what}[{i}]")
    elif isinstance(before, dict):
        assert before.keys() == after.keys(), what
        for key in before:
            _assert_same(before[key], after[key], f"{what}[{key!r}]")
    else:
        assert before == after or before is after, what


def check_contract(make, inputs: tuple, seed: int = 0, **forward_kwargs) -> None:
    """For float64 and float32: dtype kept; backward leaves inputs, dout and cache unchanged;
    backward twice gives the same input gradients and twice the parameter gradients."""
    for dtype in (np.float64, np.float32):
        rng = np.random.default_rng(seed)
        module = make(dtype)
        args = tuple(a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                     else a for a in inputs)
        out, cache = module.forward(*args, **forward_kwargs)
        assert out.dtype == dtype, f"output is {out.dtype} for {dtype.__name__} inputs"
        dout = random_like(rng, out)
        saved = _snapshot((args, dout, cache))
        module.zero_grad()
        first = _as_tuple(module.backward(dout, cache))
        grads_once = {n: g.copy() for n, g in module.grad_dict().items()}
        second = _as_tuple(module.backward(dout, cache))
        _assert_same(saved, (args, dout, cache), "inputs, dout or cache")
        for a, b in zip(first, second):
            if a is not None:
                assert a.dtype == dtype, f"input gradient is {a.dtype} for {dtype.__name__}"
                np.testing.assert_array_equal(a, b)
        for name, gradient in module.grad_dict().items():
            assert gradient.dtype == dtype, f"{name}.grad is {gradient.dtype}"
            # g + g is exactly 2 g in floating point; a tied Parameter gets two additions per
            # backward, (a + b) + a + b, which equals 2 (a + b) up to a few ulps
            np.testing.assert_allclose(gradient, 2 * grads_once[name], err_msg=name,
                                       rtol=4 * np.finfo(dtype).eps,
                                       atol=4 * np.finfo(dtype).eps * np.abs(gradient).max())
        for name, parameter in module.named_parameters():
            assert parameter.data.dtype == dtype, f"{name} is {parameter.data.dtype}"


def case_paths(name: str) -> list[Path]:
    paths = sorted(fixtures_dir().glob(f"{name}_float*.npz"))
    assert len(paths) == 2, f"expected float32 and float64 fixtures for {name}, found {paths}"
    return paths


def assert_fixture_agrees(name: str) -> None:
    """numpy_tf equals torch on the committed case `name` in both dtypes (every output and
    gradient within tolerances.TORCH), and the float64 case passes finite differences."""
    for path in case_paths(name):
        case = Case.load(path)
        failures = [c for c in compare_case(case, run_case(case)) if not c.passed]
        assert not failures, f"{path.name}: " + "; ".join(
            f"{c.key} max abs err {c.max_abs_error:.3g} at {c.worst_index}" for c in failures)
        if case.dtype == np.float64:
            report = gradcheck_case(case)
            assert report is None or report.passed, str(report)


# -- checks every language model must pass ---------------------------------------------------------
def assert_tied_gradient_is_the_sum(tied, untied, ids, embedding: str, head: str) -> None:
    """`tied` and `untied` hold equal weights (the untied head equal to the embedding): after
    one next-token backward each, the tied Parameter's gradient is the sum of the untied
    embedding's and head's gradients."""
    from numpy_tf import cross_entropy, shifted_targets

    for model in (tied, untied):
        logits, cache = model.forward(ids)
        _, dlogits = cross_entropy(logits, shifted_targets(ids))
        model.zero_grad()
        model.backward(dlogits, cache)
    assert tied.state_dict()[head] is tied.state_dict()[embedding]
    untied_grads = untied.grad_dict()
    np.testing.assert_allclose(tied.grad_dict()[embedding],
                               untied_grads[embedding] + untied_grads[head],
                               rtol=1e-12, atol=1e-14)


def assert_right_padding_changes_nothing(model, real: np.ndarray, padding: np.ndarray) -> None:
    """Appending padded tokens (masked as keys, ignored as targets) leaves the real tokens'
    logits and the next-token loss unchanged. real (1, T), padding (1, P)."""
    from numpy_tf.models.objectives import NextTokenLoss

    padded = np.concatenate([real, padding], axis=1)
    mask = np.zeros(padded.shape, dtype=bool)
    mask[:, real.shape[1]:] = True
    alone, _ = model.forward(real)
    with_padding, _ = model.forward(padded, key_padding_mask=mask)
    np.testing.assert_allclose(with_padding[:, :real.shape[1]], alone, rtol=1e-13, atol=1e-14)
    loss_alone, _ = NextTokenLoss(model).forward(real)
    loss_padded, _ = NextTokenLoss(model).forward(padded, mask)
    np.testing.assert_allclose(float(loss_padded), float(loss_alone), rtol=1e-13)


def assert_hf_round_trip_is_bit_exact(config: dict, state: dict, dtype) -> None:
    """interop.from_hf then interop.to_hf returns the same keys, in order, bit for bit."""
    from numpy_tf import interop

    model = interop.from_hf(config, state, dtype=np.dtype(dtype))
    exported = interop.to_hf(model, config)
    assert list(exported) == list(state)
    for key in state:
        assert exported[key].dtype == state[key].dtype
        assert exported[key].tobytes() == state[key].tobytes(), key


def assert_cached_decoding_equals_the_full_forward(model, ids: np.ndarray, prompt: int) -> None:
    """The first `prompt` ids in one call, then one id per call with the `present` of the call
    before as past_kv: the logits of every call equal one forward of the whole sequence."""
    full, _ = model.forward(ids)
    logits, cache = model.forward(ids[:, :prompt])
    steps = [logits]
    for t in range(prompt, ids.shape[1]):
        logits, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)
def finish_gguf(writer, path: Path) -> Path:
    """Write out a gguf.GGUFWriter whose metadata and tensors are all added, in the order
    the format wants them (header, key-values, tensors), and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
