"""A norm feeding a Linear (LayerNorm.feeding, RMSNorm.feeding, kernels.linear.fed_by_norm): the
Linear keeps the arrays that rebuild the norm's output instead of the output, rebuilds it in its
backward bit for bit, and keeps the output itself whenever anything could have changed it."""
import threading
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import pytest

from numpy_tf import GPT, GPTConfig, reference_path
from numpy_tf.kernels.norm import NormOutput
from numpy_tf.layers.linear import Linear
from numpy_tf.layers.norm import LayerNorm, RMSNorm
from numpy_tf.models.objectives import NextTokenLoss

DTYPES = [np.float32, np.float64]

NORMS = {
    "layernorm": lambda dtype: LayerNorm(64, dtype=dtype),
    "layernorm without bias": lambda dtype: LayerNorm(64, bias=False, dtype=dtype),
    "layernorm without affine": lambda dtype: LayerNorm(64, elementwise_affine=False,
                                                        dtype=dtype),
    "rmsnorm": lambda dtype: RMSNorm(64, 1e-6, dtype=dtype),
    "rmsnorm with unit offset": lambda dtype: RMSNorm(64, 1e-6, dtype=dtype, unit_offset=True),
    "rmsnorm without weight": lambda dtype: RMSNorm(64, 1e-6, elementwise_affine=False,
                                                    dtype=dtype),
}


def _spread(norm, seed=0):
    """Weights and biases away from their ones and zeros, so that rebuilding skipped one."""
    rng = np.random.default_rng(seed)
    for parameter in norm.parameters():
        parameter.data[...] = rng.standard_normal(parameter.shape) * 1.7 + 0.3


def _input(dtype, seed=1, shape=(4, 128, 64)):
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 3, shape[:-1] + (1,))          # rows of every magnitude
    return (rng.standard_normal(shape) * scale + rng.standard_normal(shape[:-1] + (1,))
            ).astype(dtype)


def _fed_linear(norm, x, linear, feeding=True):
    """(out, norm cache, linear cache) of linear(norm(x)), inside norm.feeding or not."""
    h, norm_cache = norm.forward(x)
    with norm.feeding(h, norm_cache) if feeding else nullcontext():
        y, linear_cache = linear.forward(h)
    return y, norm_cache, linear_cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", NORMS)
def test_rebuilding_gives_the_norm_output_bit_for_bit(kind, dtype):
    norm = NORMS[kind](dtype)
    _spread(norm)
    x = _input(dtype)
    out, cache = norm.forward(x)
    bias = getattr(norm, "bias", None)
    rebuilt = NormOutput(cache.x_hat, cache.weight, None if bias is None else bias.data)
    assert rebuilt.shape == out.shape and rebuilt.dtype == out.dtype
    assert rebuilt.rebuild().tobytes() == out.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", NORMS)
def test_a_fed_linear_keeps_x_hat_and_gives_the_same_gradients(kind, dtype):
    norm, linear = NORMS[kind](dtype), Linear(64, 7, dtype=dtype, rng=2)
    _spread(norm)
    x = _input(dtype)
    dy = np.random.default_rng(3).standard_normal((4, 128, 7)).astype(dtype)
    y_plain, _, plain = _fed_linear(norm, x, linear, feeding=False)
    dx_plain = linear.backward(dy, plain)
    grads_plain = [p.grad.copy() for p in linear.parameters()]
    linear.zero_grad()
    y_fed, norm_cache, fed = _fed_linear(norm, x, linear)
    assert type(fed.x) is NormOutput and fed.x.x_hat is norm_cache.x_hat   # h is not kept
    assert fed.output_spec == plain.output_spec
    assert y_fed.tobytes() == y_plain.tobytes()
    for _ in range(2):                           # backward twice: the same dx, the sum twice
        dx = linear.backward(dy, fed)
        assert dx.tobytes() == dx_plain.tobytes()
    for parameter, grad in zip(linear.parameters(), grads_plain):
        assert parameter.grad.tobytes() == (grad + grad).tobytes()


def _kept(norm, x, give=lambda h: h, cache_of=None):
    """The type of what a Linear keeps when fed give(h) inside norm.feeding(h, cache)."""
    linear = Linear(64, 4, dtype=x.dtype)
    h, cache = norm.forward(x)
    with norm.feeding(h, cache if cache_of is None else cache_of):
        _, linear_cache = linear.forward(give(h))
    return type(linear_cache.x)


