"""The sparse mixture-of-experts feed-forward and the router's load-balancing loss (layers/moe.py),
through the STYLE.md checklist, against HF's MixtralSparseMoeBlock.

The routing (which k experts a token uses) is piecewise constant in the router logits and jumps
at a tie between the k-th and the (k+1)-th largest probability. Finite differences across such a
jump are meaningless, so every finite-difference check here draws router logits whose top-k
margin (in logits) is at least MARGIN, a thousand times the largest change a step of
1e-6 · max(1, |x|) makes to any logit at these sizes; the draw is repeated until it is.
"""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_tf import gradcheck, gradcheck_module
from numpy_tf.layers.mlp import swiglu_forward
from numpy_tf.layers.moe import (SparseMoE, load_balancing_loss_backward,
                                 load_balancing_loss_forward, moe_backward, moe_forward,
                                 top_k_experts)

MARGIN = 0.01


def _margin(logits: np.ndarray, top_k: int) -> float:
    """The smallest gap between a row's k-th and (k+1)-th largest logit."""
    if top_k == logits.shape[-1]:
        return math.inf
    ordered = -np.sort(-logits.reshape(-1, logits.shape[-1]), axis=-1)
    return float((ordered[:, top_k - 1] - ordered[:, top_k]).min())


def _moe_inputs(rng, lead, width, hidden, experts, top_k):
    """Inputs whose router logits have a top-k margin of at least MARGIN (redrawn until so)."""
    while True:
        x = rng.standard_normal((*lead, width))
        router = rng.standard_normal((experts, width))
        if _margin(x @ router.T, top_k) >= MARGIN:
            break
    return {"x": x, "router_weight": router,
            "gate_weights": rng.standard_normal((experts, hidden, width)),
            "up_weights": rng.standard_normal((experts, hidden, width)),
            "down_weights": rng.standard_normal((experts, width, hidden)), "top_k": top_k}


def _spread_logits(rng, layers, rows, experts, top_k):
    while True:
        logits = [rng.standard_normal((rows, experts)) * 2.0 for _ in range(layers)]
        if min(_margin(z, top_k) for z in logits) >= MARGIN:
            return logits


def _spread_module(module, seed, std=0.6):
    rng = np.random.default_rng(seed)
    for _, parameter in module.named_parameters():
        parameter.data[...] = std * rng.standard_normal(parameter.shape)
    return module


# -- 1. finite differences (router logits kept a margin away from every tie) ---------------------
@settings(max_examples=15, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), width=st.integers(1, 4),
       hidden=st.integers(1, 4), experts=st.integers(1, 5), data=st.data(),
       seed=st.integers(0, 2**16))
def test_moe_gradcheck_drawn_shapes(lead, width, hidden, experts, data, seed):
    top_k = data.draw(st.integers(1, experts))
    inputs = _moe_inputs(np.random.default_rng(seed), lead, width, hidden, experts, top_k)
    report = gradcheck(moe_forward, moe_backward, inputs, seed=seed)
    assert report.passed, str(report)
    assert {row.name for row in report.rows} == {"x", "router_weight", "gate_weights",
                                                 "up_weights", "down_weights"}


def _moe_and_logits(x, router_weight, gate_weights, up_weights, down_weights, top_k):
    """The MoE output and its router logits side by side, so one upstream gradient reaches the
    logits from outside the layer (as the auxiliary loss's does)."""
    out, cache = moe_forward(x, router_weight, gate_weights, up_weights, down_weights, top_k)
    return np.concatenate([out.reshape(-1), cache.router_logits.reshape(-1)]), cache


def _moe_and_logits_backward(dout, cache):
    size = int(np.prod(cache.shape))
    return moe_backward(dout[:size].reshape(cache.shape), cache,
                        dout[size:].reshape(cache.router_logits.shape))


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_a_gradient_arriving_at_the_router_logits_reaches_the_router(top_k):
    inputs = _moe_inputs(np.random.default_rng(top_k), (2, 3), 4, 3, 4, top_k)
    report = gradcheck(_moe_and_logits, _moe_and_logits_backward, inputs, seed=top_k)
    assert report.passed, str(report)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_module_gradcheck(top_k):
    module = _spread_module(SparseMoE(4, 5, 4, top_k, rng=top_k), top_k)
    rng = np.random.default_rng(10 + top_k)
    while True:
        x = rng.standard_normal((2, 3, 4))
        if _margin(x @ module.gate.weight.data.T, top_k) >= MARGIN:
            break
    report = gradcheck_module(module, x)
    assert report.passed, str(report)
    assert {row.name for row in report.rows} >= {"gate.weight", "experts.gate_up_proj",
                                                 "experts.down_proj"}


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(1, 3), rows=st.integers(1, 6), experts=st.integers(1, 5),
       padded=st.booleans(), data=st.data(), seed=st.integers(0, 2**16))
