"""BatchSplit (numpy_tf/training/split.py): a step's batch in parts on threads gives the loss and
the gradients of the whole batch on one thread, within SPLIT_ULPS of each array's largest
|value| (a gradient's: the largest among the whole batch's and the parts' own), for every
objective it splits; it runs the batch whole wherever splitting could change what is computed
or said; every call gives the same bits.

The parts' sums are the whole batch's in another order: the loss's weighted mean and the
gradients' sums over rows (dW = dY^T X over the batch's rows, in two matrix products instead of
one, then added), as the kernel tier's whole models are (tests/test_paths.py), and the bound
is theirs, 32. Where the parts' gradients cancel, their sum's rounding is of their size, not of
the sum's, so a gradient's ulps are those of the largest |value| among the whole batch's and
the parts' own (the Seq2Seq encoder's final norm weight, with feature inputs, in 3 parts:
the whole's largest 0.0077, a part's 0.027; the split 41.5 ulps of the former from the whole
batch, 13 of the latter, on an AVX2 machine, where the whole batch is itself 8 ulps of the
former from float64 and the split 36). Measured worst on that machine, B = 5 in 2 and 3
parts, float32 / float64: the loss 1 / 1 ulp; the gradients GPT-2 layout 7 / 4, GPT 6 / 2,
Llama 5.1 / 4.5, Mixtral 17.6 / 8, Gemma2 13 / 6, BERT 4 / 3, Seq2Seq 9 / 5, Seq2Seq with
feature inputs 13 / 3 (each array's own largest alone: 41.5 / 10). On an AVX-512 machine
earlier: GPT-2 layout 6 / 5, GPT 2 / 2, Llama 7 / 6, Mixtral 8 / 6.5, Gemma2 9 / 7.5, BERT 3 /
3, Seq2Seq 20.5 / 11; the benchmarks' small GPT (16 rows of 64) float32 10 ulps, float64 11.
"""
import threading

import numpy as np
import pytest

from numpy_tf import GPT, Bert, BertConfig, GPTConfig, Llama, LlamaConfig, Seq2Seq, Seq2SeqConfig
from numpy_tf import reference_path
from numpy_tf.core import threads as thread_settings
from numpy_tf.core.module import Module
from numpy_tf.models.mixtral import Mixtral, MixtralConfig, MixtralLoss
from numpy_tf.models.objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss, TargetLoss
from numpy_tf.optim import SGD
from numpy_tf.training import Trainer, TrainSettings
from numpy_tf.training.split import BatchSplit, SplitCache
from test_paths import _gemma2 as gemma2_model

SPLIT_ULPS = 32
ROWS = 5                    # odd: parts of 3 and 2 rows, or 2, 2 and 1


def _gpt(dtype):
    model = GPT(GPTConfig.gpt2(vocab_size=40, max_context=12, width=24, heads=4, layers=2),
                rng=2, dtype=dtype)
    ids = np.random.default_rng(1).integers(0, 40, (ROWS, 10))
    padding = np.zeros((ROWS, 10), dtype=bool)
    padding[1, :3] = padding[4, :7] = True          # the parts keep different target counts
    return NextTokenLoss(model), (ids,), {"key_padding_mask": padding}


def _gpt_targets(dtype):
    model = GPT(GPTConfig.tiny(), rng=1, dtype=dtype)
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 20, (ROWS, 4))
    targets[:2] = -100                              # the first part has nothing to predict
    return TargetLoss(model), (rng.integers(0, 20, (ROWS, 4)), targets), {}


def _llama(dtype):
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=40,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Llama(config, rng=3, dtype=dtype)
    return NextTokenLoss(model), (np.random.default_rng(2).integers(0, 48, (ROWS, 7)),), {}


def _mixtral(dtype):
    config = MixtralConfig(vocab_size=48, hidden_size=32, intermediate_size=20,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, initializer_range=0.2)
    model = Mixtral(config, rng=8, dtype=dtype)
    return NextTokenLoss(model), (np.random.default_rng(7).integers(0, 48, (ROWS, 7)),), {}


