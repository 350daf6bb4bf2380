"""Each kernel (numpy_tf.kernels) against its reference, on the layer's edge cases (the EdgeCase
inputs of numpy_tf.teaching.layer_table) and on arrays of many blocks, in float32 and float64.

Bit for bit where the arithmetic is the same: erf / erfc, GELU (forward and backward; the exact
GELU's float32 forward, which takes one formula for both regions, within 1 ulp), Linear's
forward and backward, attention's forward and dv, the fused qkv gradient, Embedding's backward
into a zero gradient; and attention's the same bits for a whole batch or cut into chunks.

Within a stated number of ulps where the kernel adds in another order (einsum's one-pass row
sums against NumPy's pairwise sums). An ulp here is one unit in the last place of the largest
|value| of the reference array, max |kernel - reference| / spacing(max |reference|): an
elementwise count is meaningless where a result cancels to nearly zero (a LayerNorm input
gradient, an output w x_hat + b near 0). The bounds below are the worst measured over 200
draws of every edge case (in parentheses), rounded up to a power of two; the tests draw 10.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_tf import (GELU, Embedding, FusedAttention, LayerNorm, Linear, RMSNorm,
                      reference_path)
from numpy_tf.core import special
from numpy_tf.kernels import attention as attention_kernels
from numpy_tf.kernels import embedding as embedding_kernels
from numpy_tf.kernels import erf as erf_kernels
from numpy_tf.kernels import gelu as gelu_kernels
from numpy_tf.kernels import linear as linear_kernels
from numpy_tf.kernels import norm as norm_kernels
from numpy_tf.kernels.blocks import block_size
from numpy_tf.layers import activations, attention, embedding, linear, norm
from numpy_tf.layers.multihead import merge_heads
from numpy_tf.teaching.layer_table import LAYERS, EdgeCase

DTYPES = [np.float32, np.float64]
SEEDS = range(10)

# ulps of the largest |value| (measured worst over 200 draws per edge case: float32 / float64)
LAYERNORM_ULPS = 16     # out 4 / 6, x_hat 4 / 6, inv_std 2 / 4, dx 6 / 10; dweight, dbias 0
RMSNORM_ULPS = 32       # out 3 / 5, x_hat 4 / 7, inv_rms 2 / 4, dx 4.5 / 7.75, dweight 0 / 16
ATTENTION_ULPS = 128    # dq 5 / 13, dk 7.5 / 78 (dS^T q cancels: sum_k dS_ik = 0); dv 0
EMBEDDING_ULPS = 4      # into a gradient already holding a sum: 3 / 3 (8 repeats of one id)
GELU_FLOAT32_ULPS = 1   # the exact GELU's float32 forward: 1 (many blocks; smaller arrays
#                         run the reference's regions, 0)
GELU_FLOAT32_ELEMENT_ULPS = 9   # of each element's own value, |y| > 1e-30: 9.0 (the one formula
#                                 on every 3rd float32 with |x| <= 38, worst at x = -0.0655; 7 on
#                                 N(0, 9) draws, which first set this to 8)
GELU_NEAR_FIT_ULPS = 3  # the float32 near fit, |x| < 0.66: 3 of each element (every float32
#                         there, against the reference), 2 of the largest where every |x| is small
GELU_BACKWARD_ULPS = 2  # the exact GELU's float32 backward: 2 (200 draws of 70,000 elements at
#                         each of the scales 0.02, 0.1 and 0.3; 0 at 1 and 3)
GELU_SLOPE_FIT_ULPS = 24    # its slope fit, 1e-30 < |x| < 0.66, of each element's own slope:
#                             24.0 (every 7th float32 there, worst next to x = -0.66, where the
#                             slope 0.043 is 0.5 less 0.457; the reference is 21 from the exact)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal dtype, shape and bit pattern (-0.0 differs from 0.0), any NaN equal to any NaN."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    unsigned = np.uint32 if got.dtype == np.float32 else np.uint64
    return bool(np.all((got.view(unsigned) == want.view(unsigned)) |
                       (np.isnan(got) & np.isnan(want))))


def ulps_of_largest(got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.size:
        return 0.0
    difference = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    return float(difference / np.spacing(np.abs(want).max()).astype(np.float64))


def edge_inputs(name: str, dtype, extra: tuple[EdgeCase, ...] = ()):
    """(case name, seed, forward kwargs) for every edge case of the layer (and `extra`)."""
    spec = LAYERS[name]
    for case in spec.cases + extra:
        for seed in SEEDS:
            yield case.name, seed, spec.case_inputs(case, dtype, seed)


def upstream(out: np.ndarray, seed: int) -> np.ndarray:
    """A random dout, drawn from another stream than the inputs (the same draws as x would
    make LayerNorm's gradient exactly zero when dout = x)."""
    return np.random.default_rng(1000 + seed).standard_normal(np.shape(out)).astype(out.dtype)


def test_the_checks_can_fail():
    a = np.array([0.0, 1.0, np.nan])
    assert same_bits(a, a.copy()) and not same_bits(a, np.array([-0.0, 1.0, np.nan]))
    assert not same_bits(a, np.nextafter(a, 2.0))
    assert ulps_of_largest(np.array([2.0 + 4 * np.spacing(2.0), 1.0]), np.array([2.0, 1.0])) == 4.0


# -- erf and erfc ---------------------------------------------------------------------------------
def _erf_inputs(dtype):
    boundaries = np.array([0.46875, 4.0, 27.5, 26.0, 1e-300, 5e-324])
    edges = np.concatenate([boundaries, np.nextafter(boundaries, 0), np.nextafter(boundaries, 30)])
    grid = np.concatenate([np.linspace(-30, 30, 60001), np.logspace(-300, 1.5, 2000), edges,
                           [0.0, np.inf, np.nan]])
    grid = np.concatenate([grid, -grid]).astype(dtype)
    rng = np.random.default_rng(3)
    block = block_size(np.dtype(dtype).itemsize)
    mostly_near_zero = rng.normal(0.0, 0.3, 5 * block)
    mostly_near_zero[::97] *= 20.0                  # some of every region in each block
    return {"grid": grid, "mostly near zero": mostly_near_zero.astype(dtype),
            "N(0, 1)": rng.standard_normal(5 * block).astype(dtype),
            "N(0, 9)": (3.0 * rng.standard_normal(5 * block)).astype(dtype),
            "one block, all near zero": rng.uniform(-0.4, 0.4, 1000).astype(dtype),
            "2-d, 0-d and empty": rng.standard_normal((7, 3)).astype(dtype)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, reference", [(erf_kernels.blocked_erf, special.erf),
                                               (erf_kernels.blocked_erfc, special.erfc)])
