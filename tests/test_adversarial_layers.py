"""Every layer backward, and the attention forwards, fed what a careless caller passes.

Each kind of bad input is refused before any work, by an error naming the argument the caller
passed, what was expected and what was given (SPEC §8); the shapes and values are drawn by
hypothesis, over every layer in LAYERS, and on both tiers (the kernels and reference_path())
where a class has a kernel:

- dout of another shape: a wrong last axis, an extra axis, the right size with its axes
  permuted (the swap that used to return a wrong gradient silently);
- dout of another dtype: float64 into a float32 layer (an upcast the forward refuses),
  complex, float16, integers, bool, a list;
- a cache of another kind (another layer's NamedTuple, a plain tuple, None), or from a call
  of other sizes;
- float32 in, float32 out and every gradient float32;
- attention with no queries or no keys (T = 0): defined, an empty or zero output with empty
  or zero gradients, the same in every attention function and layer (SPEC §4);
- a scale that is not a finite real number, a causal_offset that is not an integer >= 0;
- past_kv / static_kv of the wrong batch, heads, width, length, dtype or kind.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Callable, NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from numpy_tf import reference_path
from numpy_tf.core.module import Module
from numpy_tf.layers import (GELU, CrossEntropyLoss, Dropout, Embedding, FusedAttention,
                             LayerNorm, LearnedPositions, Linear, LogSoftmax,
                             MultiHeadAttention, ReLU, RMSNorm, RotaryEmbedding,
                             ScaledDotProductAttention, SiLU, SinusoidalPositions, Softmax,
                             SwiGLU, TorchMultiheadAttention, attention_backward,
                             attention_forward, cross_entropy_backward, cross_entropy_forward,
                             dropout_backward, dropout_forward, embedding_backward,
                             embedding_forward, feedforward, flash_attention_backward,
                             flash_attention_forward, flash_attention_statistics,
                             flash_decoding, gelu_backward, gelu_forward, layernorm_backward,
                             layernorm_forward, learned_positions_backward,
                             learned_positions_forward, linear_backward, linear_forward,
                             log_softmax_backward, log_softmax_forward, relu_backward,
                             relu_forward, rmsnorm_backward, rmsnorm_forward, rope_backward,
                             rope_forward, silu_backward, silu_forward,
                             sinusoidal_positions_backward, sinusoidal_positions_forward,
                             softmax_backward, softmax_forward, swiglu_backward,
                             swiglu_forward)
from numpy_tf.layers import (NeoXAttention, SoftCap, SparseMoE, load_balancing_loss_backward,
                             load_balancing_loss_forward, moe_backward, moe_forward,
                             partial_rope_backward, partial_rope_forward, softcap_backward,
                             softcap_forward)
from numpy_tf.layers.mlp import swiglu_gate_backward, swiglu_gate_forward

EXAMPLES = 5            # hypothesis examples per layer (and tier) per kind


class Run(NamedTuple):
    forward: Callable           # () -> (out, cache)
    backward: Callable          # (dout, cache) -> gradients
    module: Module | None       # whose Parameter gradients a refused backward must not touch
    dout_name: str = "dout"


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _module(layer, *inputs, **kwargs) -> Run:
    return Run(lambda: layer.forward(*inputs, **kwargs), layer.backward, layer)


def _function(forward, backward, *inputs, dout_name="dout", **kwargs) -> Run:
    return Run(lambda: forward(*inputs, **kwargs), backward, None, dout_name)


def _attention_inputs(rng, dtype, b, t, c):
    return (_normal(rng, (b, 2 * c, t, 3), dtype), _normal(rng, (b, c, t + 1, 3), dtype),
            _normal(rng, (b, c, t + 1, 2), dtype))              # GQA: H = 2 G, Tk = Tq + 1


# name -> (build(rng, dtype, b, t, c) -> Run, has a kernel tier). b, t, c are drawn >= 1.
LAYERS: dict[str, tuple[Callable, bool]] = {
    "linear_forward": (lambda r, d, b, t, c: _function(
        linear_forward, linear_backward, _normal(r, (b, t, c), d), _normal(r, (c + 1, c), d),
        _normal(r, (c + 1,), d)), False),
    "Linear": (lambda r, d, b, t, c: _module(
        Linear(c, c + 1, rng=1, dtype=d), _normal(r, (b, t, c), d)), True),
    "embedding_forward": (lambda r, d, b, t, c: _function(
        embedding_forward, embedding_backward, r.integers(0, c + 2, (b, t)),
        _normal(r, (c + 2, c), d)), False),
    "Embedding": (lambda r, d, b, t, c: _module(
        Embedding(c + 2, c, padding_idx=0, rng=1, dtype=d), r.integers(0, c + 2, (b, t))),
        True),
    "learned_positions_forward": (lambda r, d, b, t, c: _function(
        learned_positions_forward, learned_positions_backward, _normal(r, (b, t, c), d),
        _normal(r, (t + 2, c), d), 1), False),
    "LearnedPositions": (lambda r, d, b, t, c: _module(
        LearnedPositions(t + 2, c, rng=1, dtype=d), _normal(r, (b, t, c), d), 2), False),
    "sinusoidal_positions_forward": (lambda r, d, b, t, c: _function(
        sinusoidal_positions_forward, sinusoidal_positions_backward,
        _normal(r, (b, t, 2 * c), d), 3), False),
    "SinusoidalPositions": (lambda r, d, b, t, c: _module(
        SinusoidalPositions(2 * c, dtype=d), _normal(r, (b, t, 2 * c), d)), False),
    "rope_forward": (lambda r, d, b, t, c: _function(
        rope_forward, rope_backward, _normal(r, (b, 2, t, 2 * c), d), np.arange(t) + 3),
        False),
    "RotaryEmbedding": (lambda r, d, b, t, c: _module(
        RotaryEmbedding(2 * c, interleaved=True, dtype=d), _normal(r, (b, 2, t, 2 * c), d)),
        False),
    "layernorm_forward": (lambda r, d, b, t, c: _function(
        layernorm_forward, layernorm_backward, _normal(r, (b, t, c), d),
        _normal(r, (c,), d), _normal(r, (c,), d)), False),
    "LayerNorm": (lambda r, d, b, t, c: _module(LayerNorm(c, dtype=d),
                                                _normal(r, (b, t, c), d)), True),
    "rmsnorm_forward": (lambda r, d, b, t, c: _function(
        rmsnorm_forward, rmsnorm_backward, _normal(r, (b, t, c), d), _normal(r, (c,), d),
        1e-6), False),
    "RMSNorm": (lambda r, d, b, t, c: _module(RMSNorm(c, 1e-6, dtype=d),
                                              _normal(r, (b, t, c), d)), True),
    "relu_forward": (lambda r, d, b, t, c: _function(
        relu_forward, relu_backward, _normal(r, (b, t, c), d)), False),
    "ReLU": (lambda r, d, b, t, c: _module(ReLU(dtype=d), _normal(r, (b, t, c), d)), False),
    "gelu_forward": (lambda r, d, b, t, c: _function(
        gelu_forward, gelu_backward, _normal(r, (b, t, c), d)), False),
    "gelu_forward tanh": (lambda r, d, b, t, c: _function(
        gelu_forward, gelu_backward, _normal(r, (b, t, c), d), "tanh"), False),
    "GELU": (lambda r, d, b, t, c: _module(GELU(dtype=d), _normal(r, (b, t, c), d)), True),
    "GELU tanh": (lambda r, d, b, t, c: _module(GELU("tanh", dtype=d),
                                                _normal(r, (b, t, c), d)), True),
    "silu_forward": (lambda r, d, b, t, c: _function(
        silu_forward, silu_backward, _normal(r, (b, t, c), d)), False),
    "SiLU": (lambda r, d, b, t, c: _module(SiLU(dtype=d), _normal(r, (b, t, c), d)), False),
    "softmax_forward": (lambda r, d, b, t, c: _function(
        softmax_forward, softmax_backward, _normal(r, (b, t, c), d), 1), False),
    "Softmax": (lambda r, d, b, t, c: _module(Softmax(dtype=d), _normal(r, (b, t, c), d)),
                False),
    "log_softmax_forward": (lambda r, d, b, t, c: _function(
        log_softmax_forward, log_softmax_backward, _normal(r, (b, t, c), d)), False),
    "LogSoftmax": (lambda r, d, b, t, c: _module(LogSoftmax(0, dtype=d),
                                                 _normal(r, (b, t, c), d)), False),
    "cross_entropy_forward none": (lambda r, d, b, t, c: _function(
        cross_entropy_forward, cross_entropy_backward, _normal(r, (b, t, c + 1), d),
        r.integers(0, c + 1, (b, t)), reduction="none", dout_name="dloss"), False),
    "CrossEntropyLoss": (lambda r, d, b, t, c: _module(
        CrossEntropyLoss(label_smoothing=0.1, dtype=d), _normal(r, (b, t, c + 1), d),
        r.integers(0, c + 1, (b, t)))._replace(dout_name="dloss"), False),
    "dropout_forward": (lambda r, d, b, t, c: _function(
        dropout_forward, dropout_backward, _normal(r, (b, t, c), d), 0.5,
        np.random.default_rng(1)), False),
    "Dropout eval": (lambda r, d, b, t, c: _module(Dropout(0.5, dtype=d).eval(),
                                                   _normal(r, (b, t, c), d)), False),
    "swiglu_forward": (lambda r, d, b, t, c: _function(
        swiglu_forward, swiglu_backward, _normal(r, (b, t, c), d),
        _normal(r, (c + 2, c), d), _normal(r, (c + 2, c), d), _normal(r, (c, c + 2), d)),
        False),
    "swiglu_gate_forward": (lambda r, d, b, t, c: _function(
        swiglu_gate_forward, swiglu_gate_backward, _normal(r, (b, t, c), d),
        _normal(r, (b, t, c), d), dout_name="dhidden"), False),
    "SwiGLU": (lambda r, d, b, t, c: _module(SwiGLU(c, c + 2, bias=True, rng=1, dtype=d),
                                             _normal(r, (b, t, c), d)), False),
    "feedforward": (lambda r, d, b, t, c: _module(feedforward(c, 2 * c, rng=1, dtype=d),
                                                  _normal(r, (b, t, c), d)), True),
    "attention_forward": (lambda r, d, b, t, c: _function(
        attention_forward, attention_backward, *_attention_inputs(r, d, b, t, c),
        is_causal=True, causal_offset=1, scale=0.7), False),
    "ScaledDotProductAttention": (lambda r, d, b, t, c: _module(
        ScaledDotProductAttention(is_causal=True, dtype=d), *_attention_inputs(r, d, b, t, c),
        causal_offset=1), True),
    "flash_attention_forward": (lambda r, d, b, t, c: _function(
        flash_attention_forward, flash_attention_backward, *_attention_inputs(r, d, b, t, c),
        is_causal=True, causal_offset=1, block_q=2, block_k=2), False),
    "MultiHeadAttention": (lambda r, d, b, t, c: _module(
        MultiHeadAttention(4, 2, 1, head_dim=2 * c, bias=True, rope=True, rng=1, dtype=d),
        _normal(r, (b, t, 4), d), is_causal=True), True),
    "MultiHeadAttention cross": (lambda r, d, b, t, c: _module(
        MultiHeadAttention(4, 2, rng=1, dtype=d), _normal(r, (b, t, 4), d),
        _normal(r, (b, c + 1, 4), d)), True),
    "FusedAttention": (lambda r, d, b, t, c: _module(
        FusedAttention(2 * c, 2, bias=True, rng=1, dtype=d), _normal(r, (b, t, 2 * c), d),
        is_causal=True), True),
    "TorchMultiheadAttention": (lambda r, d, b, t, c: _module(
        TorchMultiheadAttention(2 * c, 2, rng=1, dtype=d), _normal(r, (b, t, 2 * c), d),
        _normal(r, (b, t + 1, 2 * c), d), _normal(r, (b, t + 1, 2 * c), d)), True),
    "TorchMultiheadAttention batch_first=False": (lambda r, d, b, t, c: _module(
        TorchMultiheadAttention(2 * c, 2, batch_first=False, rng=1, dtype=d),
        *[_normal(r, (t, b, 2 * c), d)] * 3), True),
    "softcap_forward": (lambda r, d, b, t, c: _function(
        softcap_forward, softcap_backward, 3 * _normal(r, (b, t, c), d), 2.0), False),
    "SoftCap": (lambda r, d, b, t, c: _module(SoftCap(2.0, dtype=d),
                                              3 * _normal(r, (b, t, c), d)), False),
    "partial_rope_forward": (lambda r, d, b, t, c: _function(
        partial_rope_forward, partial_rope_backward, _normal(r, (b, 2, t, 2 * c + 2), d),
        np.arange(t) + 1, 2 * c), False),
    "moe_forward": (lambda r, d, b, t, c: _function(
        moe_forward, moe_backward, _normal(r, (b, t, c), d), _normal(r, (3, c), d),
        _normal(r, (3, c + 1, c), d), _normal(r, (3, c + 1, c), d),
        _normal(r, (3, c, c + 1), d), 2), False),
    "SparseMoE": (lambda r, d, b, t, c: _module(SparseMoE(c, c + 1, 3, 2, rng=1, dtype=d),
                                                _normal(r, (b, t, c), d)), False),
    "load_balancing_loss_forward": (lambda r, d, b, t, c: _function(
        load_balancing_loss_forward, load_balancing_loss_backward,
        [_normal(r, (b * t, c + 1), d) for _ in range(2)], min(2, c + 1),
        dout_name="dloss"), False),
    "NeoXAttention": (lambda r, d, b, t, c: _module(
        NeoXAttention(4 * c, 2, rotary_dim=2, rng=1, dtype=d),
        _normal(r, (b, t, 4 * c), d))._replace(dout_name="dy"), True),
}
CASES = [(name, tier) for name, (_, tiered) in LAYERS.items()
         for tier in (("kernels", "reference") if tiered else ("reference",))]
sizes = st.integers(1, 4)


def _run(name: str, tier: str, dtype, b: int, t: int, c: int, seed: int = 0):
    """(Run, out, cache) of the named layer's forward, on the given tier."""
    build = LAYERS[name][0]
    context = reference_path() if tier == "reference" else contextlib.nullcontext()
    with context:
        run = build(np.random.default_rng(seed), np.dtype(dtype), b, t, c)
        out, cache = run.forward()
    return run, out, cache


