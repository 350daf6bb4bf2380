"""numpy_tf.gradcheck (numpy_tf/checking/finite_differences.py) catches wrong backward passes and reports where."""
import importlib

import numpy as np
import pytest

from numpy_tf import (GELU, Linear, Module, gelu_backward, gelu_forward, gradcheck,
                      gradcheck_module, linear_backward, linear_forward)


def _tanh_gelu_with_the_exact_backward(x):
    """The tanh GELU whose cache holds the exact GELU's derivative: numpy-ml's mistake."""
    out, _ = gelu_forward(x, "tanh")
    return out, gelu_forward(x, "none")[1]


def test_full_mode_catches_a_backward_of_the_wrong_variant():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(_tanh_gelu_with_the_exact_backward, gelu_backward, {"x": x})
    assert not report.passed
    assert "FAIL" in str(report)


def test_fast_mode_catches_it_too():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 2
    report = gradcheck(_tanh_gelu_with_the_exact_backward, gelu_backward, {"x": x},
                       fast=True)
    assert not report.passed


def test_worst_index_points_at_the_wrong_element():
    def backward(dout, cache):
        dx, dweight, dbias = linear_backward(dout, cache)
        dweight = dweight.copy()
        dweight[1, 2] += 1e-3
        return dx, dweight, dbias

    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((2, 3)), "weight": rng.standard_normal((4, 3)),
              "bias": rng.standard_normal(4)}
    report = gradcheck(linear_forward, backward, inputs)
    rows = {row.name: row for row in report.rows}
    assert rows["x"].passed and rows["bias"].passed
    assert not rows["weight"].passed and rows["weight"].worst_index == (1, 2)
    assert rows["weight"].max_abs_error == pytest.approx(1e-3, rel=1e-4)


def test_positional_inputs_wrt_and_float32_inputs_checked_in_float64():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    report = gradcheck(linear_forward, linear_backward, [x, w], wrt=["input1"])
    assert report.passed and [row.name for row in report.rows] == ["input1"]
    with pytest.raises(ValueError, match="wrt names 'w'"):
        gradcheck(linear_forward, linear_backward, {"x": x, "weight": w}, wrt=["w"])


def test_module_check_perturbs_a_copy_and_restores_nothing_of_the_original():
    layer = Linear(3, 2, rng=0, dtype=np.float32)
    before = layer.weight.data.copy()
    report = gradcheck_module(layer, np.ones((1, 3), dtype=np.float32))
    assert report.passed
    np.testing.assert_array_equal(layer.weight.data, before)
    assert not layer.weight.grad.any()


def test_report_text_and_dict():
    x = np.random.default_rng(3).standard_normal((2, 2))
    report = gradcheck(gelu_forward, gelu_backward, {"x": x})
    text = str(report)
    assert "max abs err" in text and "worst index" in text and "all passed" in text
    data = report.to_dict()
    assert data["passed"] and data["rows"][0]["name"] == "x"


# -- the full mode on a Module evaluates only downstream of the perturbed tensor ----------------
def _full_reports(module, *inputs):
    """The full check's report with and without reusing the unperturbed upstream."""
    tool = importlib.import_module("numpy_tf.checking.finite_differences")
    module = module.astype(np.float64)
    rng = np.random.default_rng(0)
    out, cache = module.forward(*inputs)
    dout = rng.standard_normal(np.shape(out))
    module.zero_grad()
    module.backward(dout, cache)
    tensors = {name: p.data for name, p in module.named_parameters()}
    analytic = {name: p.grad.copy() for name, p in module.named_parameters()}
    objective = lambda: float(np.sum(dout * module.forward(*inputs)[0]))  # noqa: E731
    return [tool._full_module_check("m", module, objective, tensors, analytic, 1e-6, rng, {},
                                    downstream).to_dict() for downstream in (True, False)]


@pytest.mark.parametrize("tied", [False, True])
def test_downstream_evaluation_gives_the_same_numbers_bit_for_bit(tied):
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.objectives import NextTokenLoss
    config = GPTConfig.tiny(vocab_size=5, max_context=3, width=4, heads=2, tied=tied,
                            init_std=0.3)
    ids = np.random.default_rng(1).integers(0, 5, (2, 3))
    replayed, plain = _full_reports(NextTokenLoss(GPT(config, rng=2)), ids)
    assert replayed == plain
    assert replayed["passed"]