def test_load_balancing_gradcheck_drawn(layers, rows, experts, padded, data, seed):
    top_k = data.draw(st.integers(1, experts))
    rng = np.random.default_rng(seed)
    logits = _spread_logits(rng, layers, rows, experts, top_k)
    padding = (rng.random(rows) < 0.4) if padded else None

    report = gradcheck(load_balancing_loss_forward, load_balancing_loss_backward,
                       {"router_logits": np.stack(logits), "top_k": top_k,
                        "padding_mask": padding}, seed=seed)
    assert report.passed, str(report)


# -- 2. HF's MixtralSparseMoeBlock (float64 with its float32 router softmax patched; float32) --
@pytest.mark.parametrize("name", ["sparse_moe_top2", "sparse_moe_top1"])
def test_agrees_with_hugging_face(name):
    assert_fixture_agrees(name)


# -- 3-5. dtype, accumulation, nothing mutated ---------------------------------------------------
def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    check_contract(lambda dtype: _spread_module(SparseMoE(4, 6, 3, 2, rng=1, dtype=dtype), 2),
                   (x,))


def test_load_balancing_keeps_float32():
    logits = [z.astype(np.float32) for z in _spread_logits(np.random.default_rng(1), 2, 5, 4, 2)]
    loss, cache = load_balancing_loss_forward(logits, 2, np.array([0, 0, 1, 0, 0], bool))
    assert loss.dtype == np.float32
    assert all(g.dtype == np.float32 for g in load_balancing_loss_backward(1.0, cache))


# -- 6. the formulas, computed independently -----------------------------------------------------
def test_each_token_is_the_renormalised_sum_of_its_experts():
    """Token by token: the k largest logits, the softmax of those alone, each chosen expert's
    SwiGLU on that token."""
    inputs = _moe_inputs(np.random.default_rng(3), (2, 4), 5, 3, 4, 2)
    out, _ = moe_forward(**inputs)
    x, router = inputs["x"].reshape(-1, 5), inputs["router_weight"]
    for t, token in enumerate(x):
        logits = router @ token
        chosen = np.argsort(logits)[::-1][:2]
        weights = np.exp(logits[chosen]) / np.exp(logits[chosen]).sum()
        expected = sum(w * swiglu_forward(token, inputs["gate_weights"][e],
                                          inputs["up_weights"][e], inputs["down_weights"][e])[0]
                       for w, e in zip(weights, chosen))
        np.testing.assert_allclose(out.reshape(-1, 5)[t], expected, rtol=1e-12, atol=1e-14)


def test_every_expert_chosen_is_the_dense_softmax_mixture():
    inputs = _moe_inputs(np.random.default_rng(4), (3,), 4, 2, 3, 3)
    out, _ = moe_forward(**inputs)
    logits = inputs["x"] @ inputs["router_weight"].T
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    expected = sum(probs[:, e, None] * swiglu_forward(
        inputs["x"], inputs["gate_weights"][e], inputs["up_weights"][e],
        inputs["down_weights"][e])[0] for e in range(3))
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)


def test_top_1_passes_the_expert_output_unscaled_and_gives_the_router_no_gradient():
    """With k = 1 the renormalised weight is exactly 1: the output does not depend on the
    router's value, only on its choice, so the router gets no gradient from the output."""
    inputs = _moe_inputs(np.random.default_rng(5), (2, 3), 4, 3, 4, 1)
    out, cache = moe_forward(**inputs)
    np.testing.assert_array_equal(cache.weights, 1.0)
    _, drouter, *_ = moe_backward(np.random.default_rng(6).standard_normal(out.shape), cache)
    np.testing.assert_allclose(drouter, 0.0, atol=1e-15)


def test_an_expert_no_token_chose_gets_a_zero_gradient():
    inputs = _moe_inputs(np.random.default_rng(7), (4,), 3, 2, 3, 1)
    inputs["router_weight"][2] = -10.0 * np.abs(inputs["router_weight"][2]).sum()
    inputs["x"] = np.abs(inputs["x"])             # expert 2's logit is far below the others
    out, cache = moe_forward(**inputs)
    assert cache.experts[2] is None and 2 not in cache.selected
    _, _, dgate, dup, ddown = moe_backward(np.random.default_rng(9).standard_normal(out.shape),
                                           cache)
    for gradient in (dgate, dup, ddown):
        assert not gradient[2].any() and gradient[:2].any()


def test_the_output_jumps_where_the_choice_changes():
    """Why finite differences must avoid ties: moving the router across a tie swaps an expert
    in, and the output jumps by far more than the move."""
    inputs = _moe_inputs(np.random.default_rng(8), (1,), 3, 4, 3, 1)
    x = inputs["x"][0]
    logits = inputs["router_weight"] @ x
    first, second = np.argsort(logits)[::-1][:2]
    gap = logits[first] - logits[second]
    direction = x / (x @ x)                   # adding s * direction to a row adds s to its logit
    outputs = []
    for shift in (gap - 1e-7, gap + 1e-7):
        moved = {**inputs, "router_weight": inputs["router_weight"].copy()}
        moved["router_weight"][second] += shift * direction
        outputs.append(moe_forward(**moved)[0])
    assert np.abs(outputs[1] - outputs[0]).max() > 1e-3


