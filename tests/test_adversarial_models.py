"""Adversarial input at the edges of the models, configs, optimizers, training and sampling.

Each kind of mistake a caller can make is drawn (hypothesis, where shapes and values can be
drawn) and must be refused before any work, by a TypeError or ValueError that names the
argument the caller passed; the rules that are not refusals (T = 0, a -inf logit, a resumed
run) are checked by their results. The kinds: configs and settings; model backwards (dlogits
and the cache); KV caches; T = 0; sampling; data loss (non-finite training, killed saves).
"""
import math
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpy_tf.core import validate
from numpy_tf.core.npz import stale_temporaries
from numpy_tf.generation.decoding import generate, generate_seq2seq
from numpy_tf.generation.sampling import sample_next, sampling_probabilities
from numpy_tf.models.bert import Bert, BertConfig
from numpy_tf.models.cbow import CBOW
from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from numpy_tf.models.encoder_decoder.transformer import Transformer
from numpy_tf.models.gemma import Gemma, GemmaConfig, alternating_layer_types
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.models.llama import Llama, LlamaConfig
from numpy_tf.models.mixtral import Mixtral, MixtralConfig
from numpy_tf.models.neox import GPTNeoX, NeoXConfig
from numpy_tf.models.objectives import TargetLoss
from numpy_tf.optim import SGD, Adam, AdamW, clip_grad_norm, warmup_cosine
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint
from numpy_tf.training.trainer import Trainer, TrainingStopped, TrainSettings

FEW = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])

GPT_SMALL = GPTConfig(vocab_size=11, max_context=6, width=8, heads=2, layers=2)
LLAMA_SMALL = LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
BERT_SMALL = BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=12, max_position_embeddings=6)
GEMMA2_SMALL = GemmaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           model_type="gemma2", query_pre_attn_scalar=4,
                           attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                           sliding_window=2, layer_types=alternating_layer_types(2))
MIXTRAL_SMALL = MixtralConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                              num_local_experts=3, num_experts_per_tok=2)
NEOX_SMALL = NeoXConfig(vocab_size=11, hidden_size=8, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=12, rotary_pct=0.5)
SEQ2SEQ_SMALL = Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=10, d_model=8, nhead=2,
                              num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=12)


def _ids(rng, shape, high):
    return rng.integers(0, high, shape)


# -- configs and settings --------------------------------------------------------------------
# (config class, field, a bad value, the exception): every field refuses what it cannot mean
BAD_FIELDS = [
    (GPTConfig, "layers", -1, ValueError), (GPTConfig, "layers", 2.7, ValueError),
    (GPTConfig, "layers", True, ValueError), (GPTConfig, "vocab_size", 0, ValueError),
    (GPTConfig, "init_std", math.nan, ValueError), (GPTConfig, "init_std", math.inf, ValueError),
    (GPTConfig, "norm_eps", 0.0, ValueError), (GPTConfig, "dropout", 1.0, ValueError),
    (GPTConfig, "hidden", 0, ValueError), (GPTConfig, "tied", 1, TypeError),
    (GPTConfig, "activation", "swish", ValueError), (GPTConfig, "max_context", 0, ValueError),
    (LlamaConfig, "num_hidden_layers", 0, ValueError),
    (LlamaConfig, "initializer_range", math.inf, ValueError),
    (LlamaConfig, "attention_dropout", -0.1, ValueError),
    (LlamaConfig, "pad_token_id", 2.7, ValueError),
    (LlamaConfig, "tie_word_embeddings", "yes", TypeError),
    (LlamaConfig, "rope_theta", math.inf, ValueError),
    (BertConfig, "pad_token_id", 1.5, ValueError), (BertConfig, "dropout", math.nan, ValueError),
    (BertConfig, "layer_norm_eps", math.inf, ValueError),
    (Seq2SeqConfig, "d_model", 0, ValueError), (Seq2SeqConfig, "nhead", 2.0, ValueError),
    (Seq2SeqConfig, "dropout", math.inf, ValueError),
    (Seq2SeqConfig, "layer_norm_eps", -1e-5, ValueError),
    (Seq2SeqConfig, "activation", "tanh", ValueError),
    (Seq2SeqConfig, "scale_embeddings", 0, TypeError),
    (TrainSettings, "batch_size", 0, ValueError), (TrainSettings, "steps", 2.7, ValueError),
    (TrainSettings, "lr", math.inf, ValueError), (TrainSettings, "lr", math.nan, ValueError),
    (TrainSettings, "weight_decay", math.inf, ValueError),
    (TrainSettings, "clip", math.inf, ValueError), (TrainSettings, "warmup", -1, ValueError),
    (TrainSettings, "log_every", 0, ValueError), (TrainSettings, "seed", True, ValueError),
    (TrainSettings, "min_lr", 1.0, ValueError),
]