class _WritesIntoItsChild(Linear):
    """A parent that adds into its child's output in place: reuse must not be fooled."""

    def __init__(self):
        super().__init__(3, 3, rng=0)
        self.inner = Linear(3, 3, rng=1)

    def forward(self, x):
        h, inner = self.inner.forward(x)
        h += 1.0
        y, own = super().forward(h)
        return y, (inner, own)

    def backward(self, dout, cache):
        return self.inner.backward(super().backward(dout, cache[1]), cache[0])


def test_a_caller_writing_into_an_output_falls_back_to_whole_forwards():
    x = np.random.default_rng(3).standard_normal((2, 3))
    replayed, plain = _full_reports(_WritesIntoItsChild(), x)
    assert replayed == plain and replayed["passed"]


def test_a_gradient_that_is_exactly_zero_is_marked_and_kept_out_of_the_summary():
    """Softmax ignores a shift shared by all keys, so the key projection's bias has a zero
    gradient: its finite differences are pure noise and its norm ratio means nothing."""
    from numpy_tf import MultiHeadAttention
    layer = MultiHeadAttention(6, 2, num_kv_heads=1, bias=True, rng=1)
    x = np.random.default_rng(2).standard_normal((2, 3, 6))
    report = gradcheck_module(layer, x)
    rows = {row.name: row for row in report.rows}
    assert report.passed and rows["k_proj.bias"].zero
    assert not any(row.zero for name, row in rows.items() if name != "k_proj.bias")
    assert report.max_norm_rel_error < 1e-7


# -- the full mode perturbs many elements per forward, each in its own copy of the batch --------
def _numbers(monkeypatch, objective, *inputs, by_copies=True, **kwargs):
    """The full check's finite differences by tensor, and the tensors that were perturbed one
    element at a time (all of them when by_copies is False)."""
    tool = importlib.import_module("numpy_tf.checking.finite_differences")
    numbers, singles = {}, []
    report_of, one_at_a_time = tool._full_report, tool._one_at_a_time

    def full_report(title, numericals, analytic, skip, *step):
        numbers.update(numericals)
        return report_of(title, numericals, analytic, skip, *step)

    def single(objective, array, mask, step):
        singles.append(array.shape)
        return one_at_a_time(objective, array, mask, step)
    monkeypatch.setattr(tool, "_full_report", full_report)
    monkeypatch.setattr(tool, "_one_at_a_time", single)
    if not by_copies:
        monkeypatch.setattr(tool._CopiesObjective, "for_module", lambda *a: None)
    report = gradcheck_module(objective, *inputs, seed=4, forward_kwargs=kwargs)
    monkeypatch.undo()
    return report, numbers, singles


def _families():
    from numpy_tf.models.bert import Bert, BertConfig
    from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.llama import Llama, LlamaConfig
    from numpy_tf.models.objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 11, (2, 4))
    padding = np.zeros((2, 4), dtype=bool)
    padding[1, 3] = True
    labels = np.where(rng.random((2, 4)) < 0.5, ids, -100)
    labels[0, 0] = ids[0, 0]
    gpt = GPTConfig.tiny(vocab_size=11, max_context=4, width=8, heads=2, init_std=0.3)
    return {
        "gpt": (NextTokenLoss(GPT(gpt, rng=1)), (ids,), {}),
        "gpt, tied, padded": (NextTokenLoss(GPT(GPTConfig.tiny(
            vocab_size=11, max_context=4, width=8, heads=2, init_std=0.3, tied=True), rng=2)),
            (ids,), {"key_padding_mask": padding}),
        "llama": (NextTokenLoss(Llama(LlamaConfig(
            vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3), rng=3)),
            (ids,), {}),
        "bert": (MaskedLMLoss(Bert(BertConfig(
            vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=12, initializer_range=0.3), rng=4)), (ids, labels), {}),
        "seq2seq": (Seq2SeqLoss(Seq2Seq(Seq2SeqConfig(
            src_vocab_size=11, tgt_vocab_size=11, d_model=8, nhead=2, num_encoder_layers=1,
            num_decoder_layers=1, dim_feedforward=12), rng=5)),
            (ids, ids[:, :3], ids[:, 1:]), {"src_key_padding_mask": padding}),
    }


