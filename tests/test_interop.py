"""numpy_tf.interop: exact conversion to and from Hugging Face layouts."""
import numpy as np
import pytest
from contract import assert_hf_round_trip_is_bit_exact

from numpy_tf import interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir


def _gpt2_case(name="gpt2_tied_float64"):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param")


@pytest.mark.parametrize("name", ["gpt2_tied_float64", "gpt2_untied_float32"])
def test_gpt2_load_then_export_is_bit_exact(name):
    assert_hf_round_trip_is_bit_exact(*_gpt2_case(name), name.split("_")[-1])


def test_gpt2_conv1d_weights_are_transposed():
    config, state = _gpt2_case()
    model = interop.from_hf(config, state)
    np.testing.assert_array_equal(model.blocks[0].attention.qkv.weight.data,
                                  state["transformer.h.0.attn.c_attn.weight"].T)
    assert model.output.weight is model.tokens.weight


def test_tied_head_may_be_left_out_but_not_contradicted():
    config, state = _gpt2_case()
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    model = interop.from_hf(config, without_head)
    exported = interop.to_hf(model, config)
    assert exported["lm_head.weight"] is exported["transformer.wte.weight"]
    contradicting = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1.0})
    with pytest.raises(ValueError, match="lm_head.weight must equal transformer.wte.weight"):
        interop.from_hf(config, contradicting)


def test_gradients_in_hf_layout():
    config, state = _gpt2_case()
    model = interop.from_hf(config, state)
    model.blocks[0].attention.qkv.weight.grad[:] = np.arange(48 * 16).reshape(48, 16)
    grads = interop.to_hf(model, config, grads=True)
    np.testing.assert_array_equal(grads["transformer.h.0.attn.c_attn.weight"],
                                  model.blocks[0].attention.qkv.weight.grad.T)
    assert grads["lm_head.weight"] is grads["transformer.wte.weight"]


def test_every_problem_is_named():
    config, state = _gpt2_case()
    broken = dict(state)
    del broken["transformer.h.1.ln_2.bias"]
    broken["transformer.h.9.ln_2.bias"] = np.zeros(16)
    broken["transformer.h.0.mlp.c_fc.weight"] = np.zeros((64, 16))
    with pytest.raises(ValueError) as error:
        interop.from_hf(config, broken)
    message = str(error.value)
    assert "missing keys: transformer.h.1.ln_2.bias" in message
    assert "unexpected keys: transformer.h.9.ln_2.bias" in message
    assert "transformer.h.0.mlp.c_fc.weight: expected shape (16, 64), got (64, 16)" in message


def test_numpy_tf_names_given_as_hf_names_get_a_hint():
    config, state = _gpt2_case()
    model = interop.from_hf(config, state)
    with pytest.raises(ValueError, match="look like numpy_tf's own names"):
        interop.from_hf(config, model.state_dict())


def test_unsupported_configs_are_refused():
    config, state = _gpt2_case()
    with pytest.raises(ValueError, match="activation_function 'swish' is not implemented"):
        interop.from_hf(dict(config, activation_function="swish"), state)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=True is not "
                                         "implemented"):
        interop.from_hf(dict(config, scale_attn_by_inverse_layer_idx=True), state)
    with pytest.raises(ValueError, match="model_type 't5' is not supported"):
        interop.from_hf(dict(config, model_type="t5"), state)
    with pytest.raises(TypeError, match="config must be a dict"):
        interop.from_hf(object(), state)


@pytest.mark.torch
def test_readme_example_with_a_live_gpt2_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=30, n_positions=12, n_embd=24, n_layer=2,
                                     n_head=3, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).double().eval()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = interop.from_hf(config.to_dict(), state, dtype=np.float64)
    ids = np.array([[1, 5, 7, 2, 9]])
    logits, _ = model.forward(ids)
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-12)