@pytest.mark.parametrize("kind, field, value, error", BAD_FIELDS,
                         ids=[f"{k.__name__}.{f}={v!r}" for k, f, v, _ in BAD_FIELDS])
def test_every_config_refuses_a_bad_field_by_its_own_name(kind, field, value, error):
    with pytest.raises(error, match=rf"^{field}\b.*{value!r}"):
        kind(**{field: value})


def test_a_config_names_the_field_not_an_inner_argument():
    # GPT's vocab_size was reported as the Embedding's num_embeddings
    with pytest.raises(ValueError, match="^vocab_size must be a positive integer; got 0$"):
        GPT(GPTConfig(vocab_size=0))
    with pytest.raises(ValueError, match="^vocab_size must be a positive integer; got 0$"):
        CBOW(0, 4)
    with pytest.raises(ValueError, match=r"^width \(10\) must be divisible by heads \(4\)$"):
        GPTConfig(width=10)
    with pytest.raises(ValueError, match=r"^d_model \(10\) must be divisible by nhead \(4\)$"):
        Seq2SeqConfig(d_model=10)
    with pytest.raises(TypeError, match="^config must be a GPTConfig; got dict$"):
        GPT({"vocab_size": 5})
    small = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                 dim_feedforward=8)
    for name, value in [("num_encoder_layers", 0), ("num_decoder_layers", 1.5),
                        ("dropout", math.inf), ("layer_norm_eps", math.inf), ("d_model", 0)]:
        with pytest.raises(ValueError, match=rf"^{name} must be a"):
            Transformer(**{**small, name: value})


@FEW
@given(st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8]))
def test_numpy_integers_are_integers_and_are_stored_as_python_ints(integer):
    config = GPTConfig(vocab_size=integer(7), layers=integer(1), hidden=integer(5))
    assert (config.vocab_size, config.layers, config.hidden) == (7, 1, 5)
    assert type(config.vocab_size) is int and type(config.hidden) is int
    settings_ = TrainSettings(steps=integer(3), batch_size=integer(2), lr=np.float32(0.5),
                              min_lr=np.float16(0.25))
    assert type(settings_.steps) is int and type(settings_.lr) is float
    assert settings_.lr == 0.5 and settings_.min_lr == 0.25


@FEW
@given(st.sampled_from(["lr", "weight_decay", "eps", "momentum", "dampening"]),
       st.sampled_from([math.inf, -math.inf, math.nan]),
       st.sampled_from([SGD, Adam, AdamW]))
def test_optimizers_refuse_a_non_finite_hyperparameter(name, value, optimizer):
    model = CBOW(3, 2)
    valid = {SGD: ("lr", "weight_decay", "momentum", "dampening"),
             Adam: ("lr", "weight_decay", "eps"), AdamW: ("lr", "weight_decay", "eps")}
    if name not in valid[optimizer]:
        return
    kwargs = {"lr": 0.1, name: value}
    with pytest.raises(ValueError, match=rf"^{name} must be a"):
        optimizer(model.parameters(), **kwargs)


def test_schedule_and_clipping_refuse_infinities_and_fractional_steps():
    with pytest.raises(ValueError, match="^base_lr must be a finite number"):
        warmup_cosine(0, math.inf, 1, 10)
    with pytest.raises(ValueError, match="^step must be a non-negative integer; got 2.7"):
        warmup_cosine(2.7, 0.1, 1, 10)
    assert warmup_cosine(np.int64(3), np.float32(0.5), 1, 10) == warmup_cosine(3, 0.5, 1, 10)
    model = CBOW(3, 2)
    with pytest.raises(ValueError, match="^max_norm must be a finite number"):
        clip_grad_norm(model.parameters(), math.inf)
    clip_grad_norm(model.parameters(), 1.0, norm_type=math.inf)     # the max norm: a choice


