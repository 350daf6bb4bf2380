"""RoPE: the STYLE.md checklist, its identities (length kept, relative position, layouts related
by a permutation), a worked example by hand, and bad input."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import (RotaryEmbedding, gradcheck, gradcheck_module, rope_backward, rope_forward,
                      rope_rotate, rope_tables)

HEAD_DIMS = st.sampled_from([2, 4, 6, 8, 64])


def rotate(vector, position, interleaved, base=10000.0):
    """One head_dim vector rotated at one position."""
    x = np.asarray(vector, dtype=np.float64).reshape(1, 1, 1, -1)
    out, _ = rope_forward(x, np.array([position]), base, interleaved)
    return out.reshape(-1)


def layout_permutation(head_dim):
    """Feature i of the half layout is feature perm[i] of the interleaved one."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


# -- 1. finite differences --------------------------------------------------------------------
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), length=st.integers(1, 4),
       head_dim=HEAD_DIMS, interleaved=st.booleans(), per_sequence=st.booleans(),
       base=st.sampled_from([10000.0, 500000.0, 10.0]), seed=st.integers(0, 2**16))
def test_gradcheck_drawn(batch, heads, length, head_dim, interleaved, per_sequence, base,
                         seed):
    rng = np.random.default_rng(seed)
    shape = (batch, length) if per_sequence else (length,)
    inputs = {"x": rng.standard_normal((batch, heads, length, head_dim)),
              "positions": rng.integers(0, 5000, shape), "base": base,
              "interleaved": interleaved}
    report = gradcheck(rope_forward, rope_backward, inputs, seed=seed + 1)
    assert report.passed, str(report)


def test_module_gradcheck():
    x = np.random.default_rng(3).standard_normal((2, 2, 3, 6))
    for interleaved in (True, False):
        assert gradcheck_module(RotaryEmbedding(6, interleaved=interleaved), x,
                                forward_kwargs={"offset": 4}).passed


# -- 2. torch ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rope_interleaved", "rope_half", "rope_half_position_ids",
                                  "rope_interleaved_position_ids", "rope_half_llama"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


# -- 3-5. dtype, twice, nothing mutated -------------------------------------------------------
def test_contract():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 8))
    for interleaved in (True, False):
        check_contract(lambda dtype: RotaryEmbedding(8, interleaved=interleaved, dtype=dtype),
                       (x,), offset=2)
        check_contract(lambda dtype: RotaryEmbedding(8, interleaved=interleaved, dtype=dtype),
                       (x, np.array([[0, 0, 1, 2], [5, 6, 7, 8]])))


def test_tables_shape_and_dtype():
    cos, sin = rope_tables(np.arange(5), 8, dtype=np.float32)
    assert cos.shape == sin.shape == (5, 4) and cos.dtype == sin.dtype == np.float32
    cos, sin = rope_tables(np.zeros((2, 5), dtype=np.int32), 8)
    assert cos.shape == (2, 1, 5, 4)
    np.testing.assert_array_equal(cos, 1.0)                   # position 0: no rotation
    np.testing.assert_array_equal(sin, 0.0)


# -- 6. identities and the worked example -----------------------------------------------------
def test_worked_example():
    """q = [1, 2, 3, 4] at position 2 and k = [2, 0, 1, -1] at position 5, interleaved, base
    10000: the dot product is -2.205086, the same as at positions 0 and 3 (offset 3)."""
    q, k = [1.0, 2.0, 3.0, 4.0], [2.0, 0.0, 1.0, -1.0]
    score = rotate(q, 2, True) @ rotate(k, 5, True)
    print(f"RoPE worked example: <R_2 q, R_5 k> = {score:.6f}")
    assert round(score, 6) == -2.205086
    assert score == pytest.approx(rotate(q, 0, True) @ rotate(k, 3, True), rel=1e-14)
    # by hand: pair 0 turns by 3 rad, pair 1 by 3 / 100 rad relative to each other
    by_hand = (2 * np.cos(3.0) + 4 * np.sin(3.0)
               + 3 * (np.cos(0.03) + np.sin(0.03)) + 4 * (np.sin(0.03) - np.cos(0.03)))
    assert score == pytest.approx(by_hand, rel=1e-14)


