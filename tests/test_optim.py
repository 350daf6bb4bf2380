"""Optimizers, gradient clipping and the learning-rate schedule: torch's numbers, hand-computed
steps, bit-exact resume through .npz files, parameter groups, dtypes and bad input."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, case_paths
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (SGD, Adam, AdamW, Embedding, Linear, Module, Parameter, clip_grad_norm,
                      decay_groups, grads_finite, warmup_cosine)
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import run_case
from numpy_tf.core.npz import json_array, load_npz, save_npz

OPTIMIZER_CASES = ["sgd", "sgd_nesterov", "sgd_dampening_maximize", "adam", "adam_l2_amsgrad",
                   "adamw", "adamw_groups_schedule"]
CLIP_CASES = ["clip_grad_norm", "clip_grad_norm_inf", "clip_grad_norm_p3_unclipped"]
SCHEDULE_CASES = ["warmup_cosine", "warmup_cosine_no_warmup"]


class Tiny(Module):
    """An embedding, a linear layer and a 1-D norm weight: one parameter of each kind."""

    def __init__(self, seed=0, dtype=np.float64):
        super().__init__(dtype)
        self.embedding = Embedding(6, 4, rng=seed, dtype=dtype)
        self.linear = Linear(4, 3, rng=seed + 1, dtype=dtype)
        self.norm_weight = Parameter(np.ones(4, dtype=dtype))


def random_grads(rng, params):
    """Fresh random gradients (never ones) written into every Parameter.grad."""
    for parameter in params:
        parameter.grad[...] = rng.standard_normal(parameter.shape)


# -- agreement with torch --------------------------------------------------------------------
@pytest.mark.parametrize("name", OPTIMIZER_CASES + CLIP_CASES + SCHEDULE_CASES)
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)
    # the bar, tighter than the layer tolerance: float64 within 1e-12 relative
    path = next(p for p in case_paths(name) if p.stem.endswith("float64"))
    case = Case.load(path)
    produced = run_case(case)
    outputs = [key for key in case.arrays if key.startswith("output/")]
    assert any(key.count("/") == 1 for key in outputs)
    for key in outputs:
        np.testing.assert_allclose(produced[key], case.arrays[key], rtol=1e-12, atol=0,
                                   err_msg=f"{name}: {key}")


# -- hand-computed steps ---------------------------------------------------------------------
@given(shape=st.lists(st.integers(1, 4), min_size=0, max_size=3), seed=st.integers(0, 2**16),
       lr=st.floats(1e-4, 1.0), eps=st.sampled_from([1e-8, 1e-3]))
def test_adam_first_step_is_lr_times_sign_like(shape, seed, lr, eps):
    """At t = 1, m = (1 - b1) g and v = (1 - b2) g^2, so the bias corrections cancel:
    p1 = p0 - lr g / (|g| + eps)."""
    rng = np.random.default_rng(seed)
    parameter = Parameter(rng.standard_normal(shape))
    start = parameter.data.copy()
    parameter.grad[...] = rng.standard_normal(shape)
    Adam([parameter], lr=lr, betas=(0.8, 0.9), eps=eps).step()
    expected = start - lr * parameter.grad / (np.abs(parameter.grad) + eps)
    np.testing.assert_allclose(parameter.data, expected, rtol=1e-12, atol=1e-15)


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**16),
       nesterov=st.booleans())
def test_sgd_momentum_two_steps_by_hand(shape, seed, nesterov):
    """b1 = g1 (no dampening at the first step); b2 = mu b1 + (1 - d) g2."""
    rng = np.random.default_rng(seed)
    lr, mu, wd = 0.1, 0.9, 0.01
    dampening = 0.0 if nesterov else 0.25
    parameter = Parameter(rng.standard_normal(shape))
    g1, g2 = rng.standard_normal(shape), rng.standard_normal(shape)
    p0 = parameter.data.copy()
    optimizer = SGD([parameter], lr=lr, momentum=mu, dampening=dampening, weight_decay=wd,
                    nesterov=nesterov)
    parameter.grad[...] = g1
    optimizer.step()
    d1 = g1 + wd * p0
    b1 = d1
    p1 = p0 - lr * (d1 + mu * b1 if nesterov else b1)
    parameter.grad[...] = g2
    optimizer.step()
    d2 = g2 + wd * p1
    b2 = mu * b1 + (1 - dampening) * d2
    p2 = p1 - lr * (d2 + mu * b2 if nesterov else b2)
    np.testing.assert_allclose(parameter.data, p2, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(optimizer.state[0]["momentum_buffer"], b2, rtol=1e-12,
                               atol=1e-15)


def test_plain_sgd_keeps_no_state_and_maximize_climbs():
    parameter = Parameter(np.array([1.0, -2.0]))
    parameter.grad[...] = [0.5, 0.25]
    optimizer = SGD([parameter], lr=0.5, maximize=True)
    optimizer.step()
    np.testing.assert_array_equal(parameter.data, [1.25, -1.875])
    assert optimizer.state == {}


# -- parameter groups ------------------------------------------------------------------------
def test_decay_groups_split_by_name():
    model = Tiny()
    groups = decay_groups(model, 0.1)
    assert groups[0]["param_names"] == ["embedding.weight", "linear.weight"]
    assert groups[0]["weight_decay"] == 0.1
    assert groups[1]["param_names"] == ["norm_weight", "linear.bias"]
    assert groups[1]["weight_decay"] == 0.0
    groups = decay_groups(model, 0.1, exclude_embeddings=True)
    assert groups[0]["param_names"] == ["linear.weight"]
    assert groups[1]["param_names"] == ["norm_weight", "embedding.weight", "linear.bias"]


def test_decay_is_skipped_where_asked():
    """With zero gradients AdamW's Adam part moves nothing (m = 0), so a decayed parameter
    becomes exactly p (1 - lr wd) and an undecayed one stays bit for bit."""
    model = Tiny()
    before = {name: value.copy() for name, value in model.state_dict().items()}
    optimizer = AdamW(decay_groups(model, 0.5, exclude_embeddings=True), lr=0.1)
    optimizer.step()
    after = model.state_dict()
    np.testing.assert_array_equal(after["linear.weight"], before["linear.weight"] * (1 - 0.05))
    for name in ("embedding.weight", "linear.bias", "norm_weight"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_group_values_override_the_defaults():
    a, b = Parameter(np.array([1.0])), Parameter(np.array([1.0]))
    a.grad[...] = b.grad[...] = 1.0
    optimizer = SGD([{"params": [a]}, {"params": [b], "lr": 0.25}], lr=0.5, momentum=0.0)
    assert optimizer.param_groups[0]["lr"] == 0.5 and optimizer.param_groups[1]["lr"] == 0.25
    assert optimizer.param_groups[1]["momentum"] == 0.0
    optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.125          # what a schedule does
    optimizer.step()
    np.testing.assert_array_equal(a.data, [1.0 - 0.5 - 0.125])
    np.testing.assert_array_equal(b.data, [1.0 - 0.25 - 0.25])


def test_zero_grad_keeps_the_arrays():
    model = Tiny()
    random_grads(np.random.default_rng(0), model.parameters())
    grads = [parameter.grad for parameter in model.parameters()]
    SGD(model.parameters()).zero_grad()
    for parameter, grad in zip(model.parameters(), grads):
        assert parameter.grad is grad and not grad.any()


# -- checkpoints -----------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd_nesterov": lambda model: SGD(model.parameters(), lr=0.05, momentum=0.9,
                                      nesterov=True, weight_decay=0.01),
    "adam_amsgrad_l2": lambda model: Adam(model.parameters(), lr=0.01, weight_decay=0.1,
                                          amsgrad=True),
    "adamw_groups": lambda model: AdamW(decay_groups(model, 0.1, exclude_embeddings=True),
                                        lr=0.01),
}


def _train(model, optimizer, grads, first_step):
    for step, step_grads in enumerate(grads):
        for parameter, grad in zip(model.parameters(), step_grads):
            np.copyto(parameter.grad, grad)
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(first_step + step, 0.02, 3, 10, 0.002)
        optimizer.step()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_resume_through_npz_is_bit_exact(tmp_path, name, dtype):
    rng = np.random.default_rng(1)
    shapes = [parameter.shape for parameter in Tiny(dtype=dtype).parameters()]
    grads = [[rng.standard_normal(shape).astype(dtype) for shape in shapes] for _ in range(10)]
    straight = Tiny(dtype=dtype)
    _train(straight, OPTIMIZERS[name](straight), grads, 0)

    first = Tiny(dtype=dtype)
    optimizer = OPTIMIZERS[name](first)
    _train(first, optimizer, grads[:5], 0)
    arrays, meta = optimizer.flat_state()
    save_npz(tmp_path / "checkpoint.npz",
             {**{f"model/{k}": v for k, v in first.state_dict().items()},
              **{f"optimizer/{k}": v for k, v in arrays.items()},
              "optimizer_meta": json_array(meta)})
    loaded = load_npz(tmp_path / "checkpoint.npz")
    resumed = Tiny(seed=7, dtype=dtype)           # other initial values: all must come from disk
    resumed.load_state_dict({k[6:]: v for k, v in loaded.items() if k.startswith("model/")})
    optimizer = OPTIMIZERS[name](resumed)
    optimizer.load_flat_state({k[10:]: v for k, v in loaded.items()
                               if k.startswith("optimizer/")}, loaded["optimizer_meta"])
    _train(resumed, optimizer, grads[5:], 5)

    for (key, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert a.dtype == b.dtype == dtype and a.tobytes() == b.tobytes(), key


def test_state_dict_roundtrip_and_copies():
    model = Tiny()
    optimizer = OPTIMIZERS["adam_amsgrad_l2"](model)
    random_grads(np.random.default_rng(2), model.parameters())
    optimizer.step()
    saved = optimizer.state_dict()
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    assert saved["state"][0]["step"] == 1
    assert saved["param_groups"][0]["params"] == [0, 1, 2, 3]
    optimizer.step()
    assert saved["state"][0]["step"] == 1         # a copy, not the live state
    saved["param_groups"][0]["lr"] = 0.123
    other = OPTIMIZERS["adam_amsgrad_l2"](Tiny())
    other.load_state_dict(saved)
    assert other.state[0]["step"] == 1 and other.param_groups[0]["lr"] == 0.123
    np.testing.assert_array_equal(other.state[3]["exp_avg"], saved["state"][3]["exp_avg"])


def test_loading_is_strict_and_names_the_mismatch():
    model = Tiny()
    optimizer = OPTIMIZERS["adamw_groups"](model)
    random_grads(np.random.default_rng(3), model.parameters())
    optimizer.step()
    arrays, meta = optimizer.flat_state()
    with pytest.raises(ValueError, match="holds 'AdamW' state; this optimizer is Adam"):
        Adam(model.parameters()).load_flat_state(arrays, meta)
    wrong_dtype = OPTIMIZERS["adamw_groups"](Tiny(dtype=np.float32))
    with pytest.raises(ValueError, match=r"param 0 \('linear.weight'\): the checkpoint has "
                                         r"float64 of shape \(3, 4\), the parameter is float32"):
        wrong_dtype.load_flat_state(arrays, meta)
    fewer = AdamW([{"params": [model.linear.weight]}, {"params": [model.linear.bias]}])
    with pytest.raises(ValueError, match="the checkpoint has 4 parameters, this AdamW has 2"):
        fewer.load_flat_state(arrays, meta)
    with pytest.raises(ValueError, match="unexpected key 'extra'"):
        OPTIMIZERS["adamw_groups"](Tiny()).load_flat_state({**arrays, "extra": np.ones(1)},
                                                           meta)
    bad = optimizer.state_dict()
    bad["state"][2]["exp_avg_sq"] = np.zeros((4, 6))
    fresh = OPTIMIZERS["adamw_groups"](Tiny())
    with pytest.raises(ValueError, match=r"param 2 \('embedding.weight'\): exp_avg_sq must be "
                                         r"float64 of shape \(6, 4\); got float64 of shape"):
        fresh.load_state_dict(bad)
    assert fresh.state == {}                       # nothing changed by the failed load
    bad = optimizer.state_dict()
    bad["param_groups"][0]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"param_groups\[0\]: lr must be a number in \[0"):
        fresh.load_state_dict(bad)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_step_reads_the_gradients_and_never_changes_them(name):
    model = Tiny()
    optimizer = OPTIMIZERS[name](model)
    random_grads(np.random.default_rng(5), model.parameters())
    grads = [parameter.grad.copy() for parameter in model.parameters()]
    optimizer.step()
    optimizer.step()
    for parameter, grad in zip(model.parameters(), grads):
        np.testing.assert_array_equal(parameter.grad, grad)


# -- dtype -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_float32_stays_float32(name):
    model = Tiny(dtype=np.float32)
    arrays = [parameter.data for parameter in model.parameters()]
    optimizer = OPTIMIZERS[name](model)
    random_grads(np.random.default_rng(4), model.parameters())
    for group in optimizer.param_groups:
        group["lr"] = np.float64(0.01)              # a NumPy scalar must not upcast either
    optimizer.step()
    optimizer.step()
    for parameter, array in zip(model.parameters(), arrays):
        assert parameter.data is array and array.dtype == np.float32
    for entry in optimizer.state.values():
        for key, value in entry.items():
            assert key == "step" or value.dtype == np.float32, key
    assert clip_grad_norm(model.parameters(), 0.1) > 0.1
    assert all(parameter.grad.dtype == np.float32 for parameter in model.parameters())


# -- clipping --------------------------------------------------------------------------------
def test_clip_grad_norm_by_hand():
    a, b = Parameter(np.zeros(2)), Parameter(np.zeros((1, 1)))
    a.grad[...] = [3.0, -4.0]
    b.grad[...] = 12.0                               # global 2-norm sqrt(9 + 16 + 144) = 13
    assert clip_grad_norm([a, b], 6.5) == 13.0
    coef = 6.5 / (13.0 + 1e-6)
    np.testing.assert_array_equal(a.grad, np.array([3.0, -4.0]) * coef)
    np.testing.assert_array_equal(b.grad, [[12.0 * coef]])
    a.grad[...] = [3.0, -4.0]
    b.grad[...] = 12.0
    assert clip_grad_norm([a, b], 100.0) == 13.0    # coefficient clamped to 1: unchanged
    np.testing.assert_array_equal(a.grad, [3.0, -4.0])
    assert clip_grad_norm([a, b], 6.0, norm_type=math.inf) == 12.0
    np.testing.assert_array_equal(b.grad, [[12.0 * (6.0 / (12.0 + 1e-6))]])
    assert clip_grad_norm([], 1.0) == 0.0


def test_non_finite_gradients():
    a = Parameter(np.zeros(3))
    a.grad[...] = [1.0, np.inf, 2.0]
    assert not grads_finite([a])
    with pytest.raises(RuntimeError, match="total norm of order 2.0 of the gradients is inf"):
        clip_grad_norm([a], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(a.grad, [1.0, np.inf, 2.0])    # untouched by the refusal
    clip_grad_norm(a, 1.0)                                       # torch: coefficient 0
    assert np.isnan(a.grad[1]) and not a.grad[0] and not a.grad[2]
    a.grad[...] = 1.0
    assert grads_finite(a)
    with pytest.raises(ValueError, match="max_norm must be a number in"):
        clip_grad_norm([a], -1.0)
    with pytest.raises(TypeError, match=r"grad is float32 but parameters\[0\].grad is float64"):
        clip_grad_norm([a, Parameter(np.zeros(1, np.float32))], 1.0)


# -- the schedule ----------------------------------------------------------------------------
def test_warmup_cosine_values():
    base, low = 0.1, 0.01
    assert warmup_cosine(0, base, 4, 24, low) == pytest.approx(base / 5, rel=1e-15)
    assert warmup_cosine(3, base, 4, 24, low) == pytest.approx(base * 4 / 5, rel=1e-15)
    assert warmup_cosine(4, base, 4, 24, low) == base                 # end of warm-up: peak
    assert warmup_cosine(14, base, 4, 24, low) == pytest.approx((base + low) / 2, rel=1e-15)
    assert warmup_cosine(24, base, 4, 24, low) == low
    assert warmup_cosine(1000, base, 4, 24, low) == low
    assert warmup_cosine(0, base, 0, 10) == base                      # no warm-up
    assert warmup_cosine(3, base, 10, 10, low) == pytest.approx(base * 4 / 11, rel=1e-15)
    values = [warmup_cosine(step, base, 4, 24, low) for step in range(30)]
    assert all(a < b for a, b in zip(values[:4], values[1:5]))
    assert all(a > b for a, b in zip(values[4:24], values[5:25]))
    assert isinstance(values[7], float)


@pytest.mark.parametrize("args, message", [
    ((0, 0.1, 11, 10), "warmup_steps must be <= total_steps; got warmup_steps 11 > "
                       "total_steps 10"),
    ((-1, 0.1, 2, 10), "step must be a non-negative integer; got -1"),
    ((0, 0.1, -2, 10), "warmup_steps must be a non-negative integer; got -2"),
    ((0, 0.1, 0, 0), "total_steps must be a positive integer; got 0"),
    ((0, -0.1, 2, 10), r"base_lr must be a number in \[0, inf\); got -0.1"),
    ((0, 0.1, 2, 10, 0.2), r"min_lr must be a number in \[0, 0.1\]; got 0.2"),
    ((1.5, 0.1, 2, 10), "step must be a non-negative integer; got 1.5"),
])
def test_warmup_cosine_bad_values(args, message):
    with pytest.raises(ValueError, match=message):
        warmup_cosine(*args)


# -- bad hyperparameters ---------------------------------------------------------------------
def _params():
    return [Parameter(np.zeros(2)), Parameter(np.zeros((2, 2)))]


@pytest.mark.parametrize("make, error, message", [
    (lambda p: SGD(p, lr=-0.1), ValueError, r"lr must be a number in \[0, inf\); got -0.1"),
    (lambda p: SGD(p, momentum=-0.5), ValueError, "momentum must be a number in"),
    (lambda p: SGD(p, weight_decay=-1), ValueError, "weight_decay must be a number in"),
    (lambda p: SGD(p, nesterov=True), ValueError,
     "nesterov=True needs momentum > 0 and dampening 0; got momentum 0.0"),
    (lambda p: SGD(p, momentum=0.9, dampening=0.1, nesterov=True), ValueError,
     "nesterov=True needs momentum > 0 and dampening 0"),
    (lambda p: Adam(p, betas=(1.0, 0.999)), ValueError,
     r"betas\[0\] must be a number in \[0, 1\); got 1.0"),
    (lambda p: Adam(p, betas=(0.9, -0.1)), ValueError, r"betas\[1\] must be a number in"),
    (lambda p: Adam(p, betas=(0.9,)), ValueError, r"betas must be a pair"),
    (lambda p: Adam(p, eps=0.0), ValueError, r"eps must be a number in \(0, inf\); got 0.0"),
    (lambda p: AdamW(p, eps=-1e-8), ValueError, "eps must be a number in"),
    (lambda p: AdamW(p, lr="0.1"), TypeError, "lr must be a real number"),
    (lambda p: Adam(p, amsgrad=1), TypeError, "amsgrad must be True or False; got 1"),
    (lambda p: Adam([{"params": p[:1]}, {"params": p[1:], "lr": -1}]), ValueError,
     r"param_groups\[1\]: lr must be a number in"),
    (lambda p: SGD([{"params": p}, {"params": p[1:]}]), ValueError,
     r"the same Parameter is given twice: param_groups\[0\]\['params'\]\[1\] and "
     r"param_groups\[1\]\['params'\]\[0\]"),
    (lambda p: SGD([p[0], p[1], p[0]]), ValueError, "the same Parameter is given twice"),
    (lambda p: SGD([{"params": p, "lr": 0.1, "weight_decy": 0.1}]), ValueError,
     r"param_groups\[0\] has unknown keys \['weight_decy'\]"),
    (lambda p: SGD([]), ValueError, "empty parameter list"),
    (lambda p: SGD(set(p)), TypeError, "ordered collection"),
    (lambda p: SGD(Tiny()), TypeError, r"model.parameters\(\)"),
    (lambda p: SGD([p[0].data]), TypeError, r"params\[0\] must be a numpy_tf Parameter"),
])
def test_bad_hyperparameters(make, error, message):
    with pytest.raises(error, match=message):
        make(_params())


def test_bad_scheduled_value_is_refused_before_any_update():
    params = _params()
    for parameter in params:
        parameter.grad[...] = 1.0
    optimizer = Adam([{"params": params[:1]}, {"params": params[1:]}])
    optimizer.param_groups[1]["lr"] = -0.01
    with pytest.raises(ValueError, match=r"param_groups\[1\]: lr must be a number in"):
        optimizer.step()
    assert optimizer.state == {} and not params[0].data.any()
    params[1].grad = np.zeros((2, 2), dtype=np.float32)
    optimizer.param_groups[1]["lr"] = 0.01
    with pytest.raises(TypeError, match=r"param 1: grad must be a float64 array of shape "
                                        r"\(2, 2\); got float32"):
        optimizer.step()
