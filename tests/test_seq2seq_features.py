"""The encoder-decoder reading feature vectors (a Linear front end instead of a source token
embedding, as speech models read filter-bank frames) and without the stacks' final LayerNorms:
one Seq2Seq object, checked by finite differences and against the same model built from
torch.nn modules."""
import numpy as np
import pytest
from contract import check_contract
from contract import spread_parameters as _spread

from numpy_tf import gradcheck_module, interop
from numpy_tf.generation.decoding import generate_seq2seq
from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from numpy_tf.models.encoder_decoder.transformer import Transformer
from numpy_tf.models.objectives import Seq2SeqLoss
from numpy_tf.training.checkpoint import load_checkpoint, save_checkpoint

FEATURES = dict(src_vocab_size=None, src_features=5, tgt_vocab_size=7, d_model=8, nhead=2,
                num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=12)


def _inputs(seed, batch=2, sources=6, targets=4, features=5, vocab=7):
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((batch, sources, features))
    tgt_ids = rng.integers(0, vocab, (batch, targets))
    target = rng.integers(0, vocab, (batch, targets))
    lengths = np.array([sources] + [sources - 2] * (batch - 1))
    padding = np.arange(sources) >= lengths[:, None]                  # (B, S) True at padding
    return src, tgt_ids, target, padding


def test_parameter_names_and_what_is_left_out():
    model = Seq2Seq(Seq2SeqConfig(**FEATURES, final_norms=False))
    names = list(model.state_dict())
    assert names[:2] == ["src_projection.weight", "src_projection.bias"]
    assert model.src_projection.weight.shape == (8, 5)
    assert not any(name.startswith("src_embedding") for name in names)
    assert not any(name.startswith(("transformer.encoder.norm", "transformer.decoder.norm"))
                   for name in names)
    with_norms = Seq2Seq(Seq2SeqConfig(**FEATURES))
    extra = sorted(set(with_norms.state_dict()) - set(names))
    assert extra == ["transformer.decoder.norm.bias", "transformer.decoder.norm.weight",
                     "transformer.encoder.norm.bias", "transformer.encoder.norm.weight"]
    # the token-id model keeps its names (and its final norms) by default
    assert list(Seq2Seq(Seq2SeqConfig()).state_dict())[0] == "src_embedding.weight"


@pytest.mark.parametrize("norm_first, final_norms", [(False, False), (True, True),
                                                     (True, False)])
def test_full_gradient_check_with_the_feature_gradient(norm_first, final_norms):
    config = Seq2SeqConfig(**{**FEATURES, "d_model": 4, "dim_feedforward": 6,
                              "num_encoder_layers": 1, "num_decoder_layers": 1},
                           norm_first=norm_first, final_norms=final_norms)
    model = _spread(Seq2Seq(config, rng=3), 4)
    src, tgt_ids, target, padding = _inputs(5, sources=4, targets=3)
    report = gradcheck_module(Seq2SeqLoss(model), src, tgt_ids, target, padding)
    assert report.passed and "input0" in {row.name for row in report.rows}, str(report)


def test_the_model_alone_returns_dsrc_and_keeps_the_contract():
    src, tgt_ids, _, padding = _inputs(6)
    check_contract(lambda dtype: Seq2Seq(Seq2SeqConfig(**FEATURES, final_norms=False),
                                         dtype=dtype), (src, tgt_ids, padding))
    model = Seq2Seq(Seq2SeqConfig(**FEATURES))
    logits, cache = model.forward(src, tgt_ids, padding)
    dsrc = model.backward(np.random.default_rng(7).standard_normal(logits.shape), cache)
    assert dsrc.shape == src.shape and np.abs(dsrc[1, -2:]).max() == 0.0   # padded frames
    assert np.abs(dsrc[1, :-2]).min() > 0.0


def test_generation_with_caches_equals_generation_without():
    model = _spread(Seq2Seq(Seq2SeqConfig(**FEATURES, final_norms=False), rng=8), 9)
    src, _, _, padding = _inputs(10)
    cached = generate_seq2seq(model, src, 5, 0, src_key_padding_mask=padding)
    uncached = generate_seq2seq(model, src, 5, 0, src_key_padding_mask=padding,
                                use_cache=False)
    assert cached.shape == (2, 6) and (cached == uncached).all()


def test_checkpoint_keeps_the_feature_model(tmp_path):
    config = Seq2SeqConfig(**FEATURES, final_norms=False)
    model = _spread(Seq2Seq(config, rng=1), 2)
    save_checkpoint(tmp_path / "c.npz", model)
    loaded = load_checkpoint(tmp_path / "c.npz").model
    assert loaded.config == config
    src, tgt_ids, _, padding = _inputs(11)
    assert (loaded.forward(src, tgt_ids, padding)[0] ==
            model.forward(src, tgt_ids, padding)[0]).all()


@pytest.mark.parametrize("changes, error, message", [
    ({"src_vocab_size": 13}, ValueError, "with src_features=5 reads feature vectors, so the "
                                         "source has no vocabulary: give src_vocab_size=None; "
                                         "got src_vocab_size=13"),
    ({"src_features": None}, ValueError, "needs src_vocab_size .* or src_features"),
    ({"src_features": 0}, ValueError, "src_features must be a positive integer; got 0"),
    ({"final_norms": 1}, TypeError, "final_norms must be True or False; got 1"),
])
def test_bad_configs(changes, error, message):
    with pytest.raises(error, match=message):
        Seq2SeqConfig(**{**FEATURES, **changes})