def _gemma2(dtype):
    model = gemma2_model(dtype)[0]                  # sliding windows and soft caps
    return NextTokenLoss(model), (np.random.default_rng(8).integers(0, 48, (ROWS, 7)),), {}


def _bert(dtype):
    model = Bert(BertConfig(), rng=4, dtype=dtype)
    rng = np.random.default_rng(3)
    ids = rng.integers(1, 32, (ROWS, 9))
    labels = np.where(rng.random((ROWS, 9)) < 0.3, ids, -100)
    padding = np.zeros((ROWS, 9), dtype=bool)
    padding[0, -2:] = True
    ids[padding] = 0
    return MaskedLMLoss(model), (ids, labels), {"key_padding_mask": padding}


def _seq2seq(dtype):
    model = Seq2Seq(Seq2SeqConfig(activation="gelu"), rng=6, dtype=dtype)
    rng = np.random.default_rng(5)
    target = rng.integers(0, 12, (ROWS, 5))
    target[3, -2:] = -100
    return Seq2SeqLoss(model), (rng.integers(0, 12, (ROWS, 6)), rng.integers(0, 12, (ROWS, 5)),
                                target), {}


def _seq2seq_features(dtype):
    config = Seq2SeqConfig(src_vocab_size=None, src_features=5, tgt_vocab_size=7, d_model=8,
                           nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16)
    model = Seq2Seq(config, rng=7, dtype=dtype)
    rng = np.random.default_rng(6)
    return Seq2SeqLoss(model), (rng.standard_normal((ROWS, 6, 5)).astype(dtype),
                                rng.integers(0, 7, (ROWS, 4)), rng.integers(0, 7, (ROWS, 4))), {}


OBJECTIVES = {"GPT-2 layout, padded": _gpt, "GPT, targets": _gpt_targets, "Llama": _llama,
              "Mixtral": _mixtral, "Gemma2": _gemma2, "BERT masked LM": _bert,
              "Seq2Seq": _seq2seq, "Seq2Seq, feature inputs": _seq2seq_features}


def _step(objective, args, kwargs, dloss):
    """(loss, {name: gradient}) of one forward and backward from zero gradients; the
    gradient of an input that has one (Seq2Seq's features) under "input"."""
    model = objective.model
    for parameter in model.parameters():
        parameter.zero_grad()
    loss, cache = objective.forward(*args, **kwargs)
    dinput = objective.backward(dloss, cache)
    grads = {name: p.grad.copy() for name, p in model.named_parameters()}
    if dinput is not None:
        grads["input"] = dinput
    return loss, grads


def _ulps(got, want, largest=None) -> float:
    """|got - want| in ulps of want's largest |value| (or of `largest`, when given)."""
    difference = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max()
    largest = np.abs(want).max() if largest is None else largest
    return float(difference / np.spacing(largest).astype(np.float64))