def _grads(run: Run) -> dict:
    return {} if run.module is None else {n: g.copy() for n, g in run.module.grad_dict().items()}


def _assert_refused(run: Run, dout, cache, error, *fragments) -> None:
    """backward(dout, cache) raises `error` whose message holds every fragment, and adds
    nothing to the module's gradients (refused before any work)."""
    before = _grads(run)
    with pytest.raises(error) as raised:
        run.backward(dout, cache)
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    for name, gradient in _grads(run).items():
        np.testing.assert_array_equal(gradient, before[name], err_msg=name)


# -- dout -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, tier", CASES)
@settings(max_examples=EXAMPLES)
@given(b=sizes, t=sizes, c=sizes, dtype=st.sampled_from([np.float64, np.float32]),
       how=st.sampled_from(["last axis", "extra axis", "permuted axes"]), data=st.data())
def test_dout_of_another_shape_is_refused(name, tier, b, t, c, dtype, how, data):
    run, out, cache = _run(name, tier, dtype, b, t, c)
    shape = np.shape(out)
    if shape == ():                                     # a mean loss: any array is too big
        dout = np.ones((data.draw(st.integers(1, 3)),), dtype)
    elif how == "last axis":
        wrong = (*shape[:-1], shape[-1] + data.draw(st.integers(1, 3)))
        dout = np.zeros(wrong, dtype)
    elif how == "extra axis":
        dout = np.zeros((*shape, 1), dtype)
    else:
        order = data.draw(st.permutations(range(len(shape))))
        dout = np.random.default_rng(1).standard_normal(shape).astype(dtype).transpose(order)
        assume(dout.shape != shape)                     # a permutation of equal sizes is valid
    _assert_refused(run, dout, cache, ValueError, f"{run.dout_name} must have the shape",
                    str(tuple(shape)), str(dout.shape))