@pytest.mark.parametrize("family", list(_families()))
def test_perturbing_by_copies_gives_the_numbers_of_one_element_at_a_time(family,
                                                                           monkeypatch):
    objective, inputs, kwargs = _families()[family]
    report, by_copies, singles = _numbers(monkeypatch, objective, *inputs, **kwargs)
    plain, one_at_a_time, _ = _numbers(monkeypatch, objective, *inputs, by_copies=False,
                                       **kwargs)
    assert singles == []                                # every Parameter went by copies
    assert by_copies.keys() == one_at_a_time.keys()
    for name, single in one_at_a_time.items():
        # the same objective values but for the rounding of forwards on more rows: measured
        # differences are below 1e-10 (differences of 1e-16 relative in a loss, over 2e-6)
        np.testing.assert_allclose(by_copies[name], single, rtol=0, atol=1e-9, err_msg=name)
    assert report.passed and plain.passed, str(report)
    assert [row.passed for row in report.rows] == [row.passed for row in plain.rows]


class _MixesTheBatch(Module):
    """A model whose logits of one row read the others' (minus half the batch mean): copies of
    a batch stacked in one forward would see each other's perturbations."""

    def __init__(self, model):
        super().__init__(model.dtype)
        self.model = model

    def forward(self, ids, key_padding_mask=None):
        logits, cache = self.model.forward(ids)
        return logits - 0.5 * logits.mean(axis=0, keepdims=True), cache

    def backward(self, dout, cache):
        return self.model.backward(dout - 0.5 * dout.mean(axis=0, keepdims=True), cache)


def test_a_model_that_mixes_the_rows_of_a_batch_is_perturbed_one_element_at_a_time(
        monkeypatch):
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.objectives import NextTokenLoss
    model = GPT(GPTConfig.tiny(vocab_size=7, max_context=3, width=4, heads=2, init_std=0.3),
                rng=6)
    objective = NextTokenLoss(_MixesTheBatch(model))
    ids = np.random.default_rng(7).integers(0, 7, (2, 3))
    report, numbers, singles = _numbers(monkeypatch, objective, ids)
    _, plain, _ = _numbers(monkeypatch, objective, ids, by_copies=False)
    assert len(singles) == len(plain)                   # the spot checks saw it every time
    for name in plain:
        np.testing.assert_array_equal(numbers[name], plain[name], err_msg=name)
    assert report.passed, str(report)


class _TanhForwardExactBackward(Module):
    def forward(self, x):
        return _tanh_gelu_with_the_exact_backward(x)

    def backward(self, dout, cache):
        return gelu_backward(dout, cache)


def test_a_wrong_backward_deep_in_a_model_fails_by_copies(monkeypatch):
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.objectives import NextTokenLoss
    model = GPT(GPTConfig.tiny(vocab_size=7, max_context=3, width=4, heads=2, init_std=1.0),
                rng=8)
    setattr(model.blocks[0].feedforward, "1", _TanhForwardExactBackward())
    ids = np.random.default_rng(9).integers(0, 7, (2, 3))
    report, _, singles = _numbers(monkeypatch, NextTokenLoss(model), ids)
    assert singles == []
    failed = {row.name for row in report.rows if not row.passed}
    assert "model.blocks.0.feedforward.0.weight" in failed
    assert not any(name.startswith(("model.blocks.1", "model.final_norm", "model.output"))
                   for name in failed)


def test_copy_losses_are_each_stacked_batch_s_own_loss():
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.mixtral import Mixtral, MixtralConfig, MixtralLoss
    from numpy_tf.models.objectives import NextTokenLoss
    model = GPT(GPTConfig.tiny(vocab_size=7, max_context=4, width=4, heads=2), rng=10)
    rng = np.random.default_rng(11)
    batches = [rng.integers(0, 7, (2, 4)) for _ in range(3)]
    masks = [np.zeros((2, 4), dtype=bool) for _ in range(3)]
    masks[1][0, 2:] = True                              # fewer targets in the second batch
    masks[2][:, 3] = True
    objective = NextTokenLoss(model)
    losses = objective.copy_losses(3, np.concatenate(batches),
                                   key_padding_mask=np.concatenate(masks))
    expected = [float(objective.forward(ids, mask)[0]) for ids, mask in zip(batches, masks)]
    np.testing.assert_allclose(losses, expected, rtol=1e-15)
    assert objective._copies == 0                       # back to plain forwards
    mixtral = Mixtral(MixtralConfig(vocab_size=7, hidden_size=8, intermediate_size=6,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, num_local_experts=2,
                                    num_experts_per_tok=1, output_router_logits=True))
    # the load-balancing term is over the whole stack: one number, which the check refuses
    assert np.shape(MixtralLoss(mixtral).copy_losses(3, np.concatenate(batches))) == ()