def test_save_checkpoint_refuses_a_fractional_step(tmp_path):
    model = GPT(GPT_SMALL)
    with pytest.raises(ValueError, match="^step must be a non-negative integer; got 2.7$"):
        save_checkpoint(tmp_path / "c.npz", model, step=2.7)
    with pytest.raises(TypeError, match="^rng must be None or a numpy.random.Generator"):
        save_checkpoint(tmp_path / "c.npz", model, rng=0)
    assert not list(tmp_path.iterdir())
    save_checkpoint(tmp_path / "c.npz", model, step=np.int64(4))
    assert load_checkpoint(tmp_path / "c.npz").step == 4


# -- model backwards: dlogits and the cache ----------------------------------------------------
def _gpt(rng, batch, length):
    model = GPT(GPT_SMALL, rng=1)
    return model, model.forward(_ids(rng, (batch, length), 11))


def _llama(rng, batch, length):
    model = Llama(LLAMA_SMALL, rng=1)
    return model, model.forward(_ids(rng, (batch, length), 11))


def _bert(rng, batch, length):
    model = Bert(BERT_SMALL, rng=1)
    return model, model.forward(_ids(rng, (batch, length), 11))


def _seq2seq(rng, batch, length):
    model = Seq2Seq(SEQ2SEQ_SMALL, rng=1)
    return model, model.forward(_ids(rng, (batch, length + 1), 9), _ids(rng, (batch, length), 10))


def _transformer(rng, batch, length):
    model = Transformer(8, 2, 1, 1, 12, 0.0, rng=1)
    return model, model.forward(rng.normal(size=(batch, length + 1, 8)),
                                rng.normal(size=(batch, length, 8)))


def _cbow(rng, batch, length):
    model = CBOW(11, 4, rng=1)
    return model, model.forward(_ids(rng, (batch, length), 11))


def _small(kind, config):
    def build(rng, batch, length):
        model = kind(config, rng=1)
        return model, model.forward(_ids(rng, (batch, length), 11))
    return build


MODELS = {"GPT": _gpt, "Llama": _llama, "Bert": _bert, "Seq2Seq": _seq2seq,
          "Transformer": _transformer, "CBOW": _cbow,
          "Gemma": _small(Gemma, GEMMA2_SMALL), "Mixtral": _small(Mixtral, MIXTRAL_SMALL),
          "NeoX": _small(GPTNeoX, NEOX_SMALL)}      # named by their caches, as the messages


def _wrong_shapes(shape):
    """Arrays of the logits' size in the wrong places, and near misses."""
    wrong = [shape[:-1] + (shape[-1] + 1,), shape[:-1] + (shape[-1] - 1,), shape + (1,),
             (int(np.prod(shape[:-1])), shape[-1])]
    if len(shape) == 3:
        wrong += [(shape[1], shape[0], shape[2]), (1,) + shape[1:], (shape[2],)]
    return [s for s in wrong if s != shape and all(n > 0 for n in s)]


@FEW
@given(st.sampled_from(sorted(MODELS)), st.integers(1, 3), st.integers(1, 4), st.data())
def test_every_model_backward_refuses_dlogits_of_another_shape(name, batch, length, data):
    rng = np.random.default_rng(batch * 10 + length)
    model, (logits, cache) = MODELS[name](rng, batch, length)
    shape = data.draw(st.sampled_from(_wrong_shapes(logits.shape)), label="shape")
    argument = "dout" if name == "Transformer" else "dlogits"
    before = [p.grad.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match=rf"^{argument} must have the shape of {name}'s output "
                                         rf"{re_shape(logits.shape)}; got {re_shape(shape)}"):
        model.backward(rng.normal(size=shape), cache)
    assert all((p.grad == b).all() for p, b in zip(model.parameters(), before))   # no work done


def re_shape(shape) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_backward_refuses_another_dtype_and_another_cache(name):
    rng = np.random.default_rng(0)
    model, (logits, cache) = MODELS[name](rng, 2, 3)
    argument = "dout" if name == "Transformer" else "dlogits"
    for dtype in (np.float32, np.complex128, np.int64):
        with pytest.raises(TypeError, match=rf"^{argument} must .*dtype"):
            model.backward(rng.normal(size=logits.shape).astype(dtype), cache)
    with pytest.raises(TypeError, match=rf"^{argument} must be a numpy array"):
        model.backward(rng.normal(size=logits.shape).tolist(), cache)
    with pytest.raises(TypeError, match=r"^cache must be the \w+Cache its forward returned; "
                                        r"got a plain tuple of 2 items"):
        model.backward(rng.normal(size=logits.shape), tuple(cache)[:2])
    other = GPT(GPT_SMALL).forward(np.zeros((2, 3), dtype=np.int64))[1] if name != "GPT" else \
        CBOW(11, 4).forward(np.zeros((2, 3), dtype=np.int64))[1]
    with pytest.raises(TypeError, match=r"^cache must be the \w+Cache its forward returned; "
                                        r"got a (GPT|CBOW)Cache"):
        model.backward(rng.normal(size=logits.shape), other)