@pytest.mark.parametrize("name, tier", CASES)
@settings(max_examples=EXAMPLES)
@given(b=sizes, t=sizes, c=sizes, dtype=st.sampled_from([np.float64, np.float32]),
       given_dtype=st.sampled_from(["other float", "complex64", "complex128", "float16",
                                    "int64", "bool", "list"]))
def test_dout_of_another_dtype_is_refused(name, tier, b, t, c, dtype, given_dtype):
    run, out, cache = _run(name, tier, dtype, b, t, c)
    shape, dtype = np.shape(out), np.dtype(dtype)
    other = {"other float": np.float32 if dtype == np.float64 else np.float64}.get(given_dtype,
                                                                                  given_dtype)
    if given_dtype == "list":
        dout = np.zeros(shape).tolist()
        assume(shape != ())                             # a loss takes a Python float
        _assert_refused(run, dout, cache, TypeError, run.dout_name, "numpy array", "list")
        return
    dout = np.ones(shape, dtype=other)
    _assert_refused(run, dout, cache, TypeError, f"{run.dout_name} must", str(dtype),
                    str(np.dtype(other)))


# -- ndarray subclasses whose operations mean something else -------------------------------------
def _masked_normal(rng, shape, dtype):
    values = rng.standard_normal(shape).astype(dtype)
    return np.ma.array(values, mask=values > 1.0)