def test_feeding_keeps_the_output_whenever_it_could_differ_from_the_rebuilt_one():
    x = _input(np.float64)
    norm = LayerNorm(64)
    _spread(norm)
    assert _kept(norm, x) is NormOutput
    assert _kept(norm, x, give=np.copy) is np.ndarray                  # another array
    assert _kept(norm, x, give=lambda h: h[:, :2]) is np.ndarray       # a view of it
    other_cache = norm.forward(_input(np.float64, seed=9))[1]          # another call's cache
    assert _kept(norm, x, cache_of=other_cache) is np.ndarray
    with reference_path():                                             # a reference cache
        assert _kept(norm, x) is np.ndarray

    # a wrapper, or a subclass, that writes into the output (a middle row: the first and the
    # last are what feeding compares with the rebuilt ones)
    watched = LayerNorm(64)
    forward = watched.forward

    def doubled(x):
        out, cache = forward(x)
        out[1] *= 2.0
        return out, cache

    watched.forward = doubled
    assert _kept(watched, x) is np.ndarray

    class Shifted(LayerNorm):
        def forward(self, x):
            out, cache = super().forward(x)
            out[1] += 1.0
            return out, cache

    assert _kept(Shifted(64), x) is np.ndarray

    linear = Linear(64, 4)                                             # a Linear's wrapper
    linear_forward = linear.forward

    def scaled(x):
        x[1] *= 2.0                                     # writes what it is given, a middle row
        return linear_forward(x)

    linear.forward = scaled
    h, cache = norm.forward(x)
    with norm.feeding(h, cache):
        _, linear_cache = linear.forward(h)
    assert type(linear_cache.x) is np.ndarray
    assert _kept(norm, _input(np.float64, shape=(4, 127, 64))) is np.ndarray   # too small
    assert _kept(norm, _input(np.float64, shape=(4, 128, 64))) is NormOutput   # FED_MIN_SIZE
    linear = Linear(64, 4)                                             # no block: nothing kept
    h, cache = norm.forward(x)
    with norm.feeding(h, cache):
        pass
    assert type(linear.forward(h)[1].x) is np.ndarray


def test_a_linear_that_may_have_written_its_input_keeps_it():
    """A Linear subclass writing into x, a wrapper on the module that calls the Linear writing
    into x's first row, and a class-level patch of LayerNorm.forward writing a middle row: the
    Linear keeps x as given, so dW is of the written values. (A wrapper above the Linear
    writing only middle rows is what the checks cannot see: SPEC section 3.)"""
    norm = LayerNorm(64)
    _spread(norm)
    x = _input(np.float64)

    class Doubling(Linear):
        def forward(self, x):
            x[1] *= 2.0                                 # neither the first row nor the last
            return super().forward(x)

    assert _kept(norm, x, give=lambda h: h) is NormOutput
    linear = Doubling(64, 4)
    h, cache = norm.forward(x)
    with norm.feeding(h, cache):
        _, linear_cache = linear.forward(h)
    assert type(linear_cache.x) is np.ndarray

    def scaled_by_a_parent(h):                          # writes before the Linear runs
        h[0] *= 0.5                                     # its first row (the last: as likely)
        return h
    assert _kept(norm, x, give=scaled_by_a_parent) is np.ndarray

    forward = LayerNorm.forward

    def patched(self, x):
        out, cache = forward(self, x)
        out[1] += 1.0                                   # neither the first row nor the last
        return out, cache

    original = LayerNorm.__dict__["forward"]
    LayerNorm.forward = patched
    try:
        assert _kept(LayerNorm(64), x) is np.ndarray
    finally:
        LayerNorm.forward = original


def test_a_gpt_takes_any_module_as_a_norm():
    """A norm swapped for a Module of the user's (here an identity) needs no feeding of its
    own: Module.feeding is a block that does nothing."""
    from numpy_tf.core.module import Module

    class Identity(Module):
        def forward(self, x):
            return x.copy(), x.shape

        def backward(self, dout, cache):
            return dout.copy()

    model = _gpt(True, np.float64)
    model.blocks[0].norm1 = Identity()
    objective = NextTokenLoss(model)
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, (16, 32))
    _, cache = _step_grads(objective, model, ids)
    assert type(cache.model.blocks[0].attention.projections.x) is np.ndarray
    assert type(cache.model.blocks[0].feedforward.caches[0].x) is NormOutput