@pytest.mark.parametrize("name", ["Gemma", "Mixtral", "NeoX"])
def test_the_later_models_refuse_every_wrong_shape_before_any_work(name):
    rng = np.random.default_rng(4)
    model, (logits, cache) = MODELS[name](rng, 2, 3)
    before = [p.grad.copy() for p in model.parameters()]
    for shape in _wrong_shapes(logits.shape):
        with pytest.raises(ValueError, match=rf"^dlogits must have the shape of {name}'s "
                                             rf"output {re_shape(logits.shape)}; got "
                                             rf"{re_shape(shape)}"):
            model.backward(rng.normal(size=shape), cache)
    assert all((p.grad == b).all() for p, b in zip(model.parameters(), before))


def test_mixtral_refuses_router_gradients_that_do_not_fit():
    """drouter_logits: one (B T, E) array per layer, in the router's dtype."""
    rng = np.random.default_rng(5)
    model, (logits, cache) = MODELS["Mixtral"](rng, 2, 3)
    dlogits = rng.normal(size=logits.shape)
    router = [rng.normal(size=z.shape) for z in cache.router_logits]      # (6, 3) each
    before = [p.grad.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^drouter_logits must hold one \(B T, E\) gradient "
                                         r"per layer \(2\); got 1"):
        model.backward(dlogits, cache, router[:1])
    with pytest.raises(ValueError, match=r"^drouter_logits\[0\] must have the shape of the "
                                         r"router's output \(6, 3\); got \(2, 3, 3\)"):
        model.backward(dlogits, cache, [z.reshape(2, 3, 3) for z in router])
    with pytest.raises(TypeError, match=r"^drouter_logits\[1\] must have the dtype"):
        model.backward(dlogits, cache, [router[0], router[1].astype(np.float32)])
    assert all((p.grad == b).all() for p, b in zip(model.parameters(), before))   # no work done


def test_the_encoder_and_decoder_halves_check_their_own_gradients():
    rng = np.random.default_rng(1)
    bert = Bert(BERT_SMALL)
    hidden, encode = bert.encode(_ids(rng, (2, 4), 11))
    with pytest.raises(ValueError, match=r"^dhidden must have the shape .* \(2, 4, 8\); got "
                                         r"\(4, 2, 8\)"):
        bert.encode_backward(rng.normal(size=(4, 2, 8)), encode)
    model = Seq2Seq(SEQ2SEQ_SMALL)
    memory, encoded = model.encode(_ids(rng, (2, 5), 9))
    with pytest.raises(ValueError, match=r"^dmemory must have the shape .* \(2, 5, 8\); got "
                                         r"\(2, 4, 8\)"):
        model.encode_backward(rng.normal(size=(2, 4, 8)), encoded)
    logits, decoded = model.decode(_ids(rng, (2, 3), 10), memory)
    with pytest.raises(ValueError, match=r"^dlogits must have the shape of Decode's output "
                                         r"\(2, 3, 10\); got \(6, 10\)"):
        model.decode_backward(rng.normal(size=(6, 10)), decoded)
    with pytest.raises(TypeError, match=r"^cache must be the DecodeCache .* got a EncodeCache"):
        model.decode_backward(rng.normal(size=logits.shape), encoded)


# -- KV caches -----------------------------------------------------------------------------------
def _past(name):
    """(the `present` of a first call over 3 positions, a call of 1 new position that takes
    past_kv)."""
    rng = np.random.default_rng(2)
    if name == "GPT":
        model = GPT(GPT_SMALL)
        present = model.forward(_ids(rng, (2, 3), 11))[1].present
        return present, lambda past: model.forward(_ids(rng, (2, 1), 11), past_kv=past)
    if name == "Llama":
        model = Llama(LLAMA_SMALL)
        present = model.forward(_ids(rng, (2, 3), 11))[1].present
        return present, lambda past: model.forward(_ids(rng, (2, 1), 11), past_kv=past)
    model = Seq2Seq(SEQ2SEQ_SMALL)
    memory, _ = model.encode(_ids(rng, (2, 4), 9))
    present = model.decode(_ids(rng, (2, 3), 10), memory)[1].present
    return present, lambda past: model.decode(_ids(rng, (2, 1), 10), memory, past_kv=past)