@pytest.mark.parametrize("name, tier", [case for case in CASES if case[0] != "Embedding"])
def test_a_masked_array_input_is_refused(name, tier, monkeypatch):
    """Every float input (and, for the functions, every weight) a masked array: refused by a
    TypeError that names a masked array, never run (numpy_tf reads no mask: some operations
    would drop it and others carry it), nor a broadcasting error from inside NumPy. (The
    Embedding layer's only input is ids: the next test.)"""
    monkeypatch.setattr(sys.modules[__name__], "_normal", _masked_normal)
    with pytest.raises(TypeError, match="not a masked array"):
        _run(name, tier, np.float64, 2, 3, 2)


@pytest.mark.parametrize("tier", ["kernels", "reference"])
def test_masked_ids_are_refused(tier):
    ids = np.ma.array([[0, 1], [2, 0]], mask=[[False, True], [False, False]])
    context = reference_path() if tier == "reference" else contextlib.nullcontext()
    with context:
        for embed in (lambda: Embedding(3, 2, rng=1).forward(ids),
                      lambda: embedding_forward(ids, np.ones((3, 2)))):
            with pytest.raises(TypeError, match="ids must be a plain numpy array"):
                embed()


@pytest.mark.parametrize("name, tier", CASES)
def test_a_masked_array_dout_is_refused(name, tier):
    run, out, cache = _run(name, tier, np.float64, 2, 3, 2)
    dout = np.ma.array(np.random.default_rng(4).standard_normal(np.shape(out)))
    _assert_refused(run, dout, cache, TypeError, run.dout_name, "not a masked array")


