"""Decoder-only models: the 7,232-parameter Pre-LN GPT (GPTConfig.tiny()), the GPT-2 layout with
weight tying, and their agreement with the torch module and Hugging Face GPT2LMHeadModel."""
import numpy as np
import pytest
from contract import (assert_fixture_agrees, assert_right_padding_changes_nothing,
                      assert_tied_gradient_is_the_sum, check_contract)
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf import gradcheck_module
from numpy_tf.models.accounting import block_estimate, count_parameters, parameter_breakdown
from numpy_tf.models.gpt import GPT, DecoderBlock, GPTConfig
from numpy_tf.models.objectives import NextTokenLoss

SEED_IDS = np.array([[1, 3, 5, 7], [1, 4, 6, 8]])


def _gpt2(**changes):
    small = dict(vocab_size=24, max_context=10, width=16, heads=4, layers=2)
    return GPTConfig.gpt2(**{**small, **changes})


def test_the_7232_parameter_pre_ln_gpt():
    model = GPT(GPTConfig.tiny())
    assert count_parameters(model) == 7232
    assert list(model.state_dict())[:8] == [
        "tokens.weight", "positions.weight", "blocks.0.norm1.weight", "blocks.0.norm1.bias",
        "blocks.0.norm2.weight", "blocks.0.norm2.bias", "blocks.0.attention.qkv.weight",
        "blocks.0.attention.output.weight"]
    assert "blocks.1.feedforward.2.bias" in model.state_dict()
    assert list(model.state_dict())[-3:] == ["final_norm.weight", "final_norm.bias",
                                             "output.weight"]
    logits, _ = model.forward(SEED_IDS)
    assert logits.shape == (2, 4, 20)
    changed = SEED_IDS.copy()
    changed[:, 3] = 9
    changed_logits, _ = model.forward(changed)
    np.testing.assert_array_equal(logits[:, :3], changed_logits[:, :3])
    assert not np.array_equal(logits[:, 3], changed_logits[:, 3])


def test_initialisation_is_normal_002_with_zero_biases():
    model = GPT(GPTConfig.tiny(width=64, layers=1), rng=1)
    weight = model.blocks[0].feedforward[0].weight.data
    assert abs(weight.std() - 0.02) < 0.001 and abs(weight.mean()) < 0.001
    assert not model.blocks[0].feedforward[0].bias.data.any()
    np.testing.assert_array_equal(model.final_norm.weight.data, 1.0)


@pytest.mark.parametrize("name", ["tiny_gpt", "gpt2_tied", "gpt2_untied", "gpt2_tied_padded"])
def test_agrees_with_torch_and_hugging_face(name):
    assert_fixture_agrees(name)


def test_full_finite_differences_over_every_parameter_of_the_tiny_gpt():
    model = GPT(GPTConfig.tiny(init_std=0.3), rng=2)
    ids = np.random.default_rng(3).integers(0, 20, (2, 5))
    report = gradcheck_module(NextTokenLoss(model), ids)
    assert sum(row.shape and np.prod(row.shape) for row in report.rows) == 7232
    assert report.passed, str(report)


@given(norm_first=st.booleans(), tied=st.booleans(), activation=st.sampled_from(
    ["gelu", "gelu_tanh", "relu"]), seed=st.integers(0, 2**16))
def test_fast_gradient_check_of_every_layout(norm_first, tied, activation, seed):
    config = _gpt2(norm_first=norm_first, tied=tied, activation=activation, init_std=0.3,
                   layers=1)
    model = GPT(config, rng=seed)
    ids = np.random.default_rng(seed).integers(0, 24, (2, 6))
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 4:] = True
    report = gradcheck_module(NextTokenLoss(model), ids, fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


def test_post_ln_block_full_gradient_check():
    block = DecoderBlock(GPTConfig.tiny(norm_first=False, width=8, heads=2), rng=4)
    x = np.random.default_rng(5).standard_normal((2, 3, 8))
    report = gradcheck_module(block, x)
    assert report.passed, str(report)


def test_tied_gradient_is_the_sum_of_the_two_untied_uses():
    tied = GPT(_gpt2(init_std=0.3), rng=6)
    untied = GPT(_gpt2(init_std=0.3, tied=False), rng=6)
    untied.load_state_dict(dict(tied.state_dict()))   # the untied head starts equal
    assert_tied_gradient_is_the_sum(tied, untied, np.random.default_rng(7).integers(0, 24, (2, 7)),
                                    "tokens.weight", "output.weight")
    assert count_parameters(untied) - count_parameters(tied) == 24 * 16


def test_right_padding_changes_nothing_for_the_real_tokens():
    model = GPT(_gpt2(init_std=0.3), rng=8)
    rng = np.random.default_rng(9)
    assert_right_padding_changes_nothing(model, rng.integers(0, 24, (1, 5)),
                                         rng.integers(0, 24, (1, 3)))


def test_twelve_d_squared_per_block():
    for width in (16, 64, 768):
        model = GPT(GPTConfig.tiny(width=width, heads=4, layers=1, vocab_size=2, max_context=1))
        exact = parameter_breakdown(model)["blocks.0"]
        assert exact == 12 * width**2 + 9 * width        # FFN biases 5d, two LayerNorms 4d
        assert (exact - block_estimate(width)) / exact == pytest.approx(9 / (12 * width + 9))


def test_contract():
    check_contract(lambda dtype: GPT(_gpt2(), dtype=dtype), (SEED_IDS,))


def test_bad_input():
    model = GPT(GPTConfig.tiny())
    ids = np.zeros((2, 5), dtype=np.int64)
    ids[1, 4] = 23
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 20\); got 23 at "
                                         r"position \(1, 4\)"):
        model.forward(ids)
    with pytest.raises(ValueError, match="ids has 9 positions after 0 cached ones, more than "
                                         "max_context = 8"):
        model.forward(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\) = "
                                         r"\(1, 3\); got \(3, 1\)"):
        model.forward(np.zeros((1, 3), dtype=np.int64),
                      key_padding_mask=np.zeros((3, 1), dtype=bool))
    with pytest.raises(ValueError, match=r"ids must have 2 dimensions \(B, T\)"):
        model.forward(np.zeros(3, dtype=np.int64))


