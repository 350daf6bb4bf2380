"""Generation: the KV cache equals a full recompute, and sampling does what it says."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf.generation import generate, sample_next, sampling_probabilities
from numpy_tf.models.gpt import GPT, GPTConfig


def _model(**changes):
    config = GPTConfig.gpt2(vocab_size=30, max_context=16, width=16, heads=4, layers=2,
                            init_std=0.3, **changes)
    return GPT(config, rng=1)


@given(prompt=st.integers(1, 6), steps=st.lists(st.integers(1, 3), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_cached_decoding_logits_equal_a_full_forward(prompt, steps, seed):
    model = _model()
    total = prompt + sum(steps)
    ids = np.random.default_rng(seed).integers(0, 30, (2, total))
    full, _ = model.forward(ids)
    logits, cache = model.forward(ids[:, :prompt])
    pieces, start = [logits], prompt
    for size in steps:
        logits, cache = model.forward(ids[:, start:start + size], past_kv=cache.present)
        pieces.append(logits)
        start += size
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-12, atol=1e-12)


def test_generate_with_and_without_the_cache_agree():
    model = _model()
    prompt = np.array([[3, 1, 4], [1, 5, 9]])
    greedy = generate(model, prompt, 8, temperature=0)
    assert np.array_equal(greedy, generate(model, prompt, 8, temperature=0, use_cache=False))
    a = generate(model, prompt, 8, rng=np.random.default_rng(5), temperature=1.0)
    b = generate(model, prompt, 8, rng=np.random.default_rng(5), temperature=1.0,
                 use_cache=False)
    assert np.array_equal(a, b) and a.shape == (2, 11)
    np.testing.assert_array_equal(a[:, :3], prompt)


def test_greedy_is_argmax_of_the_full_forward():
    model = _model()
    tokens = generate(model, np.array([[7]]), 5, temperature=0)
    for t in range(1, 6):
        logits, _ = model.forward(tokens[:, :t])
        assert tokens[0, t] == logits[0, -1].argmax()


def test_eos_stops_and_pads():
    model = _model()
    prompt = np.array([[2, 2]])
    first = generate(model, prompt, 1, temperature=0)[0, -1]
    out = generate(model, prompt, 6, temperature=0, eos_id=int(first))
    assert out.shape == (1, 3) and out[0, -1] == first


def test_top_k_and_top_p_sets():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    np.testing.assert_allclose(sampling_probabilities(logits, top_k=2), [[0.625, 0.375, 0, 0]])
    # the smallest set whose probability reaches p: 0.5 < 0.75 <= 0.5 + 0.3
    np.testing.assert_allclose(sampling_probabilities(logits, top_p=0.75), [[0.625, 0.375, 0, 0]])
    np.testing.assert_allclose(sampling_probabilities(logits, top_p=0.85),
                               [[0.5, 0.3, 0.15, 0]] / np.float64(0.95))
    # a tiny p keeps the most probable token: never an empty set
    np.testing.assert_allclose(sampling_probabilities(logits, top_p=1e-9), [[1, 0, 0, 0]])
    np.testing.assert_allclose(sampling_probabilities(logits, temperature=0), [[1, 0, 0, 0]])
    hot = sampling_probabilities(logits, temperature=2.0)
    np.testing.assert_allclose(hot, np.sqrt([[0.5, 0.3, 0.15, 0.05]]) /
                               np.sqrt([0.5, 0.3, 0.15, 0.05]).sum())


def test_sampling_frequencies_follow_the_probabilities():
    logits = np.log(np.tile([[0.1, 0.6, 0.3]], (20000, 1)))
    draws = sample_next(logits, np.random.default_rng(0))
    frequencies = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(frequencies, [0.1, 0.6, 0.3], atol=0.01)
    assert np.array_equal(draws, sample_next(logits, np.random.default_rng(0)))
    top = sample_next(logits[:100], np.random.default_rng(1), top_k=1)
    assert (top == 1).all()


def test_bad_settings():
    logits = np.zeros((1, 4))
    for kwargs, message in [({"temperature": -1.0}, "temperature must be a number >= 0"),
                            ({"top_k": 0}, "top_k must be an integer >= 1"),
                            ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
                            ({"top_p": 1.5}, r"top_p must be in \(0, 1\]")]:
        with pytest.raises(ValueError, match=message):
            sample_next(logits, np.random.default_rng(0), **kwargs)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        sample_next(logits, None, temperature=1.0)
    model = _model()
    with pytest.raises(ValueError, match="prompt has 17 tokens, more than the model's "
                                         "max_context = 16"):
        generate(model, np.zeros((1, 17), dtype=np.int64), 1, temperature=0)
    with pytest.raises(ValueError, match="ask for at most 6 tokens"):
        generate(model, np.zeros((1, 10), dtype=np.int64), 7, temperature=0)
    assert generate(model, np.zeros((1, 10), dtype=np.int64), 9, temperature=0,
                    slide=True).shape == (1, 19)


def test_a_model_that_is_none_and_a_prompt_out_of_the_vocabulary_are_refused_by_name():
    """They were an AttributeError ('NoneType' object has no attribute 'forward') and the
    model's 'ids must be integers in ...', which names an argument generate was not given."""
    from numpy_tf import generate_seq2seq

    prompt = np.zeros((1, 2), dtype=np.int64)
    with pytest.raises(TypeError, match="model must be a numpy_tf model .*got NoneType"):
        generate(None, prompt, 2, temperature=0)
    model = _model()
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"prompt must be integers in \[0, {vocab}\); got "
                                         rf"{vocab} at position \(0, 1\)"):
        generate(model, np.array([[0, vocab]]), 2, temperature=0)
    with pytest.raises(TypeError, match="model must be an encoder-decoder .*got GPT"):
        generate_seq2seq(model, prompt, 2, 1)