class _ReadsTheHeadOutsideIt(Module):
    """Adds 0.1 sum_j W[v, j] to the logits of class v, W the head's weight read by this
    parent's own code, not through the head's forward; `forgets` leaves that term out of the
    backward."""

    def __init__(self, model, forgets=False):
        super().__init__(model.dtype)
        self.model, self.forgets = model, forgets

    def forward(self, ids, key_padding_mask=None):
        logits, cache = self.model.forward(ids)
        return logits + 0.1 * self.model.output.weight.data.sum(axis=1), cache

    def backward(self, dout, cache):
        if not self.forgets:
            self.model.output.weight.grad += 0.1 * dout.sum(axis=(0, 1))[:, None]
        return self.model.backward(dout, cache)


@pytest.mark.parametrize("forgets", [False, True])
def test_a_parameter_read_outside_its_module_is_perturbed_one_element_at_a_time(forgets,
                                                                                monkeypatch):
    from numpy_tf.models.gpt import GPT, GPTConfig
    from numpy_tf.models.objectives import NextTokenLoss
    model = GPT(GPTConfig.tiny(vocab_size=7, max_context=3, width=4, heads=2, init_std=0.3),
                rng=12)
    objective = NextTokenLoss(_ReadsTheHeadOutsideIt(model, forgets))
    ids = np.random.default_rng(13).integers(0, 7, (2, 3))
    report, numbers, singles = _numbers(monkeypatch, objective, ids)
    _, plain, _ = _numbers(monkeypatch, objective, ids, by_copies=False)
    assert singles == [(7, 4)]                          # the head's weight alone
    for name in plain:
        np.testing.assert_allclose(numbers[name], plain[name], rtol=0, atol=1e-9,
                                   err_msg=name)
    np.testing.assert_array_equal(numbers["model.model.output.weight"],
                                  plain["model.model.output.weight"])
    failed = [row.name for row in report.rows if not row.passed]
    assert failed == (["model.model.output.weight"] if forgets else [])


# -- the fast mode moves a module's tensors as one array -----------------------------------------
def test_the_fast_module_check_moves_one_buffer_and_gives_the_numbers_of_one_per_tensor(
        monkeypatch):
    """gradcheck_module(fast=True) lays its copies of the float inputs and Parameters end to end
    in one buffer (one operation moves them all to a point); each direction's numbers are those
    of moving the tensors one by one, bit for bit, and the caller's module and input stay as
    they were."""
    from numpy_tf import GPT, GPTConfig, Sequential
    from numpy_tf.checking import finite_differences as fd
    from numpy_tf.models.objectives import NextTokenLoss

    ids = np.random.default_rng(0).integers(0, 20, (2, 5))
    objective = NextTokenLoss(GPT(GPTConfig.tiny(tied=True), rng=0))
    layers = Sequential(Linear(3, 4, rng=1), Linear(4, 2, rng=2))
    x = np.random.default_rng(3).standard_normal((2, 3))
    for module, inputs in ((objective, (ids,)), (layers, (x,))):
        before = {name: p.data.copy() for name, p in module.named_parameters()}
        ends = []
        check = fd._check

        def seen(*args, **kwargs):
            ends.append(kwargs.get("buffer") is not None)
            return check(*args, **kwargs)

        monkeypatch.setattr(fd, "_check", seen)
        packed = gradcheck_module(module, *inputs, fast=True, seed=4)
        monkeypatch.setattr(fd, "_lay_end_to_end", lambda arrays: [a.copy() for a in arrays])
        apart = gradcheck_module(module, *inputs, fast=True, seed=4)
        monkeypatch.undo()
        assert ends == [True, False]
        assert packed.passed and [(r.max_abs_error, r.norm_rel_error) for r in packed.rows] == \
            [(r.max_abs_error, r.norm_rel_error) for r in apart.rows]
        for name, p in module.named_parameters():
            assert p.data.tobytes() == before[name].tobytes(), name