def _parts_largest(objective, args, kwargs, dloss, cache: SplitCache) -> dict:
    """{name: the largest |value| of that gradient among the parts' own}: each part's rows
    through the objective on one thread, given dloss n_k / N as BatchSplit gives it. The
    parts' gradients add up to the whole batch's, and where they cancel their sum's rounding
    is of their size, not of the sum's."""
    rows, count = args[0].shape[0], len(cache.caches)
    bounds = [rows * k // count for k in range(count + 1)]
    largest: dict = {}
    for k, n in enumerate(cache.counts):
        span = slice(bounds[k], bounds[k + 1])
        part_args = tuple(None if value is None else value[span] for value in args)
        part_kwargs = {name: None if value is None else value[span]
                       for name, value in kwargs.items()}
        scale = type(dloss)(dloss * n / cache.count)
        _, grads = _step(objective, part_args, part_kwargs, scale)
        for name, grad in grads.items():
            largest[name] = max(largest.get(name, 0.0), np.abs(grad).max())
    return largest


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_the_parts_give_the_whole_batchs_loss_and_gradients(name, dtype, threads):
    objective, args, kwargs = OBJECTIVES[name](dtype)
    dloss = dtype(0.75)                         # not 1: the parts must scale what they are given
    loss, grads = _step(objective, args, kwargs, dloss)
    split = BatchSplit(objective, threads, min_part_work=0)
    split_loss, split_grads = _step(split, args, kwargs, dloss)
    assert type(split_loss) is type(loss) and np.asarray(split_loss).dtype == dtype
    assert _ulps(split_loss, loss) <= SPLIT_ULPS, (split_loss, loss)
    assert split_grads.keys() == grads.keys()
    _, cache = split.forward(*args, **kwargs)
    assert isinstance(cache, SplitCache) and len(cache.caches) == threads   # it did split
    parts = _parts_largest(objective, args, kwargs, dloss, cache)
    worst = max(_ulps(split_grads[key], grads[key],
                      max(np.abs(grads[key]).max(), parts[key])) for key in grads)
    assert worst <= SPLIT_ULPS, worst
    again_loss, again = _step(split, args, kwargs, dloss)
    assert np.array_equal(again_loss, split_loss)                           # the same bits
    assert all(np.array_equal(again[key], split_grads[key]) for key in grads)


def test_float32_parts_are_as_close_to_float64_as_the_whole_batch():
    """No accuracy given up: against the float64 step, the float32 split's worst error is
    within a few ulps of the float32 whole batch's own."""
    objective, args, kwargs = _gpt(np.float64)
    _, exact = _step(objective, args, kwargs, 1.0)
    objective32, _, _ = _gpt(np.float32)
    _, whole = _step(objective32, args, kwargs, np.float32(1.0))
    _, parts = _step(BatchSplit(objective32, 2, min_part_work=0), args, kwargs, np.float32(1.0))
    for key in exact:
        scale = np.spacing(np.abs(exact[key]).max().astype(np.float32)).astype(np.float64)
        whole_error = np.abs(whole[key] - exact[key]).max() / scale
        parts_error = np.abs(parts[key] - exact[key]).max() / scale
        assert parts_error <= whole_error + SPLIT_ULPS, (key, parts_error, whole_error)


def test_the_parts_run_on_their_own_threads_with_the_blas_on_one():
    objective, args, kwargs = _gpt(np.float32)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)                  # makes the twins
    seen = {}
    twin = split._twins[1].objective                # the second part's
    original = type(twin).forward

    def watched(self, *a, **k):
        seen["thread"] = threading.current_thread().name
        seen["blas"] = [c.get_num_threads() for c in thread_settings._blas_controllers()]
        return original(self, *a, **k)
    twin.forward = watched.__get__(twin)
    with thread_settings.blas_threads(2):           # as `--threads 2` leaves it
        loss, cache = split.forward(*args, **kwargs)
        after = [c.get_num_threads() for c in thread_settings._blas_controllers()]
    assert seen["thread"].startswith("numpy_tf-part")
    assert thread_settings._blas_controllers(), "threadpoolctl is part of the test extra"
    assert set(seen["blas"]) == {1} and set(after) == {2}


def test_a_part_runs_the_tier_the_caller_chose():
    def tiers(value, found):
        if type(value).__name__.endswith("KernelCache"):
            found.add("kernel")
        if isinstance(value, tuple):
            for item in value:
                tiers(item, found)
        return found
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    _, cache = split.forward(*args, **kwargs)
    assert all(tiers(part, set()) == {"kernel"} for part in cache.caches)
    with reference_path():
        _, cache = split.forward(*args, **kwargs)
        assert all(tiers(part, set()) == set() for part in cache.caches)
        split.backward(1.0, cache)


def test_the_twin_reads_the_weights_the_model_holds_now():
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)
    for parameter in objective.model.parameters():
        parameter.data = parameter.data * 0.5       # a new array, as a loaded state would be
    want, _ = objective.forward(*args, **kwargs)
    got, _ = split.forward(*args, **kwargs)
    assert _ulps(got, want) <= SPLIT_ULPS
    old_twin = split._twins[0]
    norm = objective.model.norm
    norm.weight = type(norm.weight)(norm.weight.data.copy() + 1.0)      # a new Parameter
    want, _ = objective.forward(*args, **kwargs)
    got, _ = split.forward(*args, **kwargs)
    assert split._twins[0] is not old_twin and _ulps(got, want) <= SPLIT_ULPS