@pytest.mark.parametrize("which", ["attn_mask", "key_padding_mask"])
@pytest.mark.parametrize("tier", ["kernels", "reference"])
def test_a_masked_array_attention_mask_is_refused(which, tier):
    q, k, v = _attention_inputs(np.random.default_rng(6), np.float64, 2, 3, 1)
    shape = (3, 4) if which == "attn_mask" else (2, 4)
    mask = np.ma.array(np.zeros(shape, bool), mask=np.eye(*shape, dtype=bool))
    context = reference_path() if tier == "reference" else contextlib.nullcontext()
    with context, pytest.raises(TypeError, match=f"{which} must be a plain numpy array"):
        ScaledDotProductAttention().forward(q, k, v, **{which: mask})


MATRIX_LAYERS = {                       # (T, C) inputs, which a numpy.matrix can be
    "Linear": lambda x: Linear(3, 2, rng=1).forward(x),
    "linear_forward": lambda x: linear_forward(x, np.ones((2, 3)), np.ones(2)),
    "LayerNorm": lambda x: LayerNorm(3).forward(x),
    "layernorm_forward": lambda x: layernorm_forward(x),
    "RMSNorm": lambda x: RMSNorm(3, 1e-6).forward(x),
    "GELU": lambda x: GELU().forward(x),
    "ReLU": lambda x: ReLU().forward(x),
    "SiLU": lambda x: SiLU().forward(x),
    "Softmax": lambda x: Softmax().forward(x),
    "SwiGLU": lambda x: SwiGLU(3, 4, rng=1).forward(x),
    "cross_entropy_forward": lambda x: cross_entropy_forward(x, np.array([0, 1, 2, 0])),
    "CrossEntropyLoss": lambda x: CrossEntropyLoss().forward(x, np.array([0, 1, 2, 0])),
    "embedding_forward ids": lambda x: embedding_forward(np.asmatrix([[0, 1], [2, 0]]),
                                                         np.ones((3, 2))),
    "Embedding ids": lambda x: Embedding(3, 2, rng=1).forward(np.asmatrix([[0, 1], [2, 0]])),
}


@pytest.mark.parametrize("name", sorted(MATRIX_LAYERS))
@pytest.mark.parametrize("tier", ["kernels", "reference"])
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")    # NumPy's, on np.matrix
def test_a_numpy_matrix_input_is_refused(name, tier):
    """np.matrix (2-D only, * a matrix product): a TypeError that names it, on both tiers,
    never a result nor NumPy's 'shapes not aligned'."""
    x = np.asmatrix(np.random.default_rng(5).standard_normal((4, 3)))
    context = reference_path() if tier == "reference" else contextlib.nullcontext()
    with context, pytest.raises(TypeError, match="not a numpy.matrix"):
        MATRIX_LAYERS[name](x)


# -- the cache ------------------------------------------------------------------------------------
def _cache_root(cache) -> type:
    """The NamedTuple a cache type derives from (a kernel's cache subclasses its reference's):
    the class just before tuple in its MRO, or the type itself for anything else."""
    mro = type(cache).__mro__
    return mro[-3] if len(mro) >= 3 and mro[-2] is tuple else type(cache)


@pytest.mark.parametrize("name, tier", CASES)
@settings(max_examples=EXAMPLES)
@given(b=sizes, t=sizes, c=sizes, other=st.sampled_from(sorted(LAYERS)),
       kind=st.sampled_from(["another layer's", "plain tuple", "None", "dict"]))
