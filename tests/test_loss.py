"""Cross-entropy from logits, as torch.nn.functional.cross_entropy (classes last)."""
import math

import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import cross_entropy, cross_entropy_backward, cross_entropy_forward, gradcheck
from numpy_tf.layers.cross_entropy_loss import CrossEntropyLoss


@given(rows=st.integers(1, 4), classes=st.integers(1, 6), smoothing=st.sampled_from(
    [0.0, 0.1, 0.5]), reduction=st.sampled_from(["mean", "sum", "none"]),
       seed=st.integers(0, 2**16))
def test_gradcheck_drawn(rows, classes, smoothing, reduction, seed):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, classes, (2, rows))
    targets[rng.random((2, rows)) < 0.3] = -100
    inputs = {"logits": rng.standard_normal((2, rows, classes)) * 3, "targets": targets,
              "label_smoothing": smoothing, "reduction": reduction}
    report = gradcheck(cross_entropy_forward, cross_entropy_backward, inputs, seed=seed)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", ["cross_entropy", "cross_entropy_smoothing",
                                  "cross_entropy_sum", "cross_entropy_large_logits"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_value_by_hand():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    targets = np.array([0, 2])
    by_hand = [-(2.0 - math.log(math.exp(2) + 1 + math.exp(-1))), math.log(3)]
    loss, _ = cross_entropy_forward(logits, targets)
    assert loss.shape == () and abs(float(loss) - sum(by_hand) / 2) < 1e-15


def test_logits_of_1e4_do_not_overflow():
    logits = np.array([[1e4, 0.0, -1e4], [-1e4, 1e4, 1e4]])
    loss, dlogits = cross_entropy(logits, np.array([1, 2]))
    # row 0: loss 1e4 (target is 1e4 below the max); row 1: log 2 (two tied maxima)
    np.testing.assert_allclose(float(loss), (1e4 + math.log(2)) / 2, rtol=1e-15)
    np.testing.assert_allclose(dlogits, [[0.5, -0.5, 0.0], [0.0, 0.25, -0.25]], atol=1e-15)
    loss32, d32 = cross_entropy(logits.astype(np.float32), np.array([1, 2]))
    assert loss32.dtype == np.float32 and np.isfinite(loss32) and np.all(np.isfinite(d32))


def test_every_target_ignored_gives_zero_not_nan():
    logits = np.random.default_rng(0).standard_normal((2, 3, 4))
    targets = np.full((2, 3), -100)
    loss, dlogits = cross_entropy(logits, targets)
    assert float(loss) == 0.0 and not dlogits.any()
    loss_sum, cache = cross_entropy_forward(logits, targets, reduction="sum")
    assert float(loss_sum) == 0.0 and not cross_entropy_backward(1.0, cache).any()


def test_ignored_positions_get_zero_gradient_and_mean_counts_only_kept():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 4, 5))
    targets = np.array([[1, -100, 3, -100]])
    loss, dlogits = cross_entropy(logits, targets)
    kept, _ = cross_entropy_forward(logits[:, [0, 2]], targets[:, [0, 2]])
    assert float(loss) == pytest.approx(float(kept), rel=1e-15)
    assert not dlogits[0, 1].any() and not dlogits[0, 3].any()


def test_label_smoothing_formula():
    logits = np.array([[1.0, -2.0, 0.5]])
    targets = np.array([2])
    log_probs = logits - np.log(np.exp(logits).sum())
    e = 0.3
    want = -(1 - e) * log_probs[0, 2] - e / 3 * log_probs.sum()
    loss, _ = cross_entropy_forward(logits, targets, label_smoothing=e)
    assert float(loss) == pytest.approx(want, rel=1e-15)


def test_contract():
    rng = np.random.default_rng(2)
    targets = np.array([[0, 2, -100], [1, 1, 3]])
    check_contract(lambda d: CrossEntropyLoss(label_smoothing=0.1, dtype=d),
                   (rng.standard_normal((2, 3, 4)), targets))


def test_bad_input():
    logits = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"targets must have shape \(2, 3\)"):
        cross_entropy(logits, np.zeros((3, 2), dtype=np.int64))
    bad = np.zeros((2, 3), dtype=np.int64)
    bad[0, 2] = 4
    with pytest.raises(ValueError, match=r"targets must be integers in \[0, 4\) \(or -100\); "
                                         r"got 4 at position \(0, 2\)"):
        cross_entropy(logits, bad)
    with pytest.raises(TypeError, match="targets must be integers; got dtype float64"):
        cross_entropy(logits, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="reduction must be one of"):
        cross_entropy_forward(logits, bad * 0, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        cross_entropy_forward(logits, bad * 0, label_smoothing=1.5)