@given(head_dim=HEAD_DIMS, m=st.integers(0, 3000), n=st.integers(0, 3000),
       interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_relative_position_identity(head_dim, m, n, interleaved, seed):
    """<R_m q, R_n k> = <q, R_(n-m) k> (or <R_(m-n) q, k> when m > n)."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(head_dim), rng.standard_normal(head_dim)
    score = rotate(q, m, interleaved) @ rotate(k, n, interleaved)
    relative = q @ rotate(k, n - m, interleaved) if n >= m else \
        rotate(q, m - n, interleaved) @ k
    # angles up to 3000 rad carry a rounding of about 3000 * 1.1e-16 each
    assert score == pytest.approx(relative, rel=1e-11, abs=1e-11 * head_dim)


@given(batch=st.integers(1, 2), heads=st.integers(1, 2), length=st.integers(1, 4),
       head_dim=HEAD_DIMS, interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_length_is_preserved_and_backward_undoes_forward(batch, heads, length, head_dim,
                                                        interleaved, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, heads, length, head_dim)) * 3.0
    positions = rng.integers(0, 10000, length)
    out, cache = rope_forward(x, positions, interleaved=interleaved)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-14)
    np.testing.assert_allclose(rope_backward(out, cache), x, rtol=0, atol=1e-14)


@given(head_dim=HEAD_DIMS, seed=st.integers(0, 2**16))
def test_layouts_differ_by_a_fixed_permutation(head_dim, seed):
    """rotate_half(x[..., perm]) = rotate_interleaved(x)[..., perm], forward and backward."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 2, 3, head_dim))
    positions = rng.integers(0, 100, (2, 3))
    perm = layout_permutation(head_dim)
    interleaved, cache_i = rope_forward(x, positions, interleaved=True)
    half, cache_h = rope_forward(x[..., perm], positions, interleaved=False)
    np.testing.assert_array_equal(half, interleaved[..., perm])
    np.testing.assert_array_equal(rope_backward(x[..., perm], cache_h),
                                  rope_backward(x, cache_i)[..., perm])
    if head_dim > 2:        # with one pair the layouts coincide; otherwise they really differ
        assert not np.allclose(rope_forward(x, positions, interleaved=False)[0], interleaved)


def test_offset_and_positions_agree_with_token_by_token_decoding():
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 8))
    rope = RotaryEmbedding(8, interleaved=False)
    whole, _ = rope.forward(x)
    np.testing.assert_array_equal(whole, rope.forward(x, positions=np.arange(5))[0])
    for t in range(5):
        step, _ = rope.forward(x[:, :, t:t + 1], offset=t)
        np.testing.assert_array_equal(step, whole[:, :, t:t + 1])


def test_per_sequence_positions_for_left_padding():
    x = np.random.default_rng(5).standard_normal((2, 2, 4, 6))
    positions = np.array([[0, 0, 0, 1], [0, 1, 2, 3]])        # the first sequence is padded
    out, _ = rope_forward(x, positions)
    for b in range(2):
        alone, _ = rope_forward(x[b:b + 1], positions[b])
        np.testing.assert_array_equal(out[b:b + 1], alone)


def test_float32_stays_float32():
    x = np.random.default_rng(6).standard_normal((1, 2, 3, 4)).astype(np.float32)
    out, cache = RotaryEmbedding(4, base=np.float64(10000.0)).forward(x, offset=7)
    assert out.dtype == cache.cos.dtype == cache.sin.dtype == np.float32
    assert rope_backward(out, cache).dtype == np.float32
    assert rope_rotate(x, cache.cos, cache.sin, True).dtype == np.float32


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input():
    rope = RotaryEmbedding(4)
    x = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"head_dim must be even \(rotations act on pairs of "
                                         r"features\); got 5"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match=r"x must have an even last dimension head_dim.*got "
                                         r"shape \(1, 1, 2, 3\)"):
        rope_forward(np.zeros((1, 1, 2, 3)), np.arange(2))
    with pytest.raises(ValueError, match=r"x must have 4 dimensions \(B, H, T, head_dim\); got "
                                         r"shape \(2, 3, 4\)"):
        rope.forward(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"x must have last dimension 4 \(head_dim\)"):
        rope.forward(np.zeros((1, 2, 3, 6)))
    with pytest.raises(TypeError, match="positions must be integers; got dtype float64"):
        rope.forward(x, positions=np.arange(3.0))
    with pytest.raises(ValueError, match=r"positions must have shape \(3,\) to match x's "
                                         r"\(B, T\) = \(1, 3\); got \(4,\)"):
        rope.forward(x, positions=np.arange(4))
    with pytest.raises(ValueError, match=r"positions must have shape \(1, 3\).*got \(2, 3\)"):
        rope.forward(x, positions=np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"positions must be non-negative; got -1 at position "
                                         r"\(2,\)"):
        rope.forward(x, positions=np.array([0, 1, -1]))
    with pytest.raises(ValueError, match="give positions or offset, not both"):
        rope.forward(x, positions=np.arange(3), offset=2)
    with pytest.raises(ValueError, match="offset must be a non-negative integer; got -1"):
        rope.forward(x, offset=-1)
    with pytest.raises(TypeError, match="interleaved must be True"):
        RotaryEmbedding(4, interleaved="half")
    with pytest.raises(ValueError, match="base must be a finite number > 0; got 0"):
        RotaryEmbedding(4, base=0)