def test_cache_of_another_kind_is_refused(name, tier, b, t, c, other, kind):
    run, out, cache = _run(name, tier, np.float64, b, t, c)
    dout = np.random.default_rng(2).standard_normal(np.shape(out))
    if kind == "another layer's":
        wrong = _run(other, tier, np.float64, b, t, c)[2]
        assume(_cache_root(wrong) is not _cache_root(cache)
               and not isinstance(wrong, type(cache)) and not isinstance(cache, type(wrong)))
        assume(not (name.startswith("Sinusoidal") or name.startswith("sinusoidal"))
               or wrong is not None)
    else:
        wrong = {"plain tuple": tuple(cache) if isinstance(cache, tuple) else (cache,),
                 "None": None, "dict": {"cache": cache}}[kind]
        assume(not (wrong is None and name.lower().startswith("sinusoidal")))
    _assert_refused(run, dout, wrong, (TypeError,), "cache must be")


@pytest.mark.parametrize("name, tier", [case for case in CASES if case[0] not in
                                        ("CrossEntropyLoss", "load_balancing_loss_forward")])
@settings(max_examples=EXAMPLES)
@given(sizes_a=st.tuples(sizes, sizes, sizes), sizes_b=st.tuples(sizes, sizes, sizes))
def test_cache_of_another_call_is_refused(name, tier, sizes_a, sizes_b):
    """backward(dout of call B, cache of call A): refused by name, never a reshape or
    broadcasting error from inside NumPy (nor a silent result). (A mean loss, 0-d whatever
    the sizes, is left out: any call's dloss fits any call's cache.)"""
    run, out_a, cache_a = _run(name, tier, np.float64, *sizes_a)
    _, out_b, _ = _run(name, tier, np.float64, *sizes_b, seed=1)
    assume(np.shape(out_a) != np.shape(out_b))
    dout = np.random.default_rng(3).standard_normal(np.shape(out_b))
    before = _grads(run)
    with pytest.raises((ValueError, TypeError)) as raised:
        run.backward(dout, cache_a)
    assert re.search(rf"{run.dout_name} must have the shape|cache was made by",
                     str(raised.value)), str(raised.value)
    for parameter, gradient in _grads(run).items():
        np.testing.assert_array_equal(gradient, before[parameter], err_msg=parameter)


# -- float32 end to end ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, tier", CASES)
@settings(max_examples=3)
@given(b=sizes, t=sizes, c=sizes)
def test_float32_stays_float32(name, tier, b, t, c):
    run, out, cache = _run(name, tier, np.float32, b, t, c)
    assert out.dtype == np.float32
    dout = np.random.default_rng(4).standard_normal(np.shape(out)).astype(np.float32)
    grads = run.backward(dout, cache)
    for gradient in grads if isinstance(grads, tuple) else (grads,):
        assert gradient is None or gradient.dtype == np.float32, gradient.dtype
    for parameter, gradient in _grads(run).items():
        assert gradient.dtype == np.float32, parameter


# -- attention with no queries or no keys (T = 0) -------------------------------------------------
def _zero_length_layers(dtype, b, c):
    """(name, forward(Tq, Tk) -> (out, cache), backward, arguments' shapes) for every attention
    function and layer."""
    rng = np.random.default_rng(5)

    def qkv(tq, tk):
        return (_normal(rng, (b, 2, tq, c), dtype), _normal(rng, (b, 1, tk, c), dtype),
                _normal(rng, (b, 1, tk, c + 1), dtype))

    padding = lambda tk: np.zeros((b, tk), dtype=bool)  # noqa: E731
    mha = MultiHeadAttention(2 * c, 2, 1, head_dim=2, rope=True, rng=1, dtype=dtype)
    cross = MultiHeadAttention(2 * c, 2, 1, rng=1, dtype=dtype)    # no bias: a zero output
    fused = FusedAttention(2 * c, 2, bias=True, rng=1, dtype=dtype)
    torch_mha = TorchMultiheadAttention(2 * c, 2, batch_first=False, rng=1, dtype=dtype)
    sdpa = ScaledDotProductAttention(is_causal=True, dtype=dtype)
    x = lambda t: _normal(rng, (b, t, 2 * c), dtype)  # noqa: E731
    return {
        "attention_forward": (lambda tq, tk: attention_forward(
            *qkv(tq, tk), key_padding_mask=padding(tk), is_causal=True), attention_backward),
        "flash_attention_forward": (lambda tq, tk: flash_attention_forward(
            *qkv(tq, tk), key_padding_mask=padding(tk), block_q=2, block_k=2),
            flash_attention_backward),
        "ScaledDotProductAttention": (lambda tq, tk: sdpa.forward(*qkv(tq, tk)),
                                      sdpa.backward),
        "MultiHeadAttention self": (lambda tq, tk: mha.forward(x(tq), is_causal=True),
                                    mha.backward),
        "MultiHeadAttention cross": (lambda tq, tk: cross.forward(x(tq), x(tk)),
                                     cross.backward),
        "FusedAttention": (lambda tq, tk: fused.forward(x(tq), is_causal=True), fused.backward),
        "TorchMultiheadAttention cross": (lambda tq, tk: torch_mha.forward(
            *(a.swapaxes(0, 1) for a in (x(tq), x(tk), x(tk)))), torch_mha.backward),
    }