def test_blocked_erf_and_erfc_are_the_reference_bit_for_bit(kernel, reference, dtype):
    for name, x in _erf_inputs(dtype).items():
        assert same_bits(kernel(x), reference(x)), name
    for x in (np.array(0.3, dtype), np.array(-5.0, dtype), np.zeros((0, 3), dtype)):
        assert same_bits(kernel(x), reference(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_thread_count_changes_nothing(monkeypatch, dtype):
    x = (np.random.default_rng(0).standard_normal(300_000) * 3).astype(dtype)   # 10 or 5 blocks
    results = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("NUMPY_TF_NUM_THREADS", threads)
        results.append((erf_kernels.blocked_erf(x), erf_kernels.blocked_erfc(x)))
    for other in results[1:]:
        np.testing.assert_array_equal(other[0], results[0][0])
        np.testing.assert_array_equal(other[1], results[0][1])
    assert same_bits(results[1][1], special.erfc(x))


def test_an_element_does_not_depend_on_its_neighbours():
    """The same value in a block mostly near zero and in one mostly far from it (the two
    paths of erf_block) gives the same bits."""
    for dtype in DTYPES:
        value = np.array([0.25, -0.3, 0.46875], dtype)
        near = np.concatenate([value, np.full(100, 0.1, dtype)])
        far = np.concatenate([value, np.full(100, 3.0, dtype)])
        for complement in (False, True):
            assert same_bits(erf_kernels.erf_block(near, complement)[:3],
                             erf_kernels.erf_block(far, complement)[:3])


# -- GELU -----------------------------------------------------------------------------------------
GELU_LARGE = (EdgeCase("many blocks, N(0, 1)", (4, 3, 30000)),
              EdgeCase("many blocks, N(0, 0.3^2)", (4, 3, 30000), {"scale": 0.3}),
              EdgeCase("many blocks, tanh", (4, 3, 30000), {"approximate": "tanh"}))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_kernels_are_the_reference_bit_for_bit(dtype):
    for case, seed, inputs in edge_inputs("gelu", dtype, GELU_LARGE):
        if seed > 1 and inputs["x"].size > block_size(np.dtype(dtype).itemsize):
            continue                                # two draws of the large arrays suffice
        x, approximate = inputs["x"], inputs.get("approximate", "none")
        out, cache = activations.gelu_forward(x, approximate)
        got = gelu_kernels.gelu_forward_blocks(x, approximate)
        if dtype == np.float32 and approximate == "none":
            assert ulps_of_largest(got, out) <= GELU_FLOAT32_ULPS, case
        else:
            assert same_bits(got, out), case
        dout = upstream(out, seed)
        got = gelu_kernels.gelu_backward_blocks(dout, x, out, approximate)
        want = activations.gelu_backward(dout, cache)
        if dtype == np.float32 and approximate == "none":
            assert ulps_of_largest(got, want) <= GELU_BACKWARD_ULPS, case
            beyond = np.abs(x) >= gelu_kernels._NEAR_FIT_LIMIT
            assert same_bits(got[beyond], want[beyond]), case
        else:
            assert same_bits(got, want), case


def test_the_float32_gelu_forward_is_within_9_ulps_of_every_element():
    """The one-formula float32 forward against the reference, element by element, on a grid
    through both regions and the tails and on N(0, 9) draws; zeros keep x's sign, as x Phi(x)
    gives them. A block with |x| > 38, an inf or a NaN runs the reference's regions: the same
    bits."""
    rng = np.random.default_rng(11)
    x = np.concatenate([np.linspace(-40, 40, 800_001), 3.0 * rng.standard_normal(300_000),
                        [0.0, -0.0, -20.0, -38.0, 38.0, 1e-45, -1e-45]]).astype(np.float32)
    out, _ = activations.gelu_forward(x)
    got = gelu_kernels.gelu_forward_blocks(x, "none")
    shown = np.abs(out) > 1e-30
    element_ulps = np.abs(got.astype(np.float64) - out) / np.spacing(np.abs(out)).astype(np.float64)
    assert element_ulps[shown].max() <= GELU_FLOAT32_ELEMENT_ULPS
    assert np.array_equal(np.signbit(got[out == 0]), np.signbit(out[out == 0]))
    assert not same_bits(got, out)                  # the one formula did run
    worst = np.full(8192, 3.0, np.float32)           # a block the one formula takes, with the
    worst[1::2] = -0.06553246                       # element of its largest difference
    assert gelu_kernels._mostly_far(np.abs(worst))
    got_worst = gelu_kernels.gelu_forward_blocks(worst, "none")[1]
    want_worst = activations.gelu_forward(worst)[0][1]
    assert abs(float(got_worst) - float(want_worst)) / np.spacing(abs(want_worst)) == 9.0
    mostly_near = 0.1 * x[800_001:1_100_001]        # N(0, 0.3^2), 3 % beyond the near region:
    want = activations.gelu_forward(mostly_near)[0]  # the near fit, and the reference beyond
    got = gelu_kernels.gelu_forward_blocks(mostly_near, "none")
    beyond = np.abs(mostly_near) >= gelu_kernels._NEAR_FIT_LIMIT
    assert 0.01 < beyond.mean() < 0.05
    assert same_bits(got[beyond], want[beyond])
    shown = np.abs(want) > 1e-30
    near_ulps = np.abs(got.astype(np.float64) - want)[shown] / np.spacing(np.abs(want[shown]))
    assert near_ulps.max() <= GELU_NEAR_FIT_ULPS
    assert not same_bits(got, want)                 # the fit did run
    block = block_size(x.itemsize)
    for special_value in (np.inf, -np.inf, np.nan, 38.5, -1e30):
        mixed = x[:block + 100].copy()
        mixed[[5, block + 7]] = special_value       # in the first block and the second
        with np.errstate(invalid="ignore"):         # -inf Phi(-inf) = -inf 0 is NaN in both
            assert same_bits(gelu_kernels.gelu_forward_blocks(mixed, "none"),
                             activations.gelu_forward(mixed)[0]), special_value


def test_the_float32_near_fit_is_within_3_ulps_of_the_reference_and_closer_to_the_exact_gelu():
    """Phi(x) = 1/2 + x Q(x^2) on every 389th float32 with |x| < 0.66 (5.4 million values;
    every one of them measured once: 3.00 ulps at most from the reference), against the
    float32 reference and against the float64 one, in ulps of the float32 result: within 3 of
    the reference, and no farther from the exact value than the reference itself is (on every
    61st: the fit 2.08 ulps at worst, the reference's Cody R1 2.65); zeros keep their sign."""
    top = int(np.float32(gelu_kernels._NEAR_FIT_LIMIT).view(np.uint32))
    bits = np.arange(0, top, 389, dtype=np.uint32)
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    got = np.empty_like(x)
    gelu_kernels._gelu_near_float32(x, got)
    reference = activations.gelu_forward(x)[0].astype(np.float64)
    exact = activations.gelu_forward(x.astype(np.float64))[0]
    shown = np.abs(exact) > 1e-30
    spacing = np.spacing(np.abs(exact[shown]).astype(np.float32)).astype(np.float64)

    def ulps(values):
        return np.abs(values[shown] - exact[shown]) / spacing

    assert (np.abs(got[shown] - reference[shown]) / spacing).max() <= GELU_NEAR_FIT_ULPS
    assert ulps(got).max() <= ulps(reference).max()
    zero = got == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(x[zero]))


@pytest.mark.parametrize("scale", [0.02, 0.05, 0.1, 0.2])
def test_a_float32_gelu_input_all_near_zero_is_within_3_ulps_of_the_largest(scale):
    """Where every |x| is small (a freshly initialised model's) the largest |y| shares its
    binade with many elements, so the fit's few-ulp differences from Cody's R1 show against
    it: 2 ulps of the largest measured over 3,000 blocks of 4,096 to 70,000 elements at
    scales 0.01 to 60 (GELU_NEAR_FIT_ULPS = 3); with larger values beside them, 1."""
    x = (scale * np.random.default_rng(7).standard_normal(200_000)).astype(np.float32)
    got = gelu_kernels.gelu_forward_blocks(x, "none")
    want = activations.gelu_forward(x)[0]
    assert not same_bits(got, want)
    assert ulps_of_largest(got, want) <= GELU_NEAR_FIT_ULPS


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.05, 60.0), st.integers(0, 3))
def test_the_float32_gelu_forward_holds_its_bound_on_any_block(seed, scale, specials):
    """Blocks of 4096 to 12000 elements drawn at any spread (mostly near zero to mostly past
    |x| = 38) with infs and NaNs sprinkled in: every element within 9 ulps of its own reference
    value (where that is above 1e-30), zeros of the same sign, NaN where the reference's is."""
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal(int(rng.integers(4096, 12000)))).astype(np.float32)
    x[rng.integers(0, x.size, specials)] = rng.choice([np.inf, -np.inf, np.nan], specials)
    with np.errstate(invalid="ignore"):
        want = activations.gelu_forward(x)[0]
        got = gelu_kernels.gelu_forward_blocks(x, "none")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    infinite = np.isinf(want)
    assert np.array_equal(got[infinite], want[infinite])
    shown = np.isfinite(want) & (np.abs(want) > 1e-30)
    ulps = np.abs(got[shown].astype(np.float64) - want[shown]) / np.spacing(np.abs(want[shown]))
    assert ulps.max(initial=0.0) <= GELU_FLOAT32_ELEMENT_ULPS
    zero = want == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero]))


