"""Parameter, Module, containers: names, state_dict, strict loading, ties, dtypes."""
import numpy as np
import pytest

from numpy_tf import GELU, Embedding, Linear, Module, ModuleList, Parameter, Sequential


class Tied(Module):
    def __init__(self, dtype=np.float64):
        super().__init__(dtype)
        self.tokens = Embedding(5, 3, dtype=dtype)
        self.blocks = ModuleList([Sequential(Linear(3, 6, dtype=dtype), GELU(dtype=dtype),
                                             Linear(6, 3, dtype=dtype))], dtype=dtype)
        self.output = Linear(3, 5, bias=False, dtype=dtype)
        self.output.weight = self.tokens.weight


def test_names_are_torch_state_dict_keys_in_torch_order():
    model = Tied()
    assert list(model.state_dict()) == [
        "tokens.weight", "blocks.0.0.weight", "blocks.0.0.bias", "blocks.0.2.weight",
        "blocks.0.2.bias", "output.weight"]


def test_own_parameters_come_before_children_as_in_torch():
    class Mixed(Module):
        def __init__(self):
            super().__init__()
            self.child = Linear(2, 2)
            self.own = Parameter(np.zeros(3))
    assert list(Mixed().state_dict()) == ["own", "child.weight", "child.bias"]


def test_tied_weight_listed_under_both_names_but_one_parameter():
    model = Tied()
    assert model.state_dict()["output.weight"] is model.state_dict()["tokens.weight"]
    names = [name for name, _ in model.named_parameters()]
    assert "tokens.weight" in names and "output.weight" not in names
    assert model.num_parameters() == 5 * 3 + 3 * 6 + 6 + 6 * 3 + 3


def test_load_state_dict_roundtrip_is_bit_exact():
    source, target = Tied(), Tied()
    rng = np.random.default_rng(0)
    state = {k: rng.standard_normal(v.shape) for k, v in source.state_dict().items()}
    state["output.weight"] = state["tokens.weight"]
    target.load_state_dict(state)
    for key, value in target.state_dict().items():
        assert value.tobytes() == state[key].tobytes()


def test_load_state_dict_names_every_problem_at_once():
    model = Tied()
    state = dict(model.state_dict())
    del state["blocks.0.0.bias"]
    state["blocks.0.9.weight"] = np.zeros(3)
    state["blocks.0.2.weight"] = np.zeros((3, 7))
    state["blocks.0.2.bias"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError) as error:
        model.load_state_dict(state)
    message = str(error.value)
    assert "missing keys: blocks.0.0.bias" in message
    assert "unexpected keys: blocks.0.9.weight" in message
    assert "blocks.0.2.weight: expected shape (3, 6), got (3, 7)" in message
    assert "blocks.0.2.bias: expected dtype float64, got float32" in message


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")    # NumPy's, on np.matrix
def test_load_state_dict_refuses_a_masked_array_or_matrix():
    """Their data was copied in silently, the mask dropped (validate.plain_arithmetic)."""
    model = Tied()
    state = dict(model.state_dict())
    state["blocks.0.0.bias"] = np.ma.array(state["blocks.0.0.bias"], mask=True)
    state["blocks.0.2.weight"] = np.asmatrix(state["blocks.0.2.weight"])
    with pytest.raises(ValueError) as error:
        model.load_state_dict(state)
    assert "blocks.0.0.bias: expected a plain numpy array, not a MaskedArray" in str(error.value)
    assert "blocks.0.2.weight: expected a plain numpy array, not a matrix" in str(error.value)


def test_failed_load_changes_nothing():
    model = Tied()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    state = {k: np.ones_like(v) for k, v in before.items()}
    state["output.weight"] = np.zeros((5, 4))
    with pytest.raises(ValueError):
        model.load_state_dict(state)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_non_strict_allows_missing_and_unexpected_but_not_mismatch():
    model = Tied()
    model.load_state_dict({"blocks.0.0.bias": np.full(6, 2.0), "other": np.zeros(1)},
                          strict=False)
    np.testing.assert_array_equal(model.blocks[0][0].bias.data, np.full(6, 2.0))
    with pytest.raises(ValueError, match="expected shape"):
        model.load_state_dict({"blocks.0.0.bias": np.zeros(7)}, strict=False)


def test_tied_names_given_different_values_is_an_error():
    model = Tied()
    state = {k: v.copy() for k, v in model.state_dict().items()}
    state["output.weight"] = state["output.weight"] + 1.0
    with pytest.raises(ValueError, match="tied"):
        model.load_state_dict(state)