@FEW
@given(st.sampled_from(["GPT", "Llama", "Seq2Seq.decode"]), st.integers(0, 1),
       st.sampled_from(["k", "v"]), st.sampled_from([0, 1, 2, 3]), st.sampled_from([-1, 1]))
def test_past_kv_of_the_wrong_batch_heads_length_or_width_is_refused(name, layer, part, axis,
                                                                     delta):
    present, call = _past(name)
    pair = list(present[layer])
    index = "kv".index(part)
    shape = list(pair[index].shape)
    shape[axis] += delta
    if shape[axis] == 0 or (axis == 2 and layer == 0 and part == "k"):
        return      # the first k sets P; a P of 0 or one shorter in every array is valid
    pair[index] = np.zeros(shape)
    past = list(present)
    past[layer] = tuple(pair)
    with pytest.raises(ValueError, match=rf"^past_kv\[{layer}\] must be \(k, v\), each of "
                                         r"shape \(B, [HG], P, d\) = "):
        call(past)


@pytest.mark.parametrize("name", ["GPT", "Llama", "Seq2Seq.decode"])
def test_past_kv_of_another_dtype_count_or_kind_is_refused(name):
    present, call = _past(name)
    with pytest.raises(TypeError, match=r"^past_kv\[1\]\.k must have the model's dtype float64"):
        call([present[0], tuple(a.astype(np.float32) for a in present[1])])
    with pytest.raises(ValueError, match=r"^past_kv must hold one \(k, v\) per layer \(2\); "
                                         r"got 1"):
        call(present[:1])
    with pytest.raises(TypeError, match=r"^past_kv\[0\] must be a pair \(k, v\)"):
        call([present[0][0], present[1]])
    with pytest.raises(TypeError, match="^past_kv must be a list with one"):
        call(present[0][0])


def test_gpt_counts_cached_positions_against_max_context():
    model = GPT(GPT_SMALL)
    present = model.forward(np.zeros((1, 5), dtype=np.int64))[1].present
    with pytest.raises(ValueError, match="ids has 2 positions after 5 cached ones, more than "
                                         "max_context = 6"):
        model.forward(np.zeros((1, 2), dtype=np.int64), past_kv=present)


# -- T = 0 -----------------------------------------------------------------------------------------
T0_CASES = {      # (model, inputs with T = 0 new positions, the logits' last axis)
    "GPT": lambda rng, dtype: (GPT(GPT_SMALL, dtype=dtype), (np.zeros((2, 0), dtype=np.int64),),
                               11),
    "Llama": lambda rng, dtype: (Llama(LLAMA_SMALL, dtype=dtype),
                                 (np.zeros((2, 0), dtype=np.int64),), 11),
    "Bert": lambda rng, dtype: (Bert(BERT_SMALL, dtype=dtype),
                                (np.zeros((2, 0), dtype=np.int64),), 11),
    "Seq2Seq": lambda rng, dtype: (Seq2Seq(SEQ2SEQ_SMALL, dtype=dtype),
                                   (_ids(rng, (2, 3), 9), np.zeros((2, 0), dtype=np.int64)), 10),
    "Transformer": lambda rng, dtype: (Transformer(8, 2, 1, 1, 12, 0.0, dtype=dtype),
                                       (rng.normal(size=(2, 3, 8)).astype(dtype),
                                        np.zeros((2, 0, 8), dtype)), 8),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(T0_CASES))
def test_no_positions_give_empty_logits_and_zero_gradients(name, dtype):
    """SPEC §8: T = 0 is defined, not refused: (B, 0) ids give (B, 0, V) logits, and their
    (empty) gradient leaves every parameter gradient zero."""
    rng = np.random.default_rng(3)
    model, inputs, width = T0_CASES[name](rng, dtype)
    out, cache = model.forward(*inputs)
    assert out.shape == (2, 0, width) and out.dtype == dtype
    model.zero_grad()
    model.backward(np.zeros(out.shape, dtype), cache)
    for name, p in model.named_parameters():
        assert p.grad.dtype == dtype and p.grad.shape == p.shape and not p.grad.any(), name


