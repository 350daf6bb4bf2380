"""Embedding: lookup, repeated ids, padding_idx, bad ids."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import Embedding, embedding_backward, embedding_forward, gradcheck


@given(batch=st.integers(1, 3), length=st.integers(1, 5), vocab=st.integers(1, 6),
       dim=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_gradcheck_drawn_shapes(batch, length, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    inputs = {"ids": rng.integers(0, vocab, (batch, length)),
              "weight": rng.standard_normal((vocab, dim))}
    report = gradcheck(embedding_forward, embedding_backward, inputs, seed=seed)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", ["embedding", "embedding_padding"])
def test_agrees_with_torch(name):
    assert_fixture_agrees(name)


def test_repeated_ids_accumulate():
    weight = np.arange(12.0).reshape(4, 3)
    ids = np.array([[2, 3, 2, 2]])
    out, cache = embedding_forward(ids, weight)
    np.testing.assert_array_equal(out[0, 0], weight[2])
    dout = np.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.5, 0.5, 0.5]]])
    dweight = embedding_backward(dout, cache)
    np.testing.assert_array_equal(dweight[2], [8.5, 10.5, 12.5])     # three lookups summed
    np.testing.assert_array_equal(dweight[3], [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(dweight[:2], 0.0)


def test_padding_row_gets_no_gradient_but_is_still_looked_up():
    layer = Embedding(5, 2, padding_idx=1)
    np.testing.assert_array_equal(layer.weight.data[1], 0.0)         # torch zeroes it at init
    layer.weight.data[1] = [3.0, 4.0]
    out, cache = layer.forward(np.array([[1, 0]]))
    np.testing.assert_array_equal(out[0, 0], [3.0, 4.0])
    layer.backward(np.ones((1, 2, 2)) * 7.0, cache)
    np.testing.assert_array_equal(layer.weight.grad[1], 0.0)
    np.testing.assert_array_equal(layer.weight.grad[0], 7.0)
    assert Embedding(5, 2, padding_idx=-1).padding_idx == 4


def test_contract():
    ids = np.array([[0, 3, 3], [1, 2, 0]])
    check_contract(lambda dtype: Embedding(4, 3, dtype=dtype), (ids,))


def test_any_integer_dtype():
    layer = Embedding(4, 2)
    for dtype in (np.int8, np.uint16, np.int32, np.int64):
        out, _ = layer.forward(np.array([[3, 1]], dtype=dtype))
        np.testing.assert_array_equal(out[0], layer.weight.data[[3, 1]])


def test_bad_ids():
    layer = Embedding(20, 3)
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 4] = 23
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 20\); got 23 at "
                                         r"position \(1, 4\)"):
        layer.forward(ids)
    ids[1, 4] = -1
    with pytest.raises(ValueError, match=r"got -1 at position \(1, 4\)"):
        layer.forward(ids)
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        layer.forward(np.zeros((1, 2)))
    with pytest.raises(TypeError, match="ids must be integers; got dtype bool"):
        layer.forward(np.zeros((1, 2), dtype=bool))
    with pytest.raises(ValueError, match="padding_idx must be in"):
        Embedding(4, 2, padding_idx=4)