def test_zero_grad_and_astype_keep_ties():
    model = Tied()
    model.tokens.weight.grad += 1.0
    model.zero_grad()
    assert not model.tokens.weight.grad.any()
    single = model.astype(np.float32)
    assert single.output.weight is single.tokens.weight
    assert all(p.dtype == np.float32 and p.grad.dtype == np.float32
               for p in single.parameters())
    assert model.tokens.weight.dtype == np.float64       # the original is untouched


class Holder(Module):
    """What a user's module may hold besides Parameters and Modules."""

    def __init__(self):
        super().__init__()
        self.inner = Linear(2, 3)
        self.layers = [self.inner, Linear(3, 1)]            # a plain list, one item shared
        self.table = {"scale": np.arange(3.0), "name": "x"}
        self.pair = (self.inner.weight, 2)
        self.rng = np.random.default_rng(0)
        self.extra = {1, 2}                                  # deepcopy's own protocol


def test_astype_copies_everything_a_module_holds_and_shares_nothing():
    model = Holder()
    model.inner.weight.grad += 1.0
    single = model.astype(np.float32)
    assert single.layers[0] is single.inner and single.pair[0] is single.inner.weight
    assert single.inner is not model.inner and single.inner.weight.data is not \
        model.inner.weight.data
    assert single.inner.weight.dtype == np.float32 and single.layers[1].bias.dtype == np.float32
    assert not single.inner.weight.grad.any()                # gradients start at zero
    assert model.inner.weight.grad.all()                     # the original's are untouched
    assert single.table["scale"] is not model.table["scale"] and single.table["name"] == "x"
    assert single.extra == {1, 2} and single.extra is not model.extra
    assert single.rng is not model.rng and single.rng.random() == model.rng.random()
    assert [m.dtype for _, m in single.named_modules()] == [np.dtype(np.float32)] * 2


def test_default_dtype_is_float64_and_bad_dtype_is_refused():
    assert Linear(2, 3).weight.dtype == np.float64
    with pytest.raises(TypeError, match="dtype must be float32 or float64; got int64"):
        Linear(2, 3, dtype=np.int64)


def test_sequential_backward_runs_in_reverse_order():
    calls = []

    class Recorder(Module):
        def __init__(self, tag):
            super().__init__()
            self.tag = tag

        def forward(self, x):
            calls.append(("forward", self.tag))
            return x + 1.0, self.tag

        def backward(self, dout, cache):
            calls.append(("backward", cache))
            return dout * 2.0

    chain = Sequential(Recorder("a"), Recorder("b"))
    out, cache = chain.forward(np.zeros(2))
    np.testing.assert_array_equal(out, [2.0, 2.0])
    np.testing.assert_array_equal(chain.backward(np.ones(2), cache), [4.0, 4.0])
    assert calls == [("forward", "a"), ("forward", "b"), ("backward", "b"), ("backward", "a")]


def test_parameter_refuses_non_float_data():
    with pytest.raises(TypeError, match="float32 or float64"):
        Parameter(np.zeros(3, dtype=np.int32))


def test_record_activations_names_outputs_and_their_gradients_in_call_order():
    from numpy_tf.core import record_activations

    model = Tied()
    ids = np.array([[1, 2, 3]])
    x, tokens = model.tokens.forward(ids)
    with record_activations(model) as recorder:
        y, cache = model.blocks[0].forward(x)
        dy = np.random.default_rng(0).standard_normal(y.shape)
        model.blocks[0].backward(dy, cache)
    assert list(recorder.activations) == ["blocks.0.0", "blocks.0.1", "blocks.0.2",
                                          "blocks.0"]
    np.testing.assert_array_equal(recorder.activations["blocks.0"], y)
    assert list(recorder.gradients) == ["blocks.0", "blocks.0.2", "blocks.0.1", "blocks.0.0"]
    np.testing.assert_array_equal(recorder.gradients["blocks.0.2"], dy)
    # outside the context nothing is recorded
    model.blocks[0].forward(x)
    assert len(recorder.activations) == 4