@pytest.mark.parametrize("arguments, error, message", [
    (([[1, 2], [3, 4]],), TypeError, "ids must be a numpy array of integers; got list"),
    ((np.arange(3),), ValueError, r"ids must have 2 dimensions \(B, T\); got shape \(3,\)"),
    ((np.ones((2, 3)),), TypeError, "ids must be integers; got dtype float64"),
    ((np.ones((2, 3), int), np.zeros((2, 2), bool)), ValueError,
     r"key_padding_mask must have shape \(B, S\) = \(2, S\), S >= T = 3 .*got \(2, 2\)"),
    ((np.ones((2, 3), int), np.zeros((3, 3), bool)), ValueError, "got \\(3, 3\\)"),
    ((np.ones((2, 3), int), np.zeros((2, 3))), TypeError,
     "key_padding_mask must be bool .*got dtype float64"),
    ((np.ones((2, 3), int), [[0, 0, 0], [0, 0, 1]]), TypeError,
     "key_padding_mask must be a numpy array; got list"),
    ((np.ones((2, 3), int), np.ma.array(np.zeros((2, 3), bool))), TypeError,
     "key_padding_mask must be a plain numpy array, not a masked array"),
    ((np.ones((2, 3), int), None, 1.5), TypeError, "ignore_index must be an integer; got 1.5"),
])
def test_shifted_targets_refuses_what_it_cannot_read(arguments, error, message):
    """Before, these were an AttributeError, an IndexError, NumPy's 'bitwise_or not
    supported', float ids taken as they were and an ignore_index of 1.5 cast to 1."""
    from numpy_tf import shifted_targets

    with pytest.raises(error, match=message):
        shifted_targets(*arguments)


def test_next_token_loss_refuses_a_float_padding_mask_before_the_model_runs():
    """The model adds a float key_padding_mask to its scores; the loss must know which targets
    to ignore, which a float mask does not say: refused by name (it was NumPy's
    'ufunc bitwise_or not supported' after the whole forward)."""
    model = GPT(GPTConfig.tiny(), rng=0)
    objective = NextTokenLoss(model)
    ran = []
    model.forward = lambda *args, **kwargs: ran.append(1)
    padding = np.zeros((2, 4))
    padding[0, 3] = -np.inf
    with pytest.raises(TypeError, match="key_padding_mask must be bool"):
        objective.forward(SEED_IDS, key_padding_mask=padding)
    assert not ran


def test_next_token_loss_after_a_kv_cache_reads_the_masks_last_columns():
    """With past_kv the model's key_padding_mask is (B, P + T); the targets ignore what its
    last T columns mark (it was an IndexError). The loss is the cross-entropy of the chunk's
    logits against ids[:, t + 1], the chunk's last position and the padded ones left out."""
    from numpy_tf import cross_entropy

    model = GPT(GPTConfig.tiny(), rng=0)
    past, chunk = SEED_IDS[:, :2], np.array([[2, 9, 4], [6, 6, 1]])
    _, cache = model.forward(past)
    padding = np.zeros((2, 5), dtype=bool)
    padding[1, 4] = True                                    # the second row's last token
    loss, _ = NextTokenLoss(model).forward(chunk, key_padding_mask=padding,
                                           past_kv=cache.present)
    logits, _ = model.forward(chunk, key_padding_mask=padding, past_kv=cache.present)
    targets = np.array([[9, 4, -100], [6, -100, -100]])     # row 1: 6 -> 6 kept, 6 -> pad not
    want, _ = cross_entropy(logits, targets)
    assert loss == want