def test_fed_min_size_is_read_where_it_is_defined(monkeypatch):
    from numpy_tf.kernels import linear as linear_kernels

    x = _input(np.float64)
    monkeypatch.setattr(linear_kernels, "FED_MIN_SIZE", x.size + 1)
    assert _kept(LayerNorm(64), x) is np.ndarray


def test_feeding_refuses_what_no_norm_forward_returns():
    norm = LayerNorm(64)
    h, cache = norm.forward(_input(np.float64))
    with pytest.raises(TypeError, match="cache must be the LayerNormCache"):
        norm.feeding(h, None)
    with pytest.raises(TypeError, match="cache must be the RMSNormCache"):
        RMSNorm(64, 1e-6).feeding(h, cache)
    with pytest.raises(TypeError, match="out must be the array"):
        norm.feeding(h.tolist(), cache)


def test_the_block_belongs_to_its_thread():
    norm, linear = LayerNorm(64), Linear(64, 4)
    h, cache = norm.forward(_input(np.float64))
    kept = {}
    with norm.feeding(h, cache):
        worker = threading.Thread(target=lambda: kept.update(other=linear.forward(h)[1].x))
        worker.start()
        worker.join()
        kept["own"] = linear.forward(h)[1].x
    assert type(kept["own"]) is NormOutput and type(kept["other"]) is np.ndarray


def _gpt(norm_first: bool, dtype):
    config = replace(GPTConfig.tiny(), width=64, heads=4, layers=2, max_context=32,
                     norm_first=norm_first)
    model = GPT(config, rng=0, dtype=dtype)
    for name, parameter in model.named_parameters():           # norms away from 1 and 0
        if "norm" in name:
            parameter.data[...] += np.random.default_rng(len(name)).standard_normal(
                parameter.shape).astype(dtype) * 0.3
    return model


def _step_grads(objective, model, ids):
    model.zero_grad()
    loss, cache = objective.forward(ids)
    objective.backward(1.0, cache)
    objective.backward(1.0, cache)                              # twice: the cache is unchanged
    return [np.asarray(loss)] + [p.grad.copy() for p in model.parameters()], cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [True, False])
def test_a_gpt_step_keeps_no_norm_output_and_gives_the_same_bits(monkeypatch, norm_first,
                                                                  dtype):
    model = _gpt(norm_first, dtype)
    objective = NextTokenLoss(model)
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, (16, 32))
    fed, cache = _step_grads(objective, model, ids)
    block = cache.model.blocks[0]
    if norm_first:
        assert type(block.attention.projections.x) is NormOutput
        assert block.attention.projections.x.x_hat is block.norm1.x_hat
        assert type(block.feedforward.caches[0].x) is NormOutput
        assert type(cache.model.output.x) is NormOutput
    else:
        assert block.feedforward.caches[0].x.x_hat is block.norm1.x_hat
    monkeypatch.setattr(LayerNorm, "feeding", lambda self, out, cache: nullcontext())
    kept, cache = _step_grads(objective, model, ids)
    assert type(cache.model.blocks[0].feedforward.caches[0].x) is np.ndarray
    for a, b in zip(fed, kept):
        assert a.tobytes() == b.tobytes()


def test_a_gpt_step_holds_one_array_fewer_per_norm(monkeypatch):
    """The traced peak of a Pre-LN GPT's backward with two blocks (five norms, each feeding a
    Linear), counted from before the forward, falls by at least four (B, T, C) arrays: five
    kept no more, one rebuilt at a time. (The forward's peak, in a block's feed-forward, falls
    by the norms done by then; at the benchmarks' sizes the step peaks in the backward.)"""
    import tracemalloc

    model = _gpt(True, np.float64)
    objective = NextTokenLoss(model)
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, (16, 32))

    def backward_peak():
        model.zero_grad()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            loss, cache = objective.forward(ids)
            tracemalloc.reset_peak()
            objective.backward(1.0, cache)
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()

    backward_peak()                                             # gradient arrays made
    fed = backward_peak()
    monkeypatch.setattr(LayerNorm, "feeding", lambda self, out, cache: nullcontext())
    kept = backward_peak()
    array_bytes = ids.size * model.config.width * 8
    assert kept - fed >= 4 * array_bytes, (kept, fed, array_bytes)