def test_an_empty_source_is_a_memory_nothing_attends_to():
    """S = 0: the cross-attention of every target position sees no key, which is the rule of a
    fully masked row (a zero attention output), so the logits are those of the same model
    whose source is entirely padding."""
    rng = np.random.default_rng(4)
    model = Transformer(8, 2, 1, 1, 12, 0.0)
    tgt = rng.normal(size=(2, 3, 8))
    empty, _ = model.forward(np.zeros((2, 0, 8)), tgt)
    padded, _ = model.forward(rng.normal(size=(2, 2, 8)), tgt,
                              memory_key_padding_mask=np.ones((2, 2), dtype=bool))
    np.testing.assert_allclose(empty, padded, rtol=1e-12, atol=1e-12)
    assert np.isfinite(empty).all()


@pytest.mark.parametrize("name", ["GPT", "Llama", "Seq2Seq.decode"])
def test_no_new_positions_after_a_kv_cache_give_empty_logits(name):
    rng = np.random.default_rng(5)
    empty = np.zeros((2, 0), dtype=np.int64)
    if name == "Seq2Seq.decode":
        model = Seq2Seq(SEQ2SEQ_SMALL)
        memory, _ = model.encode(_ids(rng, (2, 3), 9))
        _, first = model.decode(_ids(rng, (2, 2), 10), memory)
        logits, cache = model.decode(empty, None, past_kv=first.present,
                                     static_kv=first.cross_kv)
        width, backward = 10, model.decode_backward
    else:
        model = GPT(GPT_SMALL) if name == "GPT" else Llama(LLAMA_SMALL)
        _, first = model.forward(_ids(rng, (2, 3), 11))
        logits, cache = model.forward(empty, past_kv=first.present)
        width, backward = 11, model.backward
    assert logits.shape == (2, 0, width)
    assert all(np.array_equal(a.k, b.k) and np.array_equal(a.v, b.v)
               for a, b in zip(cache.present, first.present))
    model.zero_grad()
    backward(np.zeros(logits.shape), cache)
    assert not any(p.grad.any() for p in model.parameters())


# -- sampling ------------------------------------------------------------------------------------
@FEW
@given(st.integers(1, 3), st.integers(2, 6), st.sampled_from([math.nan, math.inf]),
       st.sampled_from([0.0, 0.7, 1.0]), st.data())
def test_sampling_refuses_nan_and_plus_inf_logits_by_name(batch, vocab, bad, temperature,
                                                          data):
    rng = np.random.default_rng(batch * vocab)
    logits = rng.normal(size=(batch, vocab))
    row = data.draw(st.integers(0, batch - 1))
    column = data.draw(st.integers(0, vocab - 1))
    logits[row, column] = bad
    what = "NaN" if bad != bad else r"\+inf"
    with pytest.raises(ValueError, match=rf"^logits must be finite .*; got {what} at position "
                                         rf"\({row}, {column}\)"):
        sample_next(logits, rng, temperature)


@FEW
@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from([0.0, 0.7]), st.data())
def test_sampling_refuses_a_row_of_minus_inf_and_never_draws_a_blocked_token(batch, vocab,
                                                                            temperature, data):
    rng = np.random.default_rng(batch + 7 * vocab)
    logits = rng.normal(size=(batch, vocab))
    blocked = np.array([data.draw(st.booleans()) for _ in range(batch * vocab)]).reshape(
        batch, vocab)
    blocked[:, 0] = False                                       # one token left in every row
    logits[blocked] = -np.inf
    for _ in range(5):
        tokens = sample_next(logits, rng, temperature)
        assert not blocked[np.arange(batch), tokens].any()
    logits[data.draw(st.integers(0, batch - 1))] = -np.inf
    with pytest.raises(ValueError, match=r"^logits must be finite .*-inf in every entry of a "
                                         r"row"):
        sample_next(logits, rng, temperature)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, np.float32(1e-45)])
def test_a_tiny_temperature_is_greedy_not_nan(temperature):
    logits = np.array([[3.0, 1e300, -np.inf, 2.0], [-1e300, 0.0, 1.0, 0.5]])
    probs = sampling_probabilities(logits, temperature)
    np.testing.assert_array_equal(probs, [[0, 1, 0, 0], [0, 0, 1, 0]])
    assert np.array_equal(sample_next(logits, np.random.default_rng(0), temperature), [1, 2])