def test_the_twin_follows_the_models_mode():
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)
    objective.model.eval()
    split.forward(*args, **kwargs)
    assert not any(module.training for twin in split._twins
                   for _, module in twin.objective.model.named_modules())
    objective.model.train()
    split.forward(*args, **kwargs)
    assert all(module.training for twin in split._twins
               for _, module in twin.objective.model.named_modules())


def test_the_twins_follow_what_else_the_objective_holds():
    """A setting changed between steps (the objective's label_smoothing, a module's GELU
    approximation) makes new twins; ordinary steps and train/eval switches do not."""
    objective, args, kwargs = _gpt(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)
    twins = list(split._twins)
    for _ in range(2):
        _step(split, args, kwargs, 0.75)
        objective.model.eval()
        split.forward(*args, **kwargs)
        objective.model.train()
    assert all(a is b for a, b in zip(split._twins, twins))
    objective.label_smoothing = 0.2
    got, want = split.forward(*args, **kwargs)[0], objective.forward(*args, **kwargs)[0]
    assert _ulps(got, want) <= SPLIT_ULPS
    gelu = objective.model.blocks[0].feedforward[1]
    assert gelu.approximate == "tanh"               # GPT-2's
    before = want
    gelu.approximate = "none"
    got, want = split.forward(*args, **kwargs)[0], objective.forward(*args, **kwargs)[0]
    assert want != before and _ulps(got, want) <= SPLIT_ULPS


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_steps_keep_the_twins(name):
    """Nothing a step does to the objective makes the twins stale: three steps, one set."""
    objective, args, kwargs = OBJECTIVES[name](np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    _step(split, args, kwargs, 0.75)
    twins = list(split._twins)
    _step(split, args, kwargs, 0.75)
    _step(split, args, kwargs, 0.75)
    assert len(twins) == 2 and all(a is b for a, b in zip(split._twins, twins))


def test_the_twins_hold_no_gradient_between_steps():
    objective, args, kwargs = _llama(np.float32)
    split = BatchSplit(objective, 3, min_part_work=0)
    _step(split, args, kwargs, np.float32(1.0))
    assert len(split._twins) == 3
    assert all(parameter._grad is None for twin in split._twins
               for parameter in twin.parameters)
    with pytest.raises(RuntimeError, match="only during its backward"):
        split._twins[1].parameters[0].grad
    with pytest.raises(RuntimeError, match="added into, not replaced"):
        split._twins[1].parameters[0].grad = np.zeros(split._twins[1].parameters[0].shape)


def test_a_part_hands_each_gradient_in_when_its_module_has_finished():
    """Part 1's array for a Parameter is added into the model's, and let go, once part 0 and
    part 1 have both finished with it: while part 1's backward is in its first blocks, the
    gradients of the blocks after them are complete (equal to the whole batch's)."""
    objective, args, kwargs = _gpt(np.float64)
    _, whole = _step(objective, args, kwargs, 0.75)
    objective.model.zero_grad()
    split = BatchSplit(objective, 2, min_part_work=0)
    _, cache = split.forward(*args, **kwargs)
    twin = split._twins[1]
    first_block = twin.objective.model.blocks[0]
    backward = first_block.backward
    seen = {}

    def watched(*a, **k):
        handoff = twin.current()
        seen["held"] = sum(array is not None for array in handoff.held[1])
        seen["last block"] = {name: parameter.grad.copy() for name, parameter
                              in objective.model.named_parameters()
                              if name.startswith("blocks.1.")}
        return backward(*a, **k)
    first_block.backward = watched
    try:
        split._run = _part_zero_first(split._run)
        split.backward(0.75, cache)
    finally:
        del first_block.backward
    assert seen["held"] <= 4, "part 1 holds an array per Parameter of the whole model"
    for name, grad in seen["last block"].items():
        assert _ulps(grad, whole[name]) <= SPLIT_ULPS, name


def _part_zero_first(run):
    """BatchSplit._run with the parts one after the other on this thread, in part order."""
    def sequential(calls):
        return [function(*args, **kwargs) for function, args, kwargs in calls]
    return sequential


def test_the_hand_off_adds_in_part_order_whatever_finishes_first():
    """_Handoff on its own: part 1 finishing first waits for part 0; an array asked for after
    a part has finished with a Parameter is added in at the end; the sums' order is fixed."""
    from numpy_tf.core.module import Parameter
    from numpy_tf.training.split import _Handoff
    rng = np.random.default_rng(0)
    own = [Parameter(rng.standard_normal(5).astype(np.float32))]
    g, a, b, late = (rng.standard_normal(5).astype(np.float32) * scale
                     for scale in (1.0, 1e-3, 1e3, 1e-7))
    own[0].grad = g.copy()
    handoff = _Handoff(own, 2)
    handoff.array(1, 0)[...] += b
    handoff.mark_finished(1, [0])
    assert np.array_equal(own[0].grad, g), "part 1 went in before part 0 had finished"
    handoff.array(0, 0)[...] += a
    handoff.mark_finished(0, [0])
    assert np.array_equal(own[0].grad, (g + a) + b)
    assert handoff.held[1][0] is None
    handoff.array(1, 0)[...] += late             # after part 1 had finished with it
    assert np.array_equal(own[0].grad, (g + a) + b)
    handoff.finish()
    assert np.array_equal(own[0].grad, ((g + a) + b) + late)


def test_a_split_step_needs_no_more_memory_than_the_whole_batch():
    """The extra parts' gradient arrays live about one module's backward each. With the parts
    run one after the other (deterministic), the step's traced peak is the whole batch's
    (measured 1.0005 of it; 1.036 with every array held to the end of the part's backward);
    on two threads it depends on how the parts' peaks meet: 1.006-1.025 of the whole batch's
    over 45 steps (1.08 with the arrays held to the end, 1.03 with the wrappers holding each
    backward's arguments: the next two tests), so 1.05 there."""
    import tracemalloc
    model = GPT(GPTConfig(vocab_size=256, max_context=64, width=128, heads=4, layers=4),
                rng=0, dtype=np.float32)
    ids = np.random.default_rng(0).integers(0, 256, (16, 64))
    objective = NextTokenLoss(model)

    def peak(runner):
        _step(runner, (ids,), {}, np.float32(1.0))                # warm: arrays allocated
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            _step(runner, (ids,), {}, np.float32(1.0))
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
    whole = peak(objective)
    in_turn = BatchSplit(objective, 2)
    in_turn._run = _part_zero_first(in_turn._run)
    assert peak(in_turn) <= whole * 1.01, (peak(in_turn) / 2 ** 20, whole / 2 ** 20)
    threaded = peak(BatchSplit(objective, 2))
    assert threaded <= whole * 1.05, (threaded / 2 ** 20, whole / 2 ** 20)


def test_a_parts_module_lets_go_of_the_gradient_it_was_given():
    """The wrapper that tells the hand-off a module has finished moves the backward's
    arguments on: a backward that drops its gradient frees it (the MLP's and the model's
    backwards rely on it), and the MLP still sees its children as unwatched."""
    import weakref

    from numpy_tf.training.split import _Handoff
    objective, args, kwargs = _gpt(np.float32)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)
    twin = split._twins[1]
    twin.handoff = _Handoff(objective.parameters(), 2)
    freed = []

    def backward(dout, cache):
        gone = weakref.ref(dout)
        del dout
        freed.append(gone() is None)
        return cache
    try:
        twin._finishes(backward, ())(np.ones(3), None)
    finally:
        twin.handoff = None
    assert freed == [True]
    mlp = twin.objective.model.blocks[0].feedforward
    assert all("backward" in vars(layer) and not layer.backward_is_watched()
               for layer in (mlp[0], mlp[2]))