def _aux_by_loops(logits, top_k, padding):
    """HF's formula written out: E sum_e f_e P_e over every real row of every layer."""
    experts = logits[0].shape[1]
    fractions, mean_probs, rows = np.zeros(experts), np.zeros(experts), 0
    for z in logits:
        for t, row in enumerate(z):
            if padding is not None and padding[t]:
                continue
            probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            for e in np.argsort(-probs)[:top_k]:
                fractions[e] += 1
            mean_probs += probs
            rows += 1
    return experts * np.sum((fractions / rows) * (mean_probs / rows))


@pytest.mark.parametrize("top_k, padded", [(1, False), (2, False), (2, True), (3, True)])
def test_load_balancing_is_the_formula(top_k, padded):
    rng = np.random.default_rng(top_k)
    logits = _spread_logits(rng, 3, 7, 4, top_k)
    padding = np.array([0, 1, 0, 0, 1, 1, 0], bool) if padded else None
    loss, _ = load_balancing_loss_forward(logits, top_k, padding)
    assert float(loss) == pytest.approx(_aux_by_loops(logits, top_k, padding), rel=1e-13)


def test_perfect_balance_scores_top_k():
    """Uniform router probabilities and every expert chosen equally often: f_e = k/E, P_e = 1/E,
    aux = E sum_e (k/E)(1/E) = k (the Switch Transformer's minimum is 1 for k = 1)."""
    rows = np.array([[4.0, 3.0, 0.0, 0.0], [0.0, 0.0, 4.0, 3.0],
                     [3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 3.0, 4.0]])
    loss, _ = load_balancing_loss_forward([rows], 2)
    assert float(loss) == pytest.approx(2.0, rel=1e-14)


def test_padded_rows_change_nothing_and_get_no_gradient():
    rng = np.random.default_rng(9)
    logits = _spread_logits(rng, 2, 5, 4, 2)
    padding = np.array([0, 0, 1, 0, 1], bool)
    loss, cache = load_balancing_loss_forward(logits, 2, padding)
    moved = [z.copy() for z in logits]
    for z in moved:
        z[padding] = 5.0 * rng.standard_normal((2, 4))
    assert float(load_balancing_loss_forward(moved, 2, padding)[0]) == float(loss)
    for gradient in load_balancing_loss_backward(1.0, cache):
        assert not gradient[padding].any() and gradient[~padding].any()


def test_every_row_padded_gives_zero():
    logits = _spread_logits(np.random.default_rng(2), 2, 3, 4, 2)
    loss, cache = load_balancing_loss_forward(logits, 2, np.ones(3, bool))
    assert float(loss) == 0.0
    assert not any(g.any() for g in load_balancing_loss_backward(1.0, cache))


def test_top_k_is_largest_first():
    probs = np.array([[0.1, 0.5, 0.15, 0.25]])
    np.testing.assert_array_equal(top_k_experts(probs, 3), [[1, 3, 2]])


def test_names_are_transformers_5_names():
    moe = SparseMoE(4, 6, 3, 2)
    assert {name: value.shape for name, value in moe.state_dict().items()} == {
        "gate.weight": (3, 4), "experts.gate_up_proj": (3, 12, 4),
        "experts.down_proj": (3, 4, 6)}


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    inputs = _moe_inputs(np.random.default_rng(0), (2,), 4, 3, 4, 2)
    with pytest.raises(ValueError, match=r"top_k must be at most the number of experts \(4\).*"
                                         r"got 5"):
        moe_forward(**{**inputs, "top_k": 5})
    with pytest.raises(ValueError, match="top_k must be a positive integer; got 0"):
        moe_forward(**{**inputs, "top_k": 0})
    with pytest.raises(ValueError, match="top_k must be at most the number of experts"):
        SparseMoE(4, 6, 3, 4)
    with pytest.raises(ValueError, match=r"gate_weights \(E, F, C\), up_weights \(E, F, C\) "
                                         r"and down_weights \(E, C, F\)"):
        moe_forward(**{**inputs, "up_weights": inputs["up_weights"][:3]})
    with pytest.raises(ValueError, match=r"x must have last dimension 4"):
        moe_forward(**{**inputs, "x": np.zeros((2, 3))})
    with pytest.raises(TypeError, match="dtype"):
        moe_forward(**{**inputs, "x": inputs["x"].astype(np.float32)})
    logits = _spread_logits(np.random.default_rng(1), 2, 3, 4, 2)
    with pytest.raises(ValueError, match=r"padding_mask must be a bool array of shape \(N,\) = "
                                         r"\(3,\)"):
        load_balancing_loss_forward(logits, 2, np.zeros(4, bool))
    with pytest.raises(ValueError, match=r"router_logits\[1\] must have the shape"):
        load_balancing_loss_forward([logits[0], logits[1][:2]], 2)
    with pytest.raises(ValueError, match="top_k must be at most the number of experts"):
        load_balancing_loss_forward(logits, 5)
    with pytest.raises(ValueError, match="non-empty list"):
        load_balancing_loss_forward([], 2)