def test_the_float32_gelu_slope_fit_is_within_24_ulps_and_closer_to_the_exact_slope():
    """dy/dx = 1/2 + x T(x^2) on every 389th float32 with 1e-30 < |x| < 0.66 (5.4 million
    values), against the reference's Phi(x) + x phi(x) and against the exact slope (float64),
    in ulps of the float32 slope: within GELU_SLOPE_FIT_ULPS of the reference, and no farther
    from the exact value than the reference itself is. dout is a power of two, so that
    dx / dout is the slope exactly."""
    top = int(np.float32(gelu_kernels._NEAR_FIT_LIMIT).view(np.uint32))
    bits = np.arange(int(np.float32(1e-30).view(np.uint32)), top, 389, dtype=np.uint32)
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    dout = (2.0 ** np.random.default_rng(3).integers(-3, 4, x.size)).astype(np.float32)
    out, cache = activations.gelu_forward(x)
    got = gelu_kernels.gelu_backward_blocks(dout, x, out, "none") / dout
    reference = activations.gelu_backward(dout, cache) / dout
    x64 = x.astype(np.float64)
    exact = (0.5 * special.erfc(-x64 / np.sqrt(2.0))
             + x64 * np.exp(-0.5 * x64 * x64) / np.sqrt(2.0 * np.pi))
    spacing = np.spacing(exact.astype(np.float32)).astype(np.float64)

    def ulps(values, of, where=slice(None)):
        return (np.abs(values[where].astype(np.float64) - of[where]) / spacing[where]).max()

    assert not same_bits(got, reference)            # the fit did run
    assert ulps(got, reference.astype(np.float64)) <= GELU_SLOPE_FIT_ULPS
    for side in (x > 0, x < 0):                     # on each side of zero
        assert ulps(got, exact, side) <= ulps(reference, exact, side)