def test_sampling_takes_numpy_scalars_and_refuses_what_is_not_a_setting():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.3, 0.2]]))
    probs = sampling_probabilities(logits, np.float32(0.5), np.int64(2), np.float32(0.8))
    expected = sampling_probabilities(logits, 0.5, 2, float(np.float32(0.8)))
    np.testing.assert_array_equal(probs, expected)
    assert probs[0, 2] == 0.0 and probs[0, 0] > probs[0, 1] > 0
    sample_next(logits, rng, np.float64(0.7), top_p=np.float16(0.9))
    for kwargs, message in [({"temperature": math.inf}, "temperature must be a number >= 0"),
                            ({"temperature": True}, "temperature must be a number >= 0"),
                            ({"top_p": math.nan}, r"top_p must be in \(0, 1\]"),
                            ({"top_k": 2.0}, "top_k must be an integer >= 1")]:
        with pytest.raises(ValueError, match=message):
            sample_next(logits, rng, **kwargs)
    with pytest.raises(ValueError, match=r"^logits must hold at least one token"):
        sample_next(np.zeros((1, 0)), rng)


def test_generation_checks_its_token_ids():
    model = GPT(GPT_SMALL)
    prompt = np.zeros((1, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"^eos_id must be None or in \[0, 11\)"):
        generate(model, prompt, 2, temperature=0.0, eos_id=11)
    with pytest.raises(ValueError, match=r"^eos_id must be None or in \[0, 11\)"):
        generate(model, prompt, 2, temperature=0.0, eos_id=1.0)
    seq2seq = Seq2Seq(SEQ2SEQ_SMALL)
    with pytest.raises(ValueError, match=r"^bos_id must be None or in \[0, 10\)"):
        generate_seq2seq(seq2seq, np.zeros((1, 3), dtype=np.int64), 2, 10)
    with pytest.raises(ValueError, match="^bos_id must be the token id"):
        generate_seq2seq(seq2seq, np.zeros((1, 3), dtype=np.int64), 2, None)


# -- data loss: training that stops, saves that are killed ----------------------------------
STREAM = np.random.default_rng(0).integers(0, 11, 300)


def _batch(rng):
    starts = rng.integers(0, len(STREAM) - 7, 3)
    windows = np.stack([STREAM[s:s + 7] for s in starts])
    return windows[:, :-1], windows[:, 1:]


def _trainer(dtype=np.float64, **kwargs):
    run = TrainSettings(steps=8, batch_size=3, lr=1e-2, min_lr=1e-3, warmup=2, eval_every=4,
                        log_every=4, **kwargs.pop("settings", {}))
    return Trainer(TargetLoss(GPT(GPT_SMALL, rng=3, dtype=dtype)), _batch, run, **kwargs)


def test_an_absurd_learning_rate_stops_before_saving_garbage(tmp_path):
    """A checkpoint every step and, after two good steps, a learning rate of 1e39 (finite,
    but the float32 update overflows): the weights that overflow are never saved, the message
    names the last good checkpoint, which is intact, and the model is put back to the
    weights before the failing step."""
    path = tmp_path / "c.npz"
    trainer = _trainer(np.float32, checkpoint_path=path, settings={"checkpoint_every": 1})
    trainer.run(2, log=lambda line: None)
    good = path.read_bytes()
    weights = {name: value.copy() for name, value in trainer.model.state_dict().items()}
    trainer.settings.lr = trainer.settings.min_lr = 1e39
    with pytest.raises(TrainingStopped, match=r"step 3: the updated weights of .* are not "
                                              r"finite .*the last good checkpoint, .*c.npz "
                                              r"\(step 2\), is intact"):
        trainer.run(8, log=lambda line: None)
    assert path.read_bytes() == good and not stale_temporaries(path)
    assert trainer.step == 2 and trainer.last_checkpoint_step == 2
    for name, value in trainer.model.state_dict().items():
        assert value.tobytes() == weights[name].tobytes(), name
    checkpoint = load_checkpoint(path)
    assert checkpoint.step == 2
    assert all(np.isfinite(v).all() for v in checkpoint.model.state_dict().values())


def test_save_refuses_non_finite_weights_and_never_calls_them_good(tmp_path):
    trainer = _trainer(checkpoint_path=tmp_path / "c.npz")
    trainer.model.tokens.weight.data[1, 2] = np.inf
    with pytest.raises(TrainingStopped, match=r"the weights of tokens.weight are not finite, "
                                              r"so they are not saved; training stopped and "
                                              r"no checkpoint was written"):
        trainer.save()
    assert trainer.last_checkpoint_step is None and not (tmp_path / "c.npz").exists()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, MemoryError, OSError])