def test_bad_sources_are_named():
    model = Seq2Seq(Seq2SeqConfig(**FEATURES))
    src, tgt_ids, _, _ = _inputs(12)
    with pytest.raises(ValueError, match=r"src must have last dimension 5 \(src_features\); "
                                         r"got shape \(2, 6, 4\)"):
        model.forward(src[..., :4], tgt_ids)
    with pytest.raises(TypeError, match="src must be float32 or float64; got dtype int64"):
        model.forward(tgt_ids[..., None].repeat(5, -1), tgt_ids)
    with pytest.raises(TypeError, match="src has dtype float32 but the model's parameters are "
                                        "float64"):
        model.forward(src.astype(np.float32), tgt_ids)
    with pytest.raises(TypeError, match="src must be integers; got dtype float64"):
        Seq2Seq(Seq2SeqConfig()).forward(src[..., 0], tgt_ids)
    with pytest.raises(ValueError, match="src and tgt_ids must have the same batch size; got 2 "
                                         "and 1"):
        model.forward(src, tgt_ids[:1])


def test_a_transformer_without_final_norms_has_no_torch_state_dict():
    kwargs = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                  dim_feedforward=16, batch_first=True)
    module = Transformer(**kwargs, final_norms=False)
    assert module.encoder.norm is None and module.decoder.norm is None
    with pytest.raises(ValueError, match="built with final_norms=False, but torch.nn.Transformer "
                                         "always has encoder.norm and decoder.norm"):
        interop.to_torch(module, "transformer", kwargs)


# -- against the same model built from torch.nn modules -------------------------------------
def _torch_twin(torch, model: Seq2Seq):
    """nn.Linear front end, nn.TransformerEncoder / nn.TransformerDecoder (norm=None unless the
    config has final norms), nn.Embedding, the sinusoidal table, nn.Linear head; numpy_tf's
    weights copied in."""
    nn = torch.nn
    c = model.config
    layer = dict(d_model=c.d_model, nhead=c.nhead, dim_feedforward=c.dim_feedforward,
                 dropout=0.0, activation=c.activation, batch_first=True,
                 norm_first=c.norm_first, dtype=torch.float64)

    def norm():
        return nn.LayerNorm(c.d_model, dtype=torch.float64) if c.final_norms else None

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_projection = nn.Linear(c.src_features, c.d_model, dtype=torch.float64)
            self.tgt_embedding = nn.Embedding(c.tgt_vocab_size, c.d_model, dtype=torch.float64)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer),
                                                 c.num_encoder_layers, norm(),
                                                 enable_nested_tensor=False)
            self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer),
                                                 c.num_decoder_layers, norm())
            self.output = nn.Linear(c.d_model, c.tgt_vocab_size, dtype=torch.float64)

        @staticmethod
        def positions(length):
            t = torch.arange(length, dtype=torch.float64)[:, None]
            angles = t * 10000.0 ** (-torch.arange(0, c.d_model, 2, dtype=torch.float64)
                                     / c.d_model)
            table = torch.empty(length, c.d_model, dtype=torch.float64)
            table[:, 0::2], table[:, 1::2] = angles.sin(), angles.cos()
            return table

        def forward(self, src, tgt_ids, padding):
            x = self.src_projection(src) + self.positions(src.shape[1])
            memory = self.encoder(x, src_key_padding_mask=padding)
            y = self.tgt_embedding(tgt_ids) + self.positions(tgt_ids.shape[1])
            causal = torch.triu(torch.ones(tgt_ids.shape[1], tgt_ids.shape[1],
                                           dtype=torch.bool), 1)
            h = self.decoder(y, memory, tgt_mask=causal, memory_key_padding_mask=padding)
            return self.output(h)

    twin = Twin()
    ours = {name.removeprefix("transformer."): value
            for name, value in model.state_dict().items()}
    twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ours.items()}, strict=True)
    return twin


@pytest.mark.torch
@pytest.mark.parametrize("norm_first, final_norms", [(False, False), (True, True),
                                                     (True, False), (False, True)])
def test_agrees_with_torch_forward_and_backward(norm_first, final_norms):
    torch = pytest.importorskip("torch")
    model = _spread(Seq2Seq(Seq2SeqConfig(**FEATURES, norm_first=norm_first,
                                          final_norms=final_norms), rng=13), 14)
    twin = _torch_twin(torch, model)
    src, tgt_ids, _, padding = _inputs(15)
    logits, cache = model.forward(src, tgt_ids, padding)
    dlogits = np.random.default_rng(16).standard_normal(logits.shape)
    model.zero_grad()
    dsrc = model.backward(dlogits, cache)

    src_t = torch.tensor(src, requires_grad=True)
    expected = twin(src_t, torch.from_numpy(tgt_ids), torch.from_numpy(padding))
    expected.backward(torch.from_numpy(dlogits))
    np.testing.assert_allclose(logits, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dsrc, src_t.grad.numpy(), rtol=1e-9, atol=1e-12)
    grads = {name.removeprefix("transformer."): g for name, g in model.grad_dict().items()}
    assert set(grads) == {name for name, _ in twin.named_parameters()}
    for name, parameter in twin.named_parameters():
        np.testing.assert_allclose(grads[name], parameter.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)