@pytest.mark.parametrize("tier", ["kernels", "reference"])
@settings(max_examples=EXAMPLES)
@given(b=st.integers(1, 3), c=st.integers(1, 3), other=st.integers(0, 3),
       empty=st.sampled_from(["queries", "keys", "both"]),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_no_queries_or_no_keys_is_defined(tier, b, c, other, empty, dtype):
    """Tq = 0: an empty output and empty query gradients, zero key and value gradients.
    Tk = 0: a zero output (no key to see, as a fully masked row) and zero query gradients.
    Self-attention layers have Tq = Tk, so they see only T = 0."""
    tq, tk = {"queries": (0, other), "keys": (other, 0), "both": (0, 0)}[empty]
    for name, (forward, backward) in _zero_length_layers(np.dtype(dtype), b, c).items():
        self_attention = name.endswith(("self", "FusedAttention"))
        length = (0, 0) if self_attention else (tq, tk)
        if self_attention and empty != "both" and other:
            continue
        with reference_path() if tier == "reference" else contextlib.nullcontext():
            out, cache = forward(*length)
        assert out.dtype == dtype and np.all(out == 0), name
        dout = np.random.default_rng(6).standard_normal(out.shape).astype(dtype)
        grads = backward(dout, cache)
        for gradient in grads if isinstance(grads, tuple) else (grads,):
            assert gradient is None or (gradient.dtype == dtype and np.all(gradient == 0)), \
                name


@settings(max_examples=EXAMPLES)
@given(b=st.integers(1, 3), heads=st.integers(1, 3), tq=st.integers(0, 3),
       chunk=st.integers(1, 3))
def test_flash_decoding_and_statistics_with_no_keys(b, heads, tq, chunk):
    q, k = np.ones((b, heads, tq, 2)), np.ones((b, heads, 0, 2))
    decoded = flash_decoding(q, k, np.ones((b, heads, 0, 3)), chunk_size=chunk)
    assert decoded.out.shape == (b, heads, tq, 3) and np.all(decoded.out == 0)
    assert decoded.chunk_out.shape == (0, b, heads, tq, 3)
    assert np.all(decoded.logsumexp == np.inf)
    statistics = flash_attention_statistics(q, k, block_k=chunk)
    assert statistics.row_max.shape == (b, heads, tq, 0)
    assert np.all(statistics.logsumexp == np.inf)


# -- scale and causal_offset ----------------------------------------------------------------------
ATTENTION_FUNCTIONS = {
    "attention_forward": attention_forward,
    "flash_attention_forward": flash_attention_forward,
    "flash_decoding": flash_decoding,
    "flash_attention_statistics": lambda q, k, v, **kwargs: flash_attention_statistics(
        q, k, **kwargs),
}
BAD_SCALES = [float("nan"), float("inf"), -float("inf"), np.float32("nan"), True, "0.5",
              1j, np.ones(1)]


@pytest.mark.parametrize("function", list(ATTENTION_FUNCTIONS))
@settings(max_examples=EXAMPLES)
@given(scale=st.sampled_from(BAD_SCALES) | st.floats(allow_nan=True).filter(
    lambda s: not np.isfinite(s)))
def test_a_scale_that_is_not_a_finite_real_number_is_refused(function, scale):
    q = np.ones((1, 1, 2, 2))
    with pytest.raises((TypeError, ValueError), match="scale must be a finite real number"):
        ATTENTION_FUNCTIONS[function](q, q, q, scale=scale)


@pytest.mark.parametrize("function", list(ATTENTION_FUNCTIONS))
@settings(max_examples=EXAMPLES)
@given(scale=st.floats(-1e3, 1e3) | st.integers(-5, 5),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_any_finite_scale_is_accepted_and_keeps_the_dtype(function, scale, dtype):
    """torch's scaled_dot_product_attention takes any float scale; so does numpy_tf (a
    float64 NumPy scalar does not upcast float32)."""
    q = np.random.default_rng(7).standard_normal((1, 2, 3, 2)).astype(dtype)
    result = ATTENTION_FUNCTIONS[function](q, q, q, scale=np.float64(scale))
    first = result[0] if isinstance(result, tuple) else result
    assert first.dtype == dtype


@pytest.mark.parametrize("function", list(ATTENTION_FUNCTIONS) + ["ScaledDotProductAttention"])
@settings(max_examples=EXAMPLES)
@given(offset=st.sampled_from([1.5, 1.0, "1", None, True, np.float64(2.0)])
       | st.integers(-5, -1))
def test_a_causal_offset_that_is_not_an_integer_at_least_0_is_refused(function, offset):
    q = np.ones((1, 1, 2, 2))
    if function == "ScaledDotProductAttention":
        def call():
            return ScaledDotProductAttention(is_causal=True).forward(q, q, q,
                                                                     causal_offset=offset)
    else:
        def call():
            return ATTENTION_FUNCTIONS[function](q, q, q, is_causal=True, causal_offset=offset)
    with pytest.raises((TypeError, ValueError), match="causal_offset must be"):
        call()


# -- KV caches ------------------------------------------------------------------------------------
KV_LAYERS = {
    "MultiHeadAttention": lambda dtype: MultiHeadAttention(8, 4, 2, rope=True, rng=1,
                                                           dtype=dtype),
    "FusedAttention": lambda dtype: FusedAttention(8, 2, rng=1, dtype=dtype),
    "TorchMultiheadAttention": lambda dtype: TorchMultiheadAttention(8, 2, rng=1, dtype=dtype),
}


def _kv_forward(layer, x, **kwargs):
    if isinstance(layer, TorchMultiheadAttention):
        if "static_kv" in kwargs:
            return layer.forward(x, None, None, **kwargs)
        return layer.forward(x, x, x, **kwargs)
    return layer.forward(x, **kwargs)


@pytest.mark.parametrize("name", list(KV_LAYERS))
@settings(max_examples=EXAMPLES)
@given(which=st.sampled_from(["past_kv", "static_kv"]),
       how=st.sampled_from(["batch", "heads", "width", "length of v", "dtype", "3-D",
                            "one array", "a triple", "a list of floats"]),
       b=st.integers(1, 3), past=st.integers(1, 3))
def test_a_kv_cache_that_does_not_fit_is_refused(name, which, how, b, past):
    assume(not (which == "static_kv" and name == "FusedAttention"))   # self-attention only
    layer = KV_LAYERS[name](np.float64)
    x = np.random.default_rng(8).standard_normal((b, 2, 8))
    _, cache = _kv_forward(layer, np.random.default_rng(9).standard_normal((b, past, 8)))
    k, v = cache.present
    wrong = {"batch": lambda: (np.concatenate([k, k]), np.concatenate([v, v])),
             "heads": lambda: (k[:, :1], v[:, :1]),
             "width": lambda: (k[..., :1], v[..., :1]),
             "length of v": lambda: (k, v[:, :, :0]),
             "dtype": lambda: (k.astype(np.float32), v.astype(np.float32)),
             "3-D": lambda: (k[0], v[0]),
             "one array": lambda: k,
             "a triple": lambda: (k, v, v),
             "a list of floats": lambda: [k.tolist(), v.tolist()]}[how]()
    with pytest.raises((TypeError, ValueError), match=which):
        _kv_forward(layer, x, **{which: wrong})


@pytest.mark.parametrize("name, tier", [case for case in CASES if case[0] in (
    "softcap_forward", "SoftCap", "partial_rope_forward", "moe_forward", "SparseMoE",
    "load_balancing_loss_forward", "NeoXAttention")])
@pytest.mark.parametrize("other", ["softmax_forward", "rope_forward", "Linear"])
def test_the_later_layers_refuse_another_layers_cache_by_name(name, tier, other):
    """Another layer's NamedTuple (a RoPECache given to partial RoPE, a LinearCache to a
    layer whose cache holds one) is refused by the cache's name, before any work."""
    run, out, cache = _run(name, tier, np.float64, 2, 3, 2)
    wrong = _run(other, tier, np.float64, 2, 3, 2)[2]
    dout = np.random.default_rng(2).standard_normal(np.shape(out))
    _assert_refused(run, dout, wrong, TypeError,
                    f"cache must be the {type(cache).__name__}",
                    f"got a {type(wrong).__name__}")