def test_an_interrupted_save_leaves_the_previous_checkpoint_and_no_temporary(tmp_path,
                                                                             monkeypatch,
                                                                             interrupt):
    path = tmp_path / "c.npz"
    trainer = _trainer(checkpoint_path=path)
    trainer.run(2, log=lambda line: None)
    good = path.read_bytes()
    trainer.train_step()                                        # weights that differ
    writes = []
    original = np.lib.format.write_array

    def write_then_stop(*args, **kwargs):
        writes.append(1)
        if len(writes) == 4:
            raise interrupt("stopped in the middle of a save")
        return original(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", write_then_stop)
    with pytest.raises(interrupt):
        trainer.save()
    assert len(writes) == 4                                     # it did stop mid-write
    assert path.read_bytes() == good and list(tmp_path.iterdir()) == [path]
    assert trainer.last_checkpoint_step == 2


def test_a_killed_save_leaves_a_temporary_that_the_next_save_removes(tmp_path):
    """SIGKILL in the middle of a save (nothing can clean up then): the previous checkpoint is
    intact, the temporary stays, and the next save to the path removes it."""
    path = tmp_path / "c.npz"
    trainer = _trainer(checkpoint_path=path)
    trainer.run(1, log=lambda line: None)
    good = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        sys.path.insert(0, {os.getcwd()!r})
        from numpy_tf.training.checkpoint import save_checkpoint
        from numpy_tf.models.gpt import GPT, GPTConfig
        original, writes = np.lib.format.write_array, []
        def write_then_die(*args, **kwargs):
            writes.append(1)
            if len(writes) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        np.lib.format.write_array = write_then_die
        save_checkpoint({str(path)!r}, GPT(GPTConfig(vocab_size=11, max_context=6, width=8,
                                                     heads=2, layers=1)), step=9)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    left = stale_temporaries(path)
    assert len(left) == 1 and path.read_bytes() == good
    trainer.save()
    assert not stale_temporaries(path) and sorted(tmp_path.iterdir()) == [path]
    assert load_checkpoint(path).step == 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_resumed_run_has_the_same_losses_and_history_bit_for_bit(tmp_path, dtype):
    straight = _trainer(dtype)
    straight.run(log=lambda line: None)
    first = _trainer(dtype, checkpoint_path=tmp_path / "c.npz")
    first.run(3, log=lambda line: None)
    resumed = Trainer.resume(load_checkpoint(tmp_path / "c.npz"), TargetLoss, _batch,
                             checkpoint_path=tmp_path / "c.npz")
    resumed.run(log=lambda line: None)
    whole = resumed.earlier_history + resumed.history
    assert [r["step"] for r in whole] == list(range(1, 9))
    for a, b in zip(straight.history, whole):
        assert {k: v for k, v in a.items() if k != "seconds"} == \
            {k: v for k, v in b.items() if k != "seconds"}
    assert resumed.extra_meta == first.extra_meta
    for (name, a), b in zip(straight.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert a.tobytes() == b.tobytes(), name


def test_a_checkpoint_of_non_finite_weights_is_not_resumed(tmp_path):
    trainer = _trainer(checkpoint_path=tmp_path / "c.npz")
    trainer.run(1, log=lambda line: None)
    trainer.model.final_norm.weight.data[0] = np.nan
    save_checkpoint(tmp_path / "bad.npz", trainer.model, trainer.optimizer, 1,
                    trainer.rng, {"settings": load_checkpoint(tmp_path / "c.npz").meta[
                        "settings"]})
    # the loader itself refuses it (a FileFormatError, a ValueError), so resume never starts
    with pytest.raises(ValueError, match=r"bad.npz: parameter final_norm.weight holds 1 "
                                         r"non-finite values"):
        Trainer.resume(load_checkpoint(tmp_path / "bad.npz"), TargetLoss, _batch)


def test_the_validation_helpers_name_what_they_check():
    with pytest.raises(ValueError, match=r"^x must be a finite number in \[0, inf\); got inf"):
        validate.number("x", math.inf, low=0.0)
    assert validate.number("x", math.inf, finite=False) == math.inf
    with pytest.raises(ValueError, match=r"^pad must be None or in \[0, 3\)"):
        validate.optional_index("pad", np.int64(3), 3)
    assert validate.optional_index("pad", np.int64(2), 3) == 2