def test_backward_twice_adds_twice_and_keeps_the_cache():
    objective, args, kwargs = _gpt(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    _, once = _step(split, args, kwargs, 1.0)
    loss, cache = split.forward(*args, **kwargs)
    for parameter in objective.model.parameters():
        parameter.zero_grad()
    split.backward(1.0, cache)
    split.backward(1.0, cache)
    for name, parameter in objective.model.named_parameters():
        assert _ulps(parameter.grad, 2 * once[name]) <= SPLIT_ULPS, name


def _is_whole(split, args, kwargs) -> bool:
    return not isinstance(split.forward(*args, **kwargs)[1], SplitCache)


def test_batches_that_must_run_whole_run_whole():
    objective, args, kwargs = _gpt(np.float64)
    assert _is_whole(BatchSplit(objective, 1, min_part_work=0), args, kwargs)
    assert _is_whole(BatchSplit(objective, 2, min_part_work=0), (args[0][:1],),
                     {"key_padding_mask": kwargs["key_padding_mask"][:1]})       # one row
    assert _is_whole(BatchSplit(objective, 2, min_part_work=0), args,
                     {**kwargs, "rng": np.random.default_rng(0)})
    with pytest.raises(TypeError, match="ids must be a numpy array"):           # not an array
        BatchSplit(objective, 2, min_part_work=0).forward(args[0].tolist())
    with pytest.raises(ValueError, match="key_padding_mask"):                   # rows differ
        BatchSplit(objective, 2, min_part_work=0).forward(
            *args, key_padding_mask=kwargs["key_padding_mask"][:4])
    mixtral = MixtralLoss(_mixtral(np.float64)[0].model, output_router_logits=True)
    assert _is_whole(BatchSplit(mixtral, 2, min_part_work=0), _mixtral(np.float64)[1], {})


def test_parts_too_small_to_gain_run_whole():
    """A part needs min_part_work parameters x positions (MIN_PART_WORK by default): the tiny
    GPT's batches run whole, the benchmarks' small GPT's 16 rows of 64 in at most 3 parts."""
    from numpy_tf.training.split import MIN_PART_WORK
    tiny = GPT(GPTConfig.tiny(), rng=1)
    ids = np.random.default_rng(0).integers(0, 20, (64, 4))
    assert _is_whole(BatchSplit(NextTokenLoss(tiny), 2), (ids,), {})
    small = GPT(GPTConfig(vocab_size=256, max_context=64, width=128, heads=4, layers=4), rng=0,
                dtype=np.float32)
    assert 1024 * small.num_parameters() // MIN_PART_WORK == 3
    ids = np.random.default_rng(0).integers(0, 256, (16, 64))
    _, cache = BatchSplit(NextTokenLoss(small), 4).forward(ids)
    assert [part.logits.shape[0] for part in cache.caches] == [5, 5, 6]
    _, cache = BatchSplit(NextTokenLoss(small), 4, min_part_work=400 * 10 ** 6).forward(ids)
    assert [part.logits.shape[0] for part in cache.caches] == [8, 8]
    with pytest.raises(ValueError, match="min_part_work"):
        BatchSplit(NextTokenLoss(small), 2, min_part_work=-1)


def test_a_model_numpy_tf_does_not_know_runs_whole():
    class Mine(GPT):                     # defined here: it could read its rows together
        pass
    model = Mine(GPTConfig.tiny(), rng=1)
    ids = np.random.default_rng(0).integers(0, 20, (4, 4))
    assert _is_whole(BatchSplit(NextTokenLoss(model), 2, min_part_work=0), (ids,), {})


def test_recorded_activations_see_the_whole_batch():
    from numpy_tf.core.module import record_activations
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    with record_activations(objective.model) as recorder:
        loss, cache = split.forward(*args, **kwargs)
    assert not isinstance(cache, SplitCache)
    assert all(array.shape[0] == ROWS for array in recorder.activations.values()
               if isinstance(array, np.ndarray) and array.ndim)


def test_without_a_way_to_set_the_blas_the_batch_runs_whole(monkeypatch):
    objective, args, kwargs = _llama(np.float64)
    monkeypatch.setattr(thread_settings, "_blas_controllers", lambda: ())
    for name in thread_settings.BLAS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not thread_settings.can_set_blas_threads()
    assert _is_whole(BatchSplit(objective, 2, min_part_work=0), args, kwargs)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")         # the environment did it already
    assert thread_settings.can_set_blas_threads()
    assert not _is_whole(BatchSplit(objective, 2, min_part_work=0), args, kwargs)


def test_a_bad_batch_gets_the_whole_batchs_error():
    objective, args, kwargs = _llama(np.float64)
    ids = args[0].copy()
    ids[-1, 0] = 48                                         # out of range, in the last part
    with pytest.raises(ValueError) as whole:
        objective.forward(ids)
    with pytest.raises(ValueError) as split:
        BatchSplit(objective, 2, min_part_work=0).forward(ids)
    assert str(split.value) == str(whole.value)


@pytest.mark.parametrize("dloss, error", [
    ("1.0", TypeError), (True, TypeError), (np.ones(1), ValueError), (1 + 2j, TypeError),
    (np.ones((), np.float64), TypeError)])
def test_a_bad_dloss_is_refused_before_any_work(dloss, error):
    objective, args, kwargs = _llama(np.float32)
    split = BatchSplit(objective, 2, min_part_work=0)
    loss, cache = split.forward(*args, **kwargs)
    for parameter in objective.model.parameters():
        parameter.zero_grad()
    with pytest.raises(error, match="dloss"):
        split.backward(dloss, cache)
    assert all(not parameter.grad.any() for parameter in objective.model.parameters())


def test_a_cache_of_another_kind_is_refused():
    objective, args, kwargs = _llama(np.float64)
    with pytest.raises(TypeError, match="cache"):
        BatchSplit(objective, 2, min_part_work=0).backward(1.0, ("not", "a", "cache"))


@pytest.mark.parametrize("threads", [0, -1, True, 2.0, "2", None])
def test_threads_must_be_a_positive_integer(threads):
    objective, _, _ = _llama(np.float64)
    with pytest.raises((TypeError, ValueError), match="threads"):
        BatchSplit(objective, threads, min_part_work=0)


def test_the_objective_must_be_an_objective():
    with pytest.raises(TypeError, match="objective"):
        BatchSplit(lambda ids: 0.0, 2)


def test_a_part_that_fails_fails_the_call_after_every_part_has_ended():
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 3, min_part_work=0)
    split.forward(*args, **kwargs)
    ended = []

    def failing(self, *a, **k):
        raise RuntimeError("the second part")

    def slow(self, *a, **k):
        import time
        time.sleep(0.05)
        ended.append("third")
        return type(self).forward(self, *a, **k)
    second, third = split._twins[1].objective, split._twins[2].objective
    second.forward = failing.__get__(second)
    third.forward = slow.__get__(third)
    with pytest.raises(RuntimeError, match="the second part"):
        split.forward(*args, **kwargs)
    assert ended == ["third"]


