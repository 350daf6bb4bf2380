"""resize_token_embeddings(n) on every language model the registry lists: the old rows kept
exactly, the new rows drawn as the model draws them (from the rng given), the head resized with
the embedding, a tied head staying tied, the config updated, checkpoints keeping it."""
import numpy as np
import pytest

from numpy_tf import BPETokenizer, gradcheck_module
from numpy_tf.layers.embedding import normal_init
from numpy_tf.layers.linear import uniform_init
from numpy_tf.models import registry
from numpy_tf.models.bert import Bert, BertConfig
from numpy_tf.models.cbow import CBOW
from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from numpy_tf.models.gpt import GPT, GPTConfig
from numpy_tf.models.llama import Llama, LlamaConfig
from numpy_tf.models.objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint

V, N = 11, 14               # the vocabulary before and after

# name -> (model factory, the embedding's path, the head's path, the rule of the new rows)
LANGUAGE_MODELS = {
    "gpt": (lambda tied, dtype: GPT(GPTConfig(vocab_size=V, width=8, heads=2, layers=1,
                                              tied=tied), rng=1, dtype=dtype),
            "tokens", "output"),
    "llama": (lambda tied, dtype: Llama(LlamaConfig(vocab_size=V, hidden_size=8,
                                                    intermediate_size=12, num_hidden_layers=1,
                                                    num_attention_heads=2,
                                                    tie_word_embeddings=tied, pad_token_id=3),
                                        rng=1, dtype=dtype),
              "embed_tokens", "lm_head"),
    "bert": (lambda tied, dtype: Bert(BertConfig(vocab_size=V, hidden_size=8,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=12,
                                                 tie_word_embeddings=tied), rng=1, dtype=dtype),
             "embeddings.word_embeddings", "mlm_head.decoder"),
}
CASES = [(name, tied) for name in LANGUAGE_MODELS for tied in (False, True)]


def _get(model, path):
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _ids(seed, high, shape=(2, 5)):
    return np.random.default_rng(seed).integers(0, high, shape)


def test_every_registered_family_can_resize():
    for family in registry.FAMILIES.values():
        assert callable(getattr(family.model_class, "resize_token_embeddings", None)), \
            family.name


@pytest.mark.parametrize("name, tied", CASES)
def test_old_rows_kept_new_rows_drawn_as_the_model_draws_them(name, tied):
    make, embedding_path, head_path = LANGUAGE_MODELS[name]
    model = make(tied, np.float64)
    embedding, head = _get(model, embedding_path), _get(model, head_path)
    before_table, before_head = embedding.weight.data.copy(), head.weight.data.copy()
    bias_before = None if head.bias is None else head.bias.data.copy()
    ids = _ids(0, V)
    logits_before = model.forward(ids)[0]

    model.resize_token_embeddings(N, rng=np.random.default_rng(7))
    embedding, head = _get(model, embedding_path), _get(model, head_path)
    assert embedding.weight.shape == head.weight.shape == (N, 8) and head.out_features == N
    assert model.config.vocab_size == N
    np.testing.assert_array_equal(embedding.weight.data[:V], before_table)
    np.testing.assert_array_equal(head.weight.data[:V], before_head)
    std = model.config.init_std if name == "gpt" else model.config.initializer_range
    expected = np.random.default_rng(7)                 # the embedding's rows first, then the head's
    np.testing.assert_array_equal(embedding.weight.data[V:],
                                  normal_init(expected, (N - V, 8), std, np.float64))
    if tied:
        assert head.weight is embedding.weight
        assert model.state_dict()[f"{head_path}.weight"] is embedding.weight.data
    else:
        np.testing.assert_array_equal(head.weight.data[V:],
                                      normal_init(expected, (N - V, 8), std, np.float64))
    if bias_before is not None:                         # BERT's decoder bias: zeros, as HF's
        np.testing.assert_array_equal(head.bias.data, np.concatenate([bias_before,
                                                                      np.zeros(N - V)]))
    logits = model.forward(ids)[0]
    assert logits.shape[-1] == N
    np.testing.assert_allclose(logits[..., :V], logits_before, rtol=1e-13, atol=1e-15)
    model.forward(_ids(1, N))                           # the new ids are accepted


@pytest.mark.parametrize("name, tied", CASES)
def test_the_resized_model_passes_a_gradient_check(name, tied):
    model = LANGUAGE_MODELS[name][0](tied, np.float64)
    model.resize_token_embeddings(N, rng=np.random.default_rng(2))
    ids = _ids(3, N, (2, 4))
    ids[0, 1] = N - 1                                   # a new token in the input
    if name == "bert":
        labels = np.full(ids.shape, -100)
        labels[:, 2] = [N - 2, 1]
        report = gradcheck_module(MaskedLMLoss(model), ids, labels)
    else:
        report = gradcheck_module(NextTokenLoss(model), ids)
    assert report.passed, str(report)


@pytest.mark.parametrize("name, tied", CASES)
def test_checkpoints_record_the_new_size(name, tied, tmp_path):
    model = LANGUAGE_MODELS[name][0](tied, np.float32)
    model.resize_token_embeddings(N, rng=np.random.default_rng(4))
    save_checkpoint(tmp_path / "c.npz", model)
    loaded = load_checkpoint(tmp_path / "c.npz").model
    assert loaded.config == model.config and loaded.config.vocab_size == N
    ids = _ids(5, N)
    out, loaded_out = model.forward(ids)[0], loaded.forward(ids)[0]
    assert out.dtype == np.float32 and out.tobytes() == loaded_out.tobytes()
    head = _get(loaded, LANGUAGE_MODELS[name][2])
    assert (head.weight is _get(loaded, LANGUAGE_MODELS[name][1]).weight) == tied


