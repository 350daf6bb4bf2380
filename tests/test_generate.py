"""Generation: the KV cache equals a full recompute, and sampling does what it says."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf.generate import generate, sample_next, sampling_probabilities
from numpy_tf.gpt import GPT, GPTConfig


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
