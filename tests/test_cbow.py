"""CBOW: the averaging step's gradient, the model against torch, order-free contexts, the epoch
loss as a mean over every example, training, nearest neighbours, the vocabulary, saving."""
import numpy as np
import pytest
from contract import assert_fixture_agrees, check_contract
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import cross_entropy, gradcheck, gradcheck_module
from numpy_tf.models.cbow import CBOW, cbow_backward, cbow_forward, nearest
from numpy_tf.text.datasets import cbow_pairs
from numpy_tf.text.vocabulary import Vocabulary, words
from numpy_tf.training.cbow import load_cbow, save_cbow, train_cbow

REPETITIVE = " ".join(["the cat sat on the mat.", "the dog sat on the rug.",
                       "a cat ate the fish.", "a dog ate the bone."] * 10)


@given(count=st.integers(1, 4), window=st.integers(1, 3), vocab=st.integers(1, 6),
       dim=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_gradcheck_of_the_mean(count, window, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    inputs = {"contexts": rng.integers(0, vocab, (count, 2 * window)),
              "weight": rng.standard_normal((vocab, dim))}
    report = gradcheck(cbow_forward, cbow_backward, inputs, seed=seed)
    assert report.passed, str(report)


@given(count=st.integers(1, 4), window=st.integers(1, 3), vocab=st.integers(1, 6),
       dim=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_gradcheck_of_the_model(count, window, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    model = CBOW(vocab, dim, rng=rng)
    contexts = rng.integers(0, vocab, (count, 2 * window))
    report = gradcheck_module(model, contexts, seed=seed)      # full finite differences
    assert report.mode == "full" and report.passed, str(report)


def test_agrees_with_torch():
    assert_fixture_agrees("cbow")


def test_contract():
    contexts = np.array([[0, 3, 3, 1], [2, 2, 4, 0]])
    check_contract(lambda dtype: CBOW(5, 3, rng=1, dtype=dtype), (contexts,))


def test_repeated_context_ids_accumulate():
    weight = np.arange(12.0).reshape(4, 3)                       # row v = [3v, 3v + 1, 3v + 2]
    contexts = np.array([[2, 2, 2, 1], [1, 0, 0, 0]])
    mean, cache = cbow_forward(contexts, weight)
    np.testing.assert_array_equal(mean, [[5.25, 6.25, 7.25],      # (3 row 2 + row 1) / 4
                                         [0.75, 1.75, 2.75]])     # (row 1 + 3 row 0) / 4
    dmean = np.array([[4.0, 8.0, -4.0], [2.0, -6.0, 10.0]])
    dweight = cbow_backward(dmean, cache)
    np.testing.assert_array_equal(dweight[2], [3.0, 6.0, -3.0])             # 3 x dmean_0 / 4
    np.testing.assert_array_equal(dweight[1], [1.0 + 0.5, 2.0 - 1.5, -1.0 + 2.5])
    np.testing.assert_array_equal(dweight[0], [1.5, -4.5, 7.5])             # 3 x dmean_1 / 4
    np.testing.assert_array_equal(dweight[3], 0.0)


def test_swapping_context_positions_leaves_the_prediction_unchanged():
    rng = np.random.default_rng(3)
    model = CBOW(11, 6, rng=rng)
    # a + b == b + a exactly: with one word each side, swapping them changes no bit
    contexts = rng.integers(0, 11, (5, 2))
    np.testing.assert_array_equal(model.forward(contexts)[0], model.forward(contexts[:, ::-1])[0])
    # with more words the sum's rounding depends on the order; embeddings on a grid of 1/8
    # make every partial sum exact, so any permutation must give the same logits, bit for bit
    model.embeddings.weight.data[...] = rng.integers(-16, 16, (11, 6)) / 8.0
    contexts = rng.integers(0, 11, (5, 6))
    logits = model.forward(contexts)[0]
    for order in ([5, 4, 3, 2, 1, 0], [3, 4, 5, 0, 1, 2], [1, 0, 2, 3, 5, 4]):
        np.testing.assert_array_equal(model.forward(contexts[:, order])[0], logits)
    # and a different bag of words does change it (the test can fail)
    changed = contexts.copy()
    changed[:, 0] = (changed[:, 0] + 1) % 11
    assert not np.array_equal(model.forward(changed)[0], logits)


@given(batch_size=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_epoch_loss_is_the_mean_over_every_example(batch_size, seed):
    """lr = 0 keeps the initial weights, so the recorded loss must equal one cross-entropy over
    all pairs at once, whatever the batches (23 pairs: the last batch is usually smaller)."""
    ids = np.random.default_rng(seed).integers(0, 7, 27)
    trained = train_cbow(ids, window=2, dim=3, epochs=2, batch_size=batch_size, lr=0.0,
                         rng=np.random.default_rng(seed))
    pairs = cbow_pairs(ids, 2)
    assert len(pairs.centres) == 23
    expected, _ = cross_entropy(trained.model.forward(pairs.contexts)[0], pairs.centres)
    np.testing.assert_allclose(trained.losses, float(expected), rtol=1e-13)


def test_epoch_loss_differs_from_the_mean_of_batch_means():
    """The two averages really differ here, so the test above can tell them apart."""
    ids = np.random.default_rng(5).integers(0, 7, 27)
    trained = train_cbow(ids, window=2, dim=3, epochs=1, batch_size=10, lr=0.0,
                         rng=np.random.default_rng(5))
    pairs = cbow_pairs(ids, 2)
    logits = trained.model.forward(pairs.contexts)[0]
    batch_means = [float(cross_entropy(logits[i:i + 10], pairs.centres[i:i + 10])[0])
                   for i in (0, 10, 20)]                           # 10, 10, 3 pairs
    weighted = sum(m * n for m, n in zip(batch_means, (10, 10, 3))) / 23
    np.testing.assert_allclose(trained.losses[0], weighted, rtol=1e-13)
    assert abs(np.mean(batch_means) - weighted) > 1e-3


def test_too_short_a_text_is_an_error_before_any_work():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    with pytest.raises(ValueError, match=r"no CBOW pairs: window 2 needs at least .* = 5 tokens"):
        train_cbow("only four words here", window=2, rng=rng)
    assert rng.bit_generator.state == state                      # no weight was drawn
    with pytest.raises(ValueError, match="no CBOW pairs"):
        train_cbow([], window=1, rng=rng)


def test_training_reduces_the_loss_and_neighbours_exclude_the_word():
    trained = train_cbow(REPETITIVE, window=2, dim=8, epochs=40, batch_size=8, lr=0.02,
                         rng=np.random.default_rng(0))
    assert trained.losses[-1] < 0.25 * trained.losses[0], trained.losses
    vocabulary = trained.vocabulary
    assert vocabulary.tokens == ("the", "cat", "sat", "on", "mat", "dog", "rug", "a", "ate",
                                 "fish", "bone")
    for word in vocabulary.tokens:
        neighbours = nearest(trained.model, vocabulary, word, k=len(vocabulary) - 1)
        assert word not in [w for w, _ in neighbours]
        assert len(neighbours) == len(vocabulary) - 1
        similarities = [s for _, s in neighbours]
        assert similarities == sorted(similarities, reverse=True)
        assert all(-1.0 - 1e-12 <= s <= 1.0 + 1e-12 for s in similarities)


def test_nearest_is_cosine_similarity():
    model = CBOW(4, 2, rng=0)
    model.embeddings.weight.data[...] = [[1.0, 0.0], [10.0, 0.1], [0.0, -3.0], [-1.0, 1.0]]
    vocabulary = Vocabulary(["a", "b", "c", "d"])
    result = nearest(model, vocabulary, "a", k=3)
    assert [w for w, _ in result] == ["b", "c", "d"]
    np.testing.assert_allclose([s for _, s in result],
                               [10.0 / np.hypot(10.0, 0.1), 0.0, -1.0 / np.sqrt(2.0)])


def test_unknown_words_and_bad_arguments_are_clear_errors():
    trained = train_cbow(REPETITIVE, window=1, dim=4, epochs=1, rng=np.random.default_rng(0))
    model, vocabulary = trained.model, trained.vocabulary
    with pytest.raises(ValueError, match="word 'horse' is not in the vocabulary"):
        nearest(model, vocabulary, "horse")
    with pytest.raises(ValueError, match="k must be at most 10"):
        nearest(model, vocabulary, "cat", k=11)
    with pytest.raises(ValueError, match="vocabulary has 3 words but"):
        nearest(model, Vocabulary(["a", "b", "c"]), "a")
    with pytest.raises(ValueError, match="word 'horse' at position 2 is not in the vocabulary"):
        train_cbow("the cat horse sat on", window=1, rng=np.random.default_rng(0),
                   vocabulary=vocabulary)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        train_cbow(REPETITIVE, rng=0)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        train_cbow(REPETITIVE)
    with pytest.raises(TypeError, match="not one string"):
        Vocabulary("cat")
    with pytest.raises(ValueError, match="contexts must have 2 dimensions"):
        model.forward(np.array([1, 2]))
    with pytest.raises(TypeError, match="contexts must be integers"):
        model.forward(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 11\); got 11"):
        model.forward(np.array([[0, 11]]))


def test_vocabulary_ids_follow_first_occurrence():
    assert words("The cat, the CAT; don't stop!") == ["the", "cat", "the", "cat", "don't",
                                                        "stop"]
    vocabulary = Vocabulary.build(words("b a b c a"))
    assert vocabulary.tokens == ("b", "a", "c") and vocabulary.id("c") == 2
    np.testing.assert_array_equal(vocabulary.encode(["a", "a", "b"]), [1, 1, 0])
    with pytest.raises(ValueError, match="tokens must be distinct; 'x' appears 2 times"):
        Vocabulary(["x", "y", "x"])


def test_training_on_ids_and_float32():
    ids = np.tile(np.arange(5), 8)
    trained = train_cbow(ids, window=1, dim=4, epochs=3, batch_size=7,
                         rng=np.random.default_rng(1), dtype=np.float32)
    assert trained.vocabulary is None and trained.model.vocab_size == 5
    assert all(p.dtype == np.float32 for p in trained.model.parameters())
    assert trained.losses.shape == (3,) and np.isfinite(trained.losses).all()


def test_save_and_load_keep_weights_and_vocabulary(tmp_path):
    trained = train_cbow(REPETITIVE, window=2, dim=4, epochs=2, rng=np.random.default_rng(2))
    path = tmp_path / "cbow.npz"
    save_cbow(path, trained.model, trained.vocabulary)
    model, vocabulary = load_cbow(path)
    assert vocabulary.tokens == trained.vocabulary.tokens
    for name, value in trained.model.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name], value)
    assert nearest(model, vocabulary, "cat") == nearest(trained.model, vocabulary, "cat")
    with pytest.raises(ValueError, match="not a CBOW file"):
        np.savez(tmp_path / "other.npz", x=np.zeros(2))
        load_cbow(tmp_path / "other.npz")


# -- sentences: windows stay inside each one ---------------------------------------------------
FIVE_SENTENCES = ["I like reading this book", "we play football after school",
                  "the cat sleeps all day", "she drinks green tea daily",
                  "sports keep people very healthy"]


def test_five_five_word_sentences_give_five_pairs_not_twenty_one():
    vocabulary = Vocabulary.build([w for s in FIVE_SENTENCES for w in words(s)])
    sentences = [vocabulary.encode(words(s)) for s in FIVE_SENTENCES]
    pairs = cbow_pairs(sentences, 2)
    assert len(pairs.centres) == 5
    assert len(cbow_pairs(np.concatenate(sentences), 2).centres) == 21      # one stream
    for sentence, context, centre in zip(sentences, pairs.contexts, pairs.centres):
        assert centre == sentence[2]                 # the middle word, with its own four
        assert list(context) == [sentence[0], sentence[1], sentence[3], sentence[4]]
    # lists of ids work as well as arrays; a sentence too short for a window gives nothing
    mixed = cbow_pairs([[1, 2, 3, 4, 5, 6], [7, 8], (9, 10, 11)], 1)
    assert mixed.contexts.tolist() == [[1, 3], [2, 4], [3, 5], [4, 6], [9, 11]]
    assert mixed.centres.tolist() == [2, 3, 4, 5, 10]


def test_train_cbow_on_sentences_uses_the_pairs_inside_each():
    trained = train_cbow(FIVE_SENTENCES, window=2, dim=3, epochs=2, batch_size=2, lr=0.0,
                         rng=np.random.default_rng(0))
    assert len(trained.vocabulary) == 25 and trained.vocabulary.tokens[:3] == ("i", "like",
                                                                               "reading")
    sentences = [trained.vocabulary.encode(words(s)) for s in FIVE_SENTENCES]
    pairs = cbow_pairs(sentences, 2)
    assert len(pairs.centres) == 5
    expected, _ = cross_entropy(trained.model.forward(pairs.contexts)[0], pairs.centres)
    np.testing.assert_allclose(trained.losses, float(expected), rtol=1e-13)   # lr = 0
    as_ids = train_cbow(sentences, window=2, dim=3, epochs=2, batch_size=2, lr=0.0,
                        rng=np.random.default_rng(0))
    np.testing.assert_array_equal(as_ids.losses, trained.losses)
    assert as_ids.model.vocab_size == 25 and as_ids.vocabulary is None


def test_bad_sentences_are_named():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="data sentences must be all texts or all id sequences; "
                                        r"got a mix \(sentence 1 differs"):
        train_cbow(["a b c d e", [1, 2, 3, 4, 5]], window=2, rng=rng)
    with pytest.raises(ValueError, match=r"data\[1\] must be integers in \[0, 3\); got 7"):
        train_cbow([[0, 1, 2], [2, 7, 1]], window=1, vocabulary=Vocabulary(["a", "b", "c"]),
                   rng=rng)
    with pytest.raises(ValueError, match="no CBOW pairs: window 3 needs at least"):
        train_cbow(FIVE_SENTENCES, window=3, rng=rng)    # 5 words each: no full window
    with pytest.raises(TypeError, match=r"ids\[0\] must be integers; got dtype float64"):
        cbow_pairs([np.zeros(5)], 1)