def test_record_activations_pairs_each_backward_with_its_forward():
    """A module called twice: its second forward is `name#2`, and the backward that undoes it
    (the first to run, backward being the exact reverse) is recorded under `name#2` too."""
    from numpy_tf.core import record_activations

    model = Tied()
    layer = model.blocks[0][0]                      # Linear(3, 6): used on x, then on x + 1
    x = np.random.default_rng(1).standard_normal((2, 3))
    with record_activations(model) as recorder:
        first, first_cache = layer.forward(x)
        second, second_cache = layer.forward(x + 1.0)
        g_first, g_second = (np.random.default_rng(seed).standard_normal((2, 6))
                             for seed in (2, 3))
        layer.backward(g_second, second_cache)
        layer.backward(g_first, first_cache)
    assert list(recorder.activations) == ["blocks.0.0", "blocks.0.0#2"]
    assert list(recorder.gradients) == ["blocks.0.0#2", "blocks.0.0"]
    np.testing.assert_array_equal(recorder.activations["blocks.0.0#2"], second)
    np.testing.assert_array_equal(recorder.gradients["blocks.0.0#2"], g_second)
    np.testing.assert_array_equal(recorder.gradients["blocks.0.0"], g_first)


def test_record_activations_nests_and_leaves_the_modules_as_they_were():
    from numpy_tf.core import record_activations

    model = Tied()
    x = np.random.default_rng(4).standard_normal((2, 3))
    block = model.blocks[0]
    with record_activations(model) as outer:
        with record_activations(model) as inner:
            block.forward(x)
        block.forward(x)                            # the inner recorder has stopped
    assert list(inner.activations) == ["blocks.0.0", "blocks.0.1", "blocks.0.2", "blocks.0"]
    assert len(outer.activations) == 8 and "blocks.0#2" in outer.activations
    np.testing.assert_array_equal(outer.activations["blocks.0#2"], block.forward(x)[0])
    # no wrapper is left on any instance: the classes' own methods run again
    assert not [name for name, module in model.named_modules()
                if {"forward", "backward"} & set(vars(module))]


def test_a_copy_made_while_recording_runs_its_own_code():
    """record_activations wraps the recorded instances; a copy taken inside the block (astype,
    deepcopy) must not carry those wrappers, which would run the original's modules."""
    import copy

    from numpy_tf.core import record_activations

    model = Tied()
    x = np.random.default_rng(5).standard_normal((2, 3))
    with record_activations(model) as recorder:
        single = model.astype(np.float32)
        twin = copy.deepcopy(model)
        twin.blocks[0][0].weight.data[...] = 0.0
        out, _ = single.blocks[0].forward(x.astype(np.float32))
        assert out.dtype == np.float32
        np.testing.assert_array_equal(twin.blocks[0][0].forward(x)[0],
                                      np.broadcast_to(twin.blocks[0][0].bias.data, (2, 6)))
    assert recorder.activations == {}                   # copies are not the recorded model
    assert not [name for name, module in single.named_modules()
                if {"forward", "backward"} & set(vars(module))]


@pytest.mark.parametrize("call, error, message", [
    (lambda nt: nt.count_parameters(None), TypeError,
     "model must be a numpy_tf Module; got a NoneType"),
    (lambda nt: nt.parameter_breakdown([1, 2]), TypeError, "model must be a numpy_tf Module"),
    (lambda nt: nt.decay_groups(3.5, 0.1), TypeError, "model must be a numpy_tf Module"),
    (lambda nt: nt.nearest("x", "x", "x"), TypeError, "model must be a numpy_tf CBOW; got a str"),
    (lambda nt: nt.window_count(3.5, 2, 1), ValueError,
     "num_tokens must be a non-negative integer; got 3.5"),
    (lambda nt: nt.window_count(10, 2, 0), ValueError, "stride must be a positive integer"),
    (lambda nt: nt.attention_maps(None), TypeError,
     "cache must be the cache a model's or layer's forward returned"),
    (lambda nt: nt.inverse_frequencies(None, 10000.0, np.float64), ValueError,
     "width must be a positive integer; got None"),
    (lambda nt: nt.inverse_frequencies(7, 10000.0, np.float64), ValueError,
     "width must be even"),
    (lambda nt: nt.inverse_frequencies(8, 0.0, np.float64), ValueError, "base must be a number"),
])
def test_public_helpers_refuse_the_wrong_kind_of_argument_by_name(call, error, message):
    """Each was an AttributeError ('NoneType' object has no attribute 'num_parameters'), a
    count of a window of 3.5 tokens, an empty list of maps for a cache of None, or an empty
    table of frequencies for a width of None."""
    import numpy_tf

    with pytest.raises(error, match=message):
        call(numpy_tf)