@pytest.mark.parametrize("scale", [0.02, 0.3, 3.0])
def test_the_float32_gelu_backward_into_dout_is_the_same_bits(scale):
    """overwrite_dout=True writes dx into dout's own array: the same bits as a new dx, also
    for the elements past the slope fit, whose dout the fitted block overwrites."""
    rng = np.random.default_rng(5)
    x = (scale * rng.standard_normal((3, 70_000))).astype(np.float32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    out = gelu_kernels.gelu_forward_blocks(x, "none")
    want = gelu_kernels.gelu_backward_blocks(dout, x, out, "none")
    given = dout.copy()
    got = gelu_kernels.gelu_backward_blocks(given, x, out, "none", overwrite_dout=True)
    assert got is not None and np.shares_memory(got, given)
    assert same_bits(got, want)
    reference = activations.gelu_backward(dout, activations.GELUCache(x, out, "none"))
    assert same_bits(want, reference) == (scale == 3.0)     # the fit runs at the smaller spreads


@pytest.mark.parametrize("special_value", [np.inf, -np.inf, np.nan])
def test_a_float32_gelu_backward_block_with_an_inf_or_nan_is_the_reference(special_value):
    x = (0.3 * np.random.default_rng(8).standard_normal(3 * 70_000)).astype(np.float32)
    x[[11, 70_000 + 5]] = special_value
    dout = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        out, cache = activations.gelu_forward(x)
        got = gelu_kernels.gelu_backward_blocks(dout, x, out, "none")
        want = activations.gelu_backward(dout, cache)
    first = slice(0, 2 * block_size(4))             # the blocks holding the special values
    assert same_bits(got[first], want[first])
    assert not same_bits(got, want)                 # the blocks without run the fit
    assert ulps_of_largest(got[np.isfinite(want)], want[np.isfinite(want)]) <= GELU_BACKWARD_ULPS


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_backward_is_the_same_for_any_thread_count(monkeypatch, dtype):
    x = (np.random.default_rng(6).standard_normal(300_000) * 3).astype(dtype)     # 10 or 5 blocks
    dout = np.random.default_rng(7).standard_normal(x.shape).astype(dtype)
    out = gelu_kernels.gelu_forward_blocks(x, "none")
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("NUMPY_TF_NUM_THREADS", threads)
        results.append(gelu_kernels.gelu_backward_blocks(dout, x, out, "none"))
    np.testing.assert_array_equal(results[0], results[1])


def test_gelu_kernel_names_a_dout_of_the_wrong_shape():
    x = np.linspace(-2, 2, 6).reshape(2, 3)
    with pytest.raises(ValueError, match=r"dout must have the shape of GELU's output \(2, 3\); "
                                         r"got \(3,\)"):
        gelu_kernels.gelu_backward_blocks(np.ones(3), x, x, "none")


# -- Linear ---------------------------------------------------------------------------------------
LINEAR_WIDE = (EdgeCase("wide", (3, 7, 64)), EdgeCase("many rows", (4, 33, 40)))


def linear_ulps(dtype) -> dict:
    """The worst ulps of the Linear kernels against the references over the edge cases: the
    forward, dx, and dW and db added into gradients that already hold something, as
    Linear.backward adds the reference's."""
    worst = {}
    for case, seed, inputs in edge_inputs("linear", dtype, LINEAR_WIDE):
        out, cache = linear.linear_forward(**inputs)
        dout = upstream(out, seed)
        dx, dweight, dbias = linear.linear_backward(dout, cache)
        rng = np.random.default_rng(seed)
        held = rng.standard_normal(cache.weight.shape).astype(dtype)
        held_bias = rng.standard_normal(cache.weight.shape[0]).astype(dtype)
        weight_grad, bias_grad = held.copy(), held_bias.copy() if cache.has_bias else None
        got = {"out": linear_kernels.linear_rows(**inputs),
               "dx": linear_kernels.linear_backward_into(dout, cache.x, cache.weight,
                                                         weight_grad, bias_grad),
               "dweight": weight_grad, "dbias": bias_grad}
        want = {"out": out, "dx": dx, "dweight": held + dweight,
                "dbias": held_bias + dbias if cache.has_bias else None}
        for name, value in got.items():
            if value is not None:
                equal = same_bits(value, want[name])
                worst[name] = max(worst.get(name, 0.0),
                                  0.0 if equal else max(ulps_of_largest(value, want[name]),
                                                        2.0 ** -20))
    return worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_kernels_are_the_reference_bit_for_bit(dtype):
    assert set(linear_ulps(dtype).values()) == {0.0}


# -- LayerNorm and RMSNorm ------------------------------------------------------------------------
NORM_WIDE = (EdgeCase("C = 128", (4, 16, 128)), EdgeCase("C = 768", (2, 8, 768)))


def _rmsnorm_rows(x, weight, eps, unit_offset=False):
    """The kernel as RMSNorm.forward runs it: unit_offset's gamma = 1 + w taken first."""
    if unit_offset and weight is not None:
        weight = 1.0 + weight
    return norm_kernels.rmsnorm_rows(x, weight, eps)


NORMS = {   # reference forward, backward; kernel forward, backward; the compared quantities
    "layernorm": (norm.layernorm_forward, norm.layernorm_backward, norm_kernels.layernorm_rows,
                  norm_kernels.layernorm_rows_backward,
                  ("out", "x_hat", "inv_std", "dx", "dweight", "dbias")),
    "rmsnorm": (norm.rmsnorm_forward, norm.rmsnorm_backward, _rmsnorm_rows,
                norm_kernels.rmsnorm_rows_backward, ("out", "x_hat", "inv_rms", "dx", "dweight"))}


def norm_ulps(name: str, dtype) -> dict:
    """{quantity: worst ulps} of a norm's kernels over its edge cases and NORM_WIDE."""
    forward, backward, kernel_forward, kernel_backward, names = NORMS[name]
    options = {"rms": True, "eps": 1e-6} if name == "rmsnorm" else {}
    worst = {}
    for case, seed, inputs in edge_inputs(name, dtype, tuple(
            EdgeCase(c.name, c.shape, options) for c in NORM_WIDE)):
        out, cache = forward(**inputs)
        dout = upstream(out, seed)
        kernel = kernel_forward(**inputs) + kernel_backward(dout, *cache)
        reference = (out, *cache[:2]) + backward(dout, cache)
        for quantity, got, want in zip(names, kernel, reference):
            assert (got is None) == (want is None), (case, quantity)
            if want is not None:
                worst[quantity] = max(worst.get(quantity, 0.0), ulps_of_largest(got, want))
    return worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_kernels_within_their_ulps(dtype):
    worst = norm_ulps("layernorm", dtype)
    assert max(worst.values()) <= LAYERNORM_ULPS, worst
    assert worst["dweight"] == worst["dbias"] == 0.0, worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_kernels_within_their_ulps(dtype):
    worst = norm_ulps("rmsnorm", dtype)
    assert max(worst.values()) <= RMSNORM_ULPS, worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_norm_classes_pair_kernel_and_reference_caches_either_way(dtype):
    """A forward under one setting and a backward under the other: each backward is the one
    of the tier that made the cache (the kernel's cache type says so)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    dout = rng.standard_normal(x.shape).astype(dtype)
    for layer in (LayerNorm(8, dtype=dtype), RMSNorm(8, 1e-6, dtype=dtype)):
        layer.weight.data[:] = rng.uniform(0.5, 1.5, 8)
        _, kernel_cache = layer.forward(x)
        with reference_path():
            _, reference_cache = layer.forward(x)
            dx_kernel = layer.backward(dout, kernel_cache)
        dx_reference = layer.backward(dout, reference_cache)
        reference = norm.layernorm_backward if isinstance(layer, LayerNorm) else \
            norm.rmsnorm_backward
        kernel = norm_kernels.layernorm_rows_backward if isinstance(layer, LayerNorm) else \
            norm_kernels.rmsnorm_rows_backward
        assert same_bits(dx_reference, reference(dout, reference_cache)[0])
        assert same_bits(dx_kernel, kernel(dout, *kernel_cache)[0])


# -- attention ------------------------------------------------------------------------------------
ATTENTION_LARGE = (EdgeCase("causal, T = 64, d = 32", (2, 4, 64, 32), {"causal": True}),)


def attention_ulps(dtype) -> dict:
    spec = LAYERS["attention"]
    worst = {}
    for case, seed, inputs in edge_inputs("attention", dtype, ATTENTION_LARGE):
        out, cache = spec.call(attention.attention_forward, inputs)
        dout = upstream(out, seed)
        for name, got, want in zip(("dq", "dk", "dv"),
                                   attention_kernels.attention_backward_into(dout, *cache),
                                   attention.attention_backward(dout, cache)):
            worst[name] = max(worst.get(name, 0.0), ulps_of_largest(got, want))
    return worst


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_backward_kernel_within_its_ulps(dtype):
    worst = attention_ulps(dtype)
    assert worst["dv"] == 0.0 and max(worst.values()) <= ATTENTION_ULPS, worst


ATTENTION_CHUNKED = ATTENTION_LARGE + (
    EdgeCase("padding, 5 samples", (5, 2, 6, 3), {"padding": "one sequence all padding"}),
    EdgeCase("float mask, 3 samples", (3, 2, 4, 4), {"mask": "float"}))


@pytest.mark.parametrize("chunk_bytes", [1, 1200])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_forward_kernel_is_the_reference_bit_for_bit(monkeypatch, dtype, chunk_bytes):
    """kernel_attention_forward against attention_forward on every edge case (dropout and the
    soft cap take the reference itself), the batch cut into one chunk per sample (or a few
    samples per chunk); the backward in chunks equals the backward of the whole batch."""
    spec = LAYERS["attention"]
    whole = []
    for case, seed, inputs in edge_inputs("attention", dtype, ATTENTION_CHUNKED):
        out, cache = spec.call(attention.attention_forward, inputs)
        dout = upstream(out, seed)
        whole.append(attention_kernels.attention_backward_into(dout, *cache))
    monkeypatch.setattr(attention_kernels, "CHUNK_BYTES", chunk_bytes)
    assert len(attention_kernels._chunks(np.zeros((5, 2, 6, 3)), 6)) == (5 if chunk_bytes == 1
                                                                          else 3)
    for index, (case, seed, inputs) in enumerate(edge_inputs("attention", dtype,
                                                             ATTENTION_CHUNKED)):
        out, cache = spec.call(attention.attention_forward, inputs)
        got, kernel_cache = spec.call(attention.kernel_attention_forward, inputs)
        assert type(kernel_cache) is attention.AttentionKernelCache, case
        assert same_bits(got, out), case
        for name, a, b in zip(cache._fields, kernel_cache, cache):
            assert same_bits(a, b) if isinstance(b, np.ndarray) else a == b, (case, name)
        dout = upstream(out, seed)
        for a, b in zip(attention_kernels.attention_backward_into(dout, *kernel_cache),
                        whole[index]):
            assert same_bits(a, b), case


@given(batch=st.integers(1, 40), heads=st.integers(1, 8), tq=st.integers(0, 70),
       tk=st.integers(0, 300), double=st.booleans())
def test_one_chunk_is_whether_the_chunks_are_one(batch, heads, tq, tk, double):
    """one_chunk (which sends a batch to the reference forward) says what _chunks does."""
    q = np.empty((batch, heads, tq, 1), np.float64 if double else np.float32)
    assert attention_kernels.one_chunk(q, tk) == (len(attention_kernels._chunks(q, tk)) == 1)


def test_a_decoded_token_runs_the_reference_and_a_chunked_batch_the_kernel(monkeypatch):
    """kernel_attention_forward hands a single chunk to the reference's operations and cuts a
    larger batch into chunks for attention_rows: both give an AttentionKernelCache."""
    calls = []
    rows = attention_kernels.attention_rows
    monkeypatch.setattr(attention, "attention_rows",
                        lambda *args: calls.append(args[0].shape[0]) or rows(*args))
    rng = np.random.default_rng(3)
    for batch in (1, 64):
        q, k, v = (rng.standard_normal((batch, 4, 40, 8)) for _ in range(3))
        out, cache = attention.kernel_attention_forward(q, k, v, is_causal=True)
        assert type(cache) is attention.AttentionKernelCache
        assert same_bits(out, attention.attention_forward(q, k, v, is_causal=True)[0])
    assert calls == [64]


@pytest.mark.parametrize("groups", [4, 2, 1])
def test_backward_into_given_arrays_equals_returned_ones(groups):
    """attention_backward_into(..., out=(dq, dk, dv)) writes into strided views (here the
    thirds of a fused (B, T, 3 H d) gradient, as FusedAttention passes them) exactly what it
    returns without out, for plain and grouped heads."""
    rng = np.random.default_rng(11)
    batch, heads, length, width = 2, 4, 5, 3
    q = rng.standard_normal((batch, heads, length, width))
    k, v = (rng.standard_normal((batch, groups, length, width)) for _ in range(2))
    out, cache = attention.attention_forward(q, k, v, is_causal=True)
    dout = rng.standard_normal(out.shape)
    expected = attention_kernels.attention_backward_into(dout, *cache)
    fused = np.full((batch, length, (heads + 2 * groups) * width), np.nan)
    views, start = [], 0
    for count in (heads, groups, groups):
        part = fused[..., start:start + count * width]
        views.append(part.reshape(batch, length, count, width).transpose(0, 2, 1, 3))
        start += count * width
    returned = attention_kernels.attention_backward_into(dout, *cache, out=tuple(views))
    for want, got, view in zip(expected, returned, views):
        assert got is view
        np.testing.assert_array_equal(view, want)
    assert not np.isnan(fused).any()


def test_backward_names_out_arrays_of_the_wrong_shape():
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    out, cache = attention.attention_forward(q, k, v)
    wrong = (np.empty_like(q), np.empty_like(k), np.empty((1, 2, 3, 5)))
    with pytest.raises(ValueError, match=r"out must be three arrays shaped and typed like q, k "
                                         r"and v .* got .*\(1, 2, 3, 5\) float64"):
        attention_kernels.attention_backward_into(rng.standard_normal(out.shape), *cache,
                                                  out=wrong)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_qkv_gradient_is_the_three_head_gradients_side_by_side(dtype):
    """qkv_gradient writes dq, dk, dv into the thirds of (B, T, 3C): bit for bit the
    concatenation the reference FusedAttention backward builds from the same head
    gradients."""
    for case, seed, inputs in edge_inputs("attention", dtype):
        if inputs["k"].shape[1] != inputs["q"].shape[1] or \
                inputs["k"].shape[2:] != inputs["q"].shape[2:] or inputs["v"].shape != \
                inputs["k"].shape:
            continue                                # FusedAttention: self-attention, H = G
        out, cache = LAYERS["attention"].call(attention.attention_forward, inputs)
        dout = upstream(out, seed)
        heads = attention_kernels.attention_backward_into(dout, *cache)
        concatenated = np.concatenate([merge_heads(g) for g in heads], axis=-1)
        assert same_bits(attention_kernels.qkv_gradient(dout, *cache), concatenated), case


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", [False, True])
def test_fused_attention_kernel_path_against_the_reference_path(dtype, rope):
    rng = np.random.default_rng(5)
    layer = FusedAttention(16, 4, bias=True, rope=rope, rng=1, dtype=dtype)
    x = rng.standard_normal((2, 6, 16)).astype(dtype)
    dout = rng.standard_normal(x.shape).astype(dtype)
    results = []
    for use_reference in (False, True):
        layer.zero_grad()
        if use_reference:
            with reference_path():
                out, cache = layer.forward(x, is_causal=True)
        else:
            out, cache = layer.forward(x, is_causal=True)
        dx = layer.backward(dout, cache)
        results.append([out, dx] + [p.grad.copy() for p in layer.parameters()])
    assert same_bits(results[0][0], results[1][0])                  # the same forward
    for got, want in zip(results[0][1:], results[1][1:]):
        assert ulps_of_largest(got, want) <= ATTENTION_ULPS


# -- Embedding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_into_a_zero_gradient_is_the_reference_bit_for_bit(dtype):
    for case, seed, inputs in edge_inputs("embedding", dtype):
        out, cache = embedding.embedding_forward(**inputs)
        dout = upstream(out, seed)
        grad = np.zeros_like(inputs["weight"])
        embedding_kernels.embedding_backward_into(grad, dout, cache.ids, cache.padding_idx)
        assert same_bits(grad, embedding.embedding_backward(dout, cache)), case


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_into_a_gradient_already_holding_a_sum(dtype):
    """A tied weight's gradient holds the head's part before the lookup's is added: the
    kernel adds each row's gradients one by one to it, the reference adds their sum, so a
    repeated id may round differently: within EMBEDDING_ULPS."""
    for case, seed, inputs in edge_inputs("embedding", dtype):
        out, cache = embedding.embedding_forward(**inputs)
        dout = upstream(out, seed)
        held = np.random.default_rng(seed).standard_normal(inputs["weight"].shape)
        grad = held.astype(dtype)
        embedding_kernels.embedding_backward_into(grad, dout, cache.ids, cache.padding_idx)
        want = held.astype(dtype) + embedding.embedding_backward(dout, cache)
        assert ulps_of_largest(grad, want) <= EMBEDDING_ULPS, case


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_by_occurrence_levels_adds_as_np_add_at_does(dtype):
    """Batches large enough for the occurrence levels (and a skewed one that is not): into a
    zero gradient the reference's bits, into one holding a sum np.add.at's (each row's
    gradients added one by one, in position order)."""
    rng = np.random.default_rng(5)
    skewed = rng.integers(0, 40, (8, 128))
    skewed[:, ::3] = 7                                       # id 7 fills a third: np.add.at
    for name, ids, padding_idx, levels in (
            ("uniform", rng.integers(0, 256, (16, 64)), None, True),
            ("few ids, with padding", rng.integers(0, 12, (4, 300)), 3, True),
            ("skewed", skewed, None, False)):
        weight = rng.standard_normal((256, 48)).astype(dtype)
        out, cache = embedding.embedding_forward(ids, weight, padding_idx)
        dout = upstream(out, 1)
        kept = ids.reshape(-1) != padding_idx
        assert np.count_nonzero(kept) * 48 >= embedding_kernels.LEVELS_MIN_SIZE   # the rows added
        assert (embedding_kernels._occurrence_levels(ids.reshape(-1)[kept]) is not None) \
            == levels, name
        grad = np.zeros_like(weight)
        embedding_kernels.embedding_backward_into(grad, dout, cache.ids, cache.padding_idx)
        assert same_bits(grad, embedding.embedding_backward(dout, cache)), name
        held = rng.standard_normal(weight.shape).astype(dtype)
        grad, want = held.copy(), held.copy()
        embedding_kernels.embedding_backward_into(grad, dout, cache.ids, cache.padding_idx)
        np.add.at(want, ids.reshape(-1)[kept], dout.reshape(-1, 48)[kept])
        assert same_bits(grad, want), name


def test_embedding_class_pairs_each_cache_with_its_backward():
    layer = Embedding(6, 3, padding_idx=1)
    ids = np.array([[1, 2, 2, 5]])
    dout = np.random.default_rng(0).standard_normal((1, 4, 3))
    _, kernel_cache = layer.forward(ids)
    with reference_path():
        _, reference_cache = layer.forward(ids)
    assert type(kernel_cache) is embedding.EmbeddingKernelCache
    assert type(reference_cache) is embedding.EmbeddingCache
    for cache in (kernel_cache, reference_cache):
        layer.zero_grad()
        layer.backward(dout, cache)
        assert same_bits(layer.weight.grad, embedding.embedding_backward(dout, reference_cache))


# -- the classes run the kernels by default -------------------------------------------------------
def _raises(*args, **kwargs):
    raise RuntimeError("replaced function ran")


def _run(layer, args, kwargs, reference: bool):
    if reference:
        with reference_path():
            out, cache = layer.forward(*args, **kwargs)
    else:
        out, cache = layer.forward(*args, **kwargs)
    layer.backward(np.random.default_rng(1).standard_normal(out.shape), cache)


def _layers():
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    return [(Linear(8, 4), (x,), {}), (LayerNorm(8), (x,), {}), (RMSNorm(8, 1e-6), (x,), {}),
            (GELU(), (x,), {}), (GELU("tanh"), (x,), {}),
            (Embedding(5, 8), (np.array([[0, 1, 1]]),), {}),
            (FusedAttention(8, 2), (x,), {"is_causal": True})]


def test_each_class_runs_its_kernels_by_default(monkeypatch):
    """Every kernel replaced by a function that raises: outside reference_path each class
    fails, inside it each runs."""
    from numpy_tf.layers import multihead
    for module, name in [(activations, "gelu_forward_blocks"),
                         (activations, "gelu_backward_blocks"), (linear, "linear_rows"),
                         (norm, "layernorm_rows"), (norm, "layernorm_rows_backward"),
                         (norm, "rmsnorm_rows"), (norm, "rmsnorm_rows_backward"),
                         (linear, "linear_backward_into"),
                         (embedding, "embedding_backward_into"),
                         (multihead, "kernel_attention_forward"),
                         (multihead, "attention_backward_into"), (multihead, "qkv_gradient")]:
        monkeypatch.setattr(module, name, _raises)
    for layer, args, kwargs in _layers():
        _run(layer, args, kwargs, reference=True)
        with pytest.raises(RuntimeError, match="replaced function ran"):
            _run(layer, args, kwargs, reference=False)


def test_each_class_runs_its_references_inside_reference_path(monkeypatch):
    """Every reference function a class has a kernel for replaced by one that raises: the
    default path runs, reference_path fails."""
    from numpy_tf.layers import multihead
    for module, name in [(activations, "gelu_forward"), (activations, "gelu_backward"),
                         (linear, "linear_forward"), (linear, "linear_backward"),
                         (norm, "layernorm_forward"),
                         (norm, "layernorm_backward"), (norm, "rmsnorm_forward"),
                         (norm, "rmsnorm_backward"), (embedding, "embedding_backward"),
                         (multihead, "attention_forward"), (multihead, "attention_backward")]:
        monkeypatch.setattr(module, name, _raises)
    for layer, args, kwargs in _layers():
        _run(layer, args, kwargs, reference=False)
        with pytest.raises(RuntimeError, match="replaced function ran"):
            _run(layer, args, kwargs, reference=True)