def test_one_buffer_moves_the_tensors_only_if_they_are_the_views_laid_in_order():
    from numpy_tf.checking import finite_differences as fd

    a, b = np.arange(6.0).reshape(2, 3), np.arange(4.0)
    laid = fd._lay_end_to_end([a, b])
    assert np.array_equal(laid[0], a) and np.array_equal(laid[1], b)
    assert fd._laid_buffer(laid, list(laid)) is laid[0].base
    assert fd._laid_buffer(laid, laid[::-1]) is None                # out of order
    assert fd._laid_buffer(laid, laid[:1]) is None                  # not every view
    assert fd._laid_buffer(laid, [laid[0], b]) is None              # an array of its own
    assert fd._laid_buffer(laid, [laid[0], laid[1].copy()]) is None
    copies = [a.copy(), b.copy()]                                   # no one buffer under them
    assert fd._laid_buffer(copies, copies) is None
    assert fd._laid_buffer([], []) is None


# -- a check that would compare nothing, or cannot run, is refused by name ----------------------
def _double(x):
    return 2.0 * x, None


def _double_backward(dout, cache):
    return (2.0 * dout,)


_X = np.random.default_rng(12).standard_normal((2, 3))


@pytest.mark.parametrize("call, error, message", [
    # no direction: nothing compared, and the report said "all passed"
    (lambda: gradcheck(_double, _double_backward, [_X], fast=True, directions=0), ValueError,
     "directions must be a positive integer; got 0"),
    (lambda: gradcheck(_double, _double_backward, [_X], fast=True, directions=-2), ValueError,
     "directions must be a positive integer"),
    (lambda: gradcheck_module(Linear(3, 2, rng=0), _X, fast=True, directions=0), ValueError,
     "directions must be a positive integer"),
    (lambda: gradcheck(_double, _double_backward, [_X], step=0.0), ValueError,   # 0 division
     r"step must be a number in \(0, inf\); got 0.0"),
    (lambda: gradcheck(_double, _double_backward, [_X], step=float("nan")), ValueError,
     "step must be a number"),
    (lambda: gradcheck(_double, _double_backward, [_X], seed="a"), ValueError,
     "seed must be a non-negative integer"),
    (lambda: gradcheck(_double, _double_backward, [_X], fast=1), TypeError,
     "fast must be True or False"),
    (lambda: gradcheck(_double, _double_backward, [np.ones((2, 3), int)]), ValueError,
     "nothing to check: no float array among the inputs"),
    (lambda: gradcheck(_double, _double_backward, [_X], wrt=[]), ValueError,
     "nothing to check"),
    (lambda: gradcheck(lambda x: 2.0 * x, _double_backward, [_X]), TypeError,
     r"forward must return a pair \(out, cache\); got a ndarray"),
    (lambda: gradcheck(lambda x: ("out", None), _double_backward, [_X]), TypeError,
     "out a float array or number; got out of a str"),
    (lambda: gradcheck(lambda x: (np.ones(3, int), None), _double_backward, [_X]), TypeError,
     r"got out of a ndarray \(dtype int64\)"),
    (lambda: gradcheck(_double, lambda dout, cache: 3.0, [_X]), TypeError,
     "backward must return the inputs' gradients.*got a float"),
    (lambda: gradcheck_module(lambda x: x, _X), TypeError,
     "module must be a numpy_tf Module; got a function"),
    (lambda: gradcheck_module(GELU(), _X, wrt_inputs=False), ValueError,
     "nothing to check: GELU has no Parameter"),
    (lambda: gradcheck_module(Linear(3, 2, rng=0), _X, wrt_inputs=False, parameters=False),
     ValueError, "nothing to check: Linear"),
])
def test_a_check_that_would_compare_nothing_or_cannot_run_is_refused(call, error, message):
    """Each was a report of no rows that said 'all passed', a ZeroDivisionError, a SeedSequence
    or 'max() arg is an empty sequence' message, a report of inf errors, or an
    AttributeError."""
    with pytest.raises(error, match=message):
        call()


def test_the_report_states_the_step_it_was_asked_for():
    full = gradcheck(_double, _double_backward, [_X], step=1e-5)
    fast = gradcheck(_double, _double_backward, [_X], fast=True, step=3e-7)
    assert "full finite differences in float64, step 1e-05;" in str(full) and full.passed
    assert "fast finite differences in float64, step 3e-07;" in str(fast) and fast.passed
    assert full.step == 1e-5 and fast.step == 3e-7