def test_shrinking_keeps_the_first_rows():
    model = LANGUAGE_MODELS["gpt"][0](False, np.float64)
    table = model.tokens.weight.data.copy()
    model.resize_token_embeddings(6, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(model.tokens.weight.data, table[:6])
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 6\); got"):
        model.forward(np.array([[7]]))


def test_the_padding_row_stays_and_bad_arguments_are_named():
    llama = LANGUAGE_MODELS["llama"][0](False, np.float64)
    llama.resize_token_embeddings(N, rng=np.random.default_rng(0))
    assert not llama.embed_tokens.weight.data[3].any()              # pad_token_id 3
    assert llama.constant_elements()["embed_tokens.weight"][3].all()
    with pytest.raises(ValueError, match="new_num_tokens must be above pad_token_id = 3"):
        llama.resize_token_embeddings(3, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="new_num_tokens must be a positive integer; got 0"):
        llama.resize_token_embeddings(0, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        llama.resize_token_embeddings(20, rng=None)
    assert llama.config.vocab_size == N                             # nothing changed


# -- the encoder-decoder and CBOW ------------------------------------------------------------
SEQ2SEQ = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=8, nhead=2, num_encoder_layers=1,
               num_decoder_layers=1, dim_feedforward=12)


@pytest.mark.parametrize("side", ["both", "src", "tgt"])
def test_seq2seq_resizes_the_side_asked(side):
    model = Seq2Seq(Seq2SeqConfig(**SEQ2SEQ), rng=1)
    before = {name: value.copy() for name, value in model.state_dict().items()}
    model.resize_token_embeddings(N, rng=np.random.default_rng(3), side=side)
    state = model.state_dict()
    grown = {"both": {"src_embedding", "tgt_embedding", "output"},
             "src": {"src_embedding"}, "tgt": {"tgt_embedding", "output"}}[side]
    for name, value in state.items():
        if name.split(".")[0] in grown:
            assert len(value) == N
            np.testing.assert_array_equal(value[:V], before[name])
        else:
            assert value.tobytes() == before[name].tobytes(), name
    c = model.config
    assert (c.src_vocab_size, c.tgt_vocab_size) == {"both": (N, N), "src": (N, V),
                                                    "tgt": (V, N)}[side]
    expected = np.random.default_rng(3)
    if side != "tgt":
        np.testing.assert_array_equal(state["src_embedding.weight"][V:],
                                      normal_init(expected, (N - V, 8), 1.0, np.float64))
    if side != "src":
        np.testing.assert_array_equal(state["tgt_embedding.weight"][V:],
                                      normal_init(expected, (N - V, 8), 1.0, np.float64))
        np.testing.assert_array_equal(state["output.weight"][V:],
                                      uniform_init(expected, (N - V, 8), 8, np.float64))
        np.testing.assert_array_equal(state["output.bias"][V:],
                                      uniform_init(expected, (N - V,), 8, np.float64))
    src, tgt = _ids(4, c.src_vocab_size, (2, 4)), _ids(5, c.tgt_vocab_size, (2, 3))
    target = _ids(6, c.tgt_vocab_size, (2, 3))
    report = gradcheck_module(Seq2SeqLoss(model), src, tgt, target)
    assert report.passed, str(report)


def test_seq2seq_with_feature_inputs_has_only_a_target_vocabulary(tmp_path):
    config = Seq2SeqConfig(**{**SEQ2SEQ, "src_vocab_size": None, "src_features": 3})
    model = Seq2Seq(config)
    model.resize_token_embeddings(N, rng=np.random.default_rng(0))
    assert model.config.tgt_vocab_size == N and model.config.src_vocab_size is None
    with pytest.raises(ValueError, match="side 'src': the source is feature vectors"):
        model.resize_token_embeddings(N, rng=np.random.default_rng(0), side="src")
    with pytest.raises(ValueError, match="side must be one of 'both', 'src', 'tgt'; got 'x'"):
        model.resize_token_embeddings(N, rng=np.random.default_rng(0), side="x")
    save_checkpoint(tmp_path / "c.npz", model)
    assert load_checkpoint(tmp_path / "c.npz").model.config == model.config


def test_cbow_resizes_both_tables():
    model = CBOW(V, 4, rng=0)
    table = model.embeddings.weight.data.copy()
    model.resize_token_embeddings(N, rng=np.random.default_rng(1))
    assert model.vocab_size == N and model.output.weight.shape == (N, 4)
    assert model.output.bias.shape == (N,) and model.output.out_features == N
    np.testing.assert_array_equal(model.embeddings.weight.data[:V], table)
    report = gradcheck_module(model, _ids(2, N, (3, 4)), wrt_inputs=False)
    assert report.passed, str(report)


def test_a_tokenizer_grown_after_training_and_its_model():
    """The whole story: train a BPE, build a model on it, register a special token, grow the
    model to the tokenizer's new size; the old ids mean what they meant."""
    tokenizer = BPETokenizer.train("the cat sat on the mat. the dog sat on the rug.", 280)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, max_context=32, width=8, heads=2,
                          layers=1, tied=True))
    text, vocab = "the cat sat", tokenizer.vocab_size     # training may stop below 280
    before = model.forward(tokenizer.encode(text)[None])[0]
    (sep,) = tokenizer.add_special_tokens(["<sep>"])
    assert sep == vocab == model.config.vocab_size
    model.resize_token_embeddings(tokenizer.vocab_size, rng=np.random.default_rng(0))
    ids = tokenizer.encode(text + "<sep>")
    assert ids[-1] == sep and (ids[:-1] == tokenizer.encode(text)).all()
    logits = model.forward(ids[None])[0]
    np.testing.assert_allclose(logits[0, :-1, :vocab], before[0], rtol=1e-13, atol=1e-15)