def test_llama_cached_generation_equals_recompute():
    from numpy_tf import Llama, LlamaConfig
    model = Llama(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=24,
                              num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, initializer_range=0.3), rng=2)
    prompt = np.array([[3, 1, 4, 1], [5, 9, 2, 6]])
    cached = generate(model, prompt, 6, rng=np.random.default_rng(3), temperature=1.0)
    again = generate(model, prompt, 6, rng=np.random.default_rng(3), temperature=1.0,
                     use_cache=False)
    assert np.array_equal(cached, again)


def test_seq2seq_cached_decoding_equals_the_full_decoder():
    from numpy_tf import Seq2Seq, Seq2SeqConfig
    from numpy_tf.generation.decoding import generate_seq2seq
    model = Seq2Seq(Seq2SeqConfig(src_vocab_size=13, tgt_vocab_size=13, d_model=16, nhead=2,
                                  num_encoder_layers=2, num_decoder_layers=2,
                                  dim_feedforward=32, dropout=0.0), rng=4)
    rng = np.random.default_rng(5)
    source = rng.integers(0, 10, (3, 6))
    padding = np.zeros((3, 6), dtype=bool)
    padding[1, 4:] = True
    tokens = generate_seq2seq(model, source, 7, 11, src_key_padding_mask=padding,
                              rng=np.random.default_rng(6), temperature=1.0)
    assert np.array_equal(tokens, generate_seq2seq(
        model, source, 7, 11, src_key_padding_mask=padding, rng=np.random.default_rng(6),
        temperature=1.0, use_cache=False))
    memory, _ = model.encode(source, padding)
    full, _ = model.decode(tokens[:, :-1], memory, padding)
    past = static = None
    steps = []
    for t in range(tokens.shape[1] - 1):
        logits, cache = model.decode(tokens[:, t:t + 1], None if static else memory, padding,
                                     past_kv=past, static_kv=static)
        past, static = cache.present, cache.cross_kv
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)


def test_the_encoder_decoder_learns_to_reverse_digits():
    """End to end proof of the encoder-decoder's backward: 600 steps of AdamW reach (nearly)
    perfect exact-match accuracy on held-out strings."""
    from numpy_tf import Seq2SeqConfig
    from numpy_tf.text.datasets import DIGIT_VOCAB_SIZE
    from numpy_tf.training.tasks import exact_match, reverse_digits_trainer
    from numpy_tf.training.trainer import TrainSettings
    config = Seq2SeqConfig(src_vocab_size=DIGIT_VOCAB_SIZE, tgt_vocab_size=DIGIT_VOCAB_SIZE,
                           d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                           dim_feedforward=64, dropout=0.0, norm_first=True)
    settings = TrainSettings(steps=600, batch_size=32, lr=3e-3, min_lr=3e-4, warmup=50,
                             weight_decay=0.0, eval_every=0, log_every=600)
    trainer = reverse_digits_trainer(config, settings, max_length=6, eval_count=100,
                                     dtype=np.float32)
    trainer.run(log=lambda line: None)
    assert exact_match(trainer.model, trainer.held_out) >= 0.9