def test_a_trainer_takes_a_split_objective():
    def run(split: bool):
        objective, (ids,), kwargs = _gpt(np.float64)
        settings = TrainSettings(steps=3, batch_size=ROWS, lr=0.1, warmup=0, eval_every=0,
                                 log_every=1, clip=0.0)
        trainer = Trainer(BatchSplit(objective, 2, min_part_work=0) if split else objective,
                          lambda rng: (ids,), settings,
                          optimizer=SGD(objective.model.parameters(), lr=0.1),
                          eval_batches=[(ids,)])
        rows = [trainer.train_step() for _ in range(3)]
        return [row["loss"] for row in rows], trainer.evaluate(), \
            [p.data.copy() for p in objective.model.parameters()]
    whole, split = run(False), run(True)
    np.testing.assert_allclose(split[0], whole[0], rtol=1e-14)
    np.testing.assert_allclose(split[1], whole[1], rtol=1e-14)
    for a, b in zip(split[2], whole[2]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_batch_split_is_not_a_module():
    """BatchSplit is not a Module: its twins' Parameters must never join the model's."""
    objective, args, kwargs = _llama(np.float64)
    split = BatchSplit(objective, 2, min_part_work=0)
    split.forward(*args, **kwargs)
    assert not isinstance(split, Module)
    assert len(split._twins) == 2
    for twin in split._twins:
        assert len(objective.model.parameters()) == len(twin.objective.model.parameters())
        assert all(a.data is b.data and a is not b for a, b in
                   zip(objective.parameters(), twin.objective.parameters()))
