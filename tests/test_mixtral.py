"""The Mixtral decoder: agreement with HF MixtralForCausalLM (logits, its loss with the router's
auxiliary loss, every gradient), gradients, the objective, padding, the KV cache, both of HF's
expert layouts, the parameter count and the refusals.

Finite-difference checks here keep away from routing ties (the routing is piecewise constant,
layers/moe.py): each draws until every router's top-k margin in logits is at least MARGIN, far
above what a step moves a logit.
"""
import numpy as np
import pytest
from contract import (assert_fixture_agrees, assert_hf_round_trip_is_bit_exact,
                      assert_right_padding_changes_nothing, assert_tied_gradient_is_the_sum,
                      check_contract)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from numpy_tf import gradcheck_module, interop
from numpy_tf.checking.case_file import Case
from numpy_tf.checking.fixtures import fixtures_dir
from numpy_tf.interop.hf_mixtral import hub_layout
from numpy_tf.layers.cross_entropy_loss import cross_entropy
from numpy_tf.layers.moe import load_balancing_loss_forward
from numpy_tf.models import registry
from numpy_tf.models.accounting import account, count_parameters
from numpy_tf.models.mixtral import Mixtral, MixtralConfig, MixtralLoss
from numpy_tf.models.objectives import shifted_targets

FIXTURES = ["mixtral_top2", "mixtral_top1_mqa_tied", "mixtral_top2_padded",
            "mixtral_top3_no_aux"]
MARGIN = 1e-3


def _config(**changes):
    base = dict(vocab_size=24, hidden_size=16, intermediate_size=12, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                num_experts_per_tok=2, rope_theta=100.0, initializer_range=0.3,
                output_router_logits=True, router_aux_loss_coef=0.1)
    return MixtralConfig(**{**base, **changes})


def _spread_norms(model, seed):
    rng = np.random.default_rng(seed)
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.data[...] = 1.0 + 0.2 * rng.standard_normal(parameter.shape)
    return model


def _ids(seed, batch, length, vocab=24):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length))


def _margin(model, ids, **kwargs) -> float:
    """The smallest top-k margin (k-th minus (k+1)-th largest router logit) of any token in any
    layer."""
    _, cache = model.forward(ids, **kwargs)
    k = model.config.num_experts_per_tok
    if k == model.config.num_local_experts:
        return np.inf
    ordered = [-np.sort(-z, axis=-1) for z in cache.router_logits]
    return min(float((z[:, k - 1] - z[:, k]).min()) for z in ordered)


def _case(name):
    case = Case.load(fixtures_dir() / f"{name}.npz")
    return case.meta["config"], case.section("param")


# -- agreement with Hugging Face ----------------------------------------------------------------
@pytest.mark.parametrize("name", FIXTURES)
def test_agrees_with_hugging_face(name):
    """Logits, HF's loss (cross-entropy + router_aux_loss_coef * aux_loss where the config
    asks for it) and every parameter gradient, the router's included, in HF's layout."""
    assert_fixture_agrees(name)


def test_the_float64_fixtures_are_true_float64():
    """HF computes the router's softmax and the auxiliary loss (besides RMSNorm, RoPE and the
    softmax of attention) in float32 even in a float64 model; the float64 fixtures patch all
    five, and numpy_tf agrees with them far below float32's 1e-7."""
    for name in FIXTURES:
        case = Case.load(fixtures_dir() / f"{name}_float64.npz")
        convention = case.meta["conventions"]["float64"]
        assert "MixtralTopKRouter.forward" in convention
        assert "load_balancing_loss_func" in convention
        assert case.meta["conventions"]["top_k_margin"] >= MARGIN
        model = interop.from_hf(case.meta["config"], case.section("param"))
        mask = case.arrays.get("input/key_padding_mask")
        loss, cache = MixtralLoss(model).forward(case.arrays["input/ids"], mask)
        assert abs(float(loss) - float(case.arrays["loss"])) < 1e-14 * float(case.arrays["loss"])
        expected = case.arrays["output/logits"]
        assert np.abs(cache.logits - expected).max() < 1e-13 * np.abs(expected).max()


def test_the_auxiliary_term_is_in_the_fixture_loss():
    """The fixtures' loss is not the cross-entropy alone: dropping the auxiliary term misses
    it by far more than the tolerance (so the comparison above checks the term)."""
    case = Case.load(fixtures_dir() / "mixtral_top2_padded_float64.npz")
    model = interop.from_hf(case.meta["config"], case.section("param"))
    ids, mask = case.arrays["input/ids"], case.arrays["input/key_padding_mask"]
    loss, cache = MixtralLoss(model).forward(ids, mask)
    cross, _ = cross_entropy(cache.logits, shifted_targets(ids, mask))
    assert float(loss) - float(cross) == pytest.approx(
        case.meta["config"]["router_aux_loss_coef"] * float(cache.aux_loss), rel=1e-12)
    assert abs(float(cross) - float(case.arrays["loss"])) > 1e-4


# -- gradients ------------------------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(kv_heads=st.sampled_from([1, 2, 4]), top_k=st.sampled_from([1, 2, 4]),
       tied=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16))
def test_fast_gradient_check_of_the_loss_over_every_parameter(kv_heads, top_k, tied, padded,
                                                              seed):
    model = _spread_norms(Mixtral(_config(num_key_value_heads=kv_heads, num_experts_per_tok=top_k,
                                          tie_word_embeddings=tied), rng=seed), seed)
    ids = _ids(seed, 2, 5)
    padding = np.zeros((2, 5), dtype=bool)
    padding[1, 3:] = padded
    assume(_margin(model, ids, key_padding_mask=padding) >= MARGIN)
    report = gradcheck_module(MixtralLoss(model), ids, fast=True, seed=seed,
                              forward_kwargs={"key_padding_mask": padding})
    assert report.passed, str(report)


def test_gradient_check_with_the_auxiliary_loss_dominating():
    """A large coefficient, so the auxiliary path carries most of the routers' gradient; many
    random directions over every parameter."""
    model = _spread_norms(Mixtral(_config(router_aux_loss_coef=30.0), rng=5), 5)
    ids = _ids(6, 2, 4)
    assert _margin(model, ids) >= MARGIN
    report = gradcheck_module(MixtralLoss(model), ids, seed=6, fast=True, directions=12)
    assert report.passed, str(report)


def test_the_loss_is_cross_entropy_plus_the_weighted_auxiliary_loss():
    model = _spread_norms(Mixtral(_config(), rng=3), 3)
    ids = _ids(4, 2, 6)
    loss, cache = MixtralLoss(model).forward(ids)
    cross, _ = cross_entropy(cache.logits, shifted_targets(ids))
    aux, _ = load_balancing_loss_forward(cache.model.router_logits, 2)
    assert float(loss) == pytest.approx(float(cross) + 0.1 * float(aux), rel=1e-14)
    without, plain = MixtralLoss(model, output_router_logits=False).forward(ids)
    assert float(without) == float(cross) and plain.aux is None
    off = Mixtral(_config(output_router_logits=False), rng=3)
    off.load_state_dict(model.state_dict())
    assert float(MixtralLoss(off).forward(ids)[0]) == float(cross)
    assert float(MixtralLoss(off, output_router_logits=True).forward(ids)[0]) == float(loss)


def test_the_auxiliary_loss_alone_reaches_only_the_routers_and_what_feeds_them():
    """With the cross-entropy's gradient removed (dloss through the aux term only), the
    experts and the head get nothing; the routers and the layers below them do."""
    model = _spread_norms(Mixtral(_config(), rng=8), 8)
    objective = MixtralLoss(model)
    ids = _ids(9, 2, 5)
    loss, cache = objective.forward(ids)
    from numpy_tf.layers.moe import load_balancing_loss_backward
    drouter = load_balancing_loss_backward(1.0, cache.aux)
    model.zero_grad()
    model.backward(np.zeros_like(cache.logits), cache.model, drouter)
    grads = model.grad_dict()
    assert not grads["lm_head.weight"].any() and not grads["layers.1.mlp.experts.down_proj"].any()
    assert grads["layers.1.mlp.gate.weight"].any() and grads["layers.0.mlp.gate.weight"].any()
    assert grads["layers.0.mlp.experts.gate_up_proj"].any()    # layer 1's router reads layer 0


def test_tied_gradient_is_the_sum_of_the_two_untied_uses():
    tied = _spread_norms(Mixtral(_config(tie_word_embeddings=True), rng=10), 10)
    untied = Mixtral(_config(), rng=10)
    untied.load_state_dict({**tied.state_dict()})
    assert_tied_gradient_is_the_sum(tied, untied, _ids(11, 2, 5), "embed_tokens.weight",
                                    "lm_head.weight")


def test_right_padding_changes_nothing_for_the_real_tokens():
    model = _spread_norms(Mixtral(_config(), rng=12), 12)
    assert_right_padding_changes_nothing(model, _ids(13, 1, 5), _ids(14, 1, 3))
    real = _ids(13, 1, 5)
    padded = np.concatenate([real, _ids(14, 1, 3)], axis=1)
    mask = np.zeros(padded.shape, dtype=bool)
    mask[:, 5:] = True
    alone, _ = MixtralLoss(model).forward(real)
    with_padding, _ = MixtralLoss(model).forward(padded, mask)
    assert float(with_padding) == pytest.approx(float(alone), rel=1e-13)


@pytest.mark.parametrize("top_k", [1, 2])
def test_cached_decoding_step_by_step_equals_the_full_forward(top_k):
    model = _spread_norms(Mixtral(_config(num_experts_per_tok=top_k), rng=16), 16)
    ids = _ids(17, 2, 7)
    full, _ = model.forward(ids)
    logits, cache = model.forward(ids[:, :3])
    steps = [logits]
    for t in range(3, 7):
        logits, cache = model.forward(ids[:, t:t + 1], past_kv=cache.present)
        steps.append(logits)
        assert [z.shape for z in cache.router_logits] == [(2, 4)] * 2
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)


def test_contract():
    check_contract(lambda dtype: _spread_norms(Mixtral(_config(tie_word_embeddings=True),
                                                       rng=20, dtype=dtype), 20),
                   (_ids(21, 2, 5),))


# -- the parameters ------------------------------------------------------------------------------
def test_names_are_transformers_5_names_without_the_model_prefix():
    names = list(Mixtral(_config(num_hidden_layers=1)).state_dict())
    assert names == ["embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                     "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
                     "layers.0.self_attn.o_proj.weight", "layers.0.mlp.gate.weight",
                     "layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj",
                     "layers.0.input_layernorm.weight",
                     "layers.0.post_attention_layernorm.weight", "norm.weight",
                     "lm_head.weight"]


@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True, "head_dim": 6},
                                     {"num_local_experts": 3, "num_experts_per_tok": 3}])
def test_parameter_count_from_the_shapes(changes):
    config = _config(**changes)
    model = Mixtral(config)
    assert config.num_parameters() == count_parameters(model)
    experts = sum(p.size for name, p in model.named_parameters() if ".experts." in name)
    unused = experts * (config.num_local_experts - config.num_experts_per_tok) \
        // config.num_local_experts
    assert config.active_parameters() == count_parameters(model) - unused


def test_mixtral_8x7b_is_counted_without_allocating():
    """46,702,792,704 is what HF's MixtralForCausalLM on the meta device holds for
    mistralai/Mixtral-8x7B-v0.1's config (measured once: building it takes 20 s, so
    test_the_count_is_hf_models, below, builds two of its 32 layers)."""
    preset = registry.PRESETS["mixtral-8x7b"]
    assert preset.config.num_parameters() == 46_702_792_704
    assert account("mixtral-8x7b").total == 46_702_792_704
    assert account("mixtral-8x7b").active == 12_879_925_248
    assert "active per token: 12,879,925,248 (2 of 8 experts in each layer)" in \
        str(account("mixtral-8x7b"))


@pytest.mark.torch
def test_the_count_is_hf_models():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    family = registry.FAMILIES["mixtral"]
    for preset in ("mixtral-8x7b", "mixtral-tiny"):
        config = family.hf_config(registry.PRESETS[preset].config)
        config["num_hidden_layers"] = 2
        with torch.device("meta"):
            hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(**{
                k: v for k, v in config.items() if k != "model_type"}))
        assert account(config).total == sum(p.numel() for p in hf.parameters()), preset


def test_initialisation_follows_hugging_face():
    model = Mixtral(MixtralConfig(hidden_size=64, intermediate_size=96, vocab_size=50,
                                  initializer_range=0.05), rng=0)
    for name, value in model.state_dict().items():
        if "norm" in name:
            np.testing.assert_array_equal(value, 1.0)
        else:
            assert abs(value.std() - 0.05) < 0.005, name


# -- interop with Hugging Face's names -----------------------------------------------------------
@pytest.mark.parametrize("name", ["mixtral_top2_float64", "mixtral_top1_mqa_tied_float32",
                                  "mixtral_top2_padded_float64"])
def test_load_then_export_is_bit_exact(name):
    assert_hf_round_trip_is_bit_exact(*_case(name), name.split("_")[-1])


def _hub(state, experts=4):
    """transformers 5's names -> the hub's, written out here independently of hub_layout."""
    hub = {}
    for key, value in state.items():
        if ".mlp.experts.gate_up_proj" in key:
            layer = key.split(".mlp.")[0]
            hidden = value.shape[1] // 2
            for e in range(experts):
                hub[f"{layer}.block_sparse_moe.experts.{e}.w1.weight"] = value[e, :hidden]
                hub[f"{layer}.block_sparse_moe.experts.{e}.w3.weight"] = value[e, hidden:]
        elif ".mlp.experts.down_proj" in key:
            layer = key.split(".mlp.")[0]
            for e in range(experts):
                hub[f"{layer}.block_sparse_moe.experts.{e}.w2.weight"] = value[e]
        else:
            hub[key.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = value
    return hub


def test_hub_checkpoints_per_expert_w1_w2_w3_are_read():
    config, state = _case("mixtral_top2_float64")
    hub = _hub(state)
    model = interop.from_hf(config, hub)
    for key, value in interop.to_hf(model, config).items():
        assert value.tobytes() == state[key].tobytes(), key
    exported = hub_layout(interop.to_hf(model, config))
    assert sorted(exported) == sorted(hub)
    for key, value in exported.items():
        assert value.tobytes() == hub[key].tobytes(), key
    grads = hub_layout(interop.to_hf(model, config, grads=True))
    assert sorted(grads) == sorted(hub)


def test_gradients_come_in_hf_layout():
    case = Case.load(fixtures_dir() / "mixtral_top2_float64.npz")
    model = interop.from_hf(case.meta["config"], case.section("param"))
    loss, cache = MixtralLoss(model).forward(case.arrays["input/ids"])
    MixtralLoss(model).backward(1.0, cache)
    grads = interop.to_hf(model, case.meta["config"], grads=True)
    assert list(grads) == list(case.section("param"))
    assert grads["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 48, 16)


@pytest.mark.parametrize("change, message", [
    (lambda hub: hub.pop("model.layers.1.block_sparse_moe.experts.3.w2.weight"),
     r"missing keys: model.layers.1.block_sparse_moe.experts.3.w2.weight"),
    (lambda hub: hub.update({"model.layers.0.block_sparse_moe.experts.4.w1.weight":
                             np.zeros((24, 16))}),
     r"unexpected keys: model.layers.0.block_sparse_moe.experts.4.w1.weight \(the config has "
     r"2 layers of 4 experts\)"),
    (lambda hub: hub.update({"model.layers.0.block_sparse_moe.experts.0.w3.weight":
                             np.zeros((16, 24))}),
     r"model.layers.0.block_sparse_moe.experts.0.w3.weight: expected shape \(24, 16\), got "
     r"\(16, 24\)"),
    (lambda hub: hub.update({"model.layers.0.mlp.experts.down_proj": np.zeros((4, 16, 24))}),
     r"given in both layouts \(block_sparse_moe and mlp\): "
     r"model.layers.0.mlp.experts.down_proj"),
])
def test_a_hub_checkpoint_that_does_not_fit_is_refused_by_name(change, message):
    config, state = _case("mixtral_top2_float64")
    hub = _hub(state)
    change(hub)
    with pytest.raises(ValueError, match=message):
        interop.from_hf(config, hub)


@pytest.mark.torch
def test_transformers_reads_the_hub_layout_as_numpy_tf_does(tmp_path):
    """A hub-layout checkpoint saved with numpy_tf's hub_layout loads in transformers 5 to the
    very tensors numpy_tf reads from it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors.torch")
    config, state = _case("mixtral_top2_float32")
    hub = hub_layout(state)
    safetensors.save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in hub.items()},
                          str(tmp_path / "model.safetensors"))
    hf_config = transformers.MixtralConfig(**{k: v for k, v in config.items()
                                              if k not in ("model_type", "architectures")})
    hf_config.save_pretrained(tmp_path)
    hf = transformers.MixtralForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    loaded = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    ours = interop.to_hf(interop.from_hf(config, hub, dtype=np.float32), config)
    assert sorted(loaded) == sorted(ours)
    for key in ours:
        np.testing.assert_array_equal(loaded[key], ours[key], err_msg=key)


@pytest.mark.parametrize("changes, message", [
    ({"sliding_window": 0}, r"sliding_window must be None or a positive int \(the number of "
                           r"most recent positions a query sees, its own included\); got 0"),
    ({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1 is not implemented"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_parameters has rope_type 'yarn': scaled RoPE is not implemented for Mixtral"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
    ({"num_experts_per_tok": 5}, r"num_experts_per_tok \(5\) must be at most "
                                 r"num_local_experts \(4\)"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok must be a positive integer; got 0"),
    ({"num_local_experts": 0}, "num_local_experts must be a positive integer; got 0"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads \(3\) must divide "
                                 r"num_attention_heads \(4\)"),
    ({"head_dim": 5}, "head_dim must be even .RoPE rotates pairs of features.; got 5"),
])
def test_unsupported_configs_are_refused(changes, message):
    config, state = _case("mixtral_top2_float64")
    with pytest.raises(ValueError, match=message):
        interop.from_hf(dict(config, **changes), state)


def test_a_window_as_long_as_the_input_hides_nothing():
    """HF lets query i see key j when i - j < sliding_window: within sliding_window positions
    that is every earlier key (the fixture mixtral_top3_no_aux has a window of 9, its length,
    and agrees with HF), so the windowed model equals the unwindowed one there."""
    config, state = _case("mixtral_top3_no_aux_float64")
    assert config["sliding_window"] == 9
    model = interop.from_hf(config, state)
    unwindowed = interop.from_hf(dict(config, sliding_window=None), state)
    ids = _ids(30, 2, 9, vocab=32)
    np.testing.assert_array_equal(model.forward(ids)[0], unwindowed.forward(ids)[0])
    assert not np.allclose(model.forward(_ids(31, 1, 12, vocab=32))[0][:, -1],
                           unwindowed.forward(_ids(31, 1, 12, vocab=32))[0][:, -1])


@pytest.mark.torch
@pytest.mark.parametrize("padded", [False, True])
def test_a_window_shorter_than_the_input_agrees_with_hugging_face(padded):
    """Past the window (3 positions of 8), forward, cached decoding and every gradient of the
    loss (with the auxiliary term) against HF's MixtralForCausalLM in float64."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=12, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=3, output_router_logits=True,
        router_aux_loss_coef=0.05, attn_implementation="eager",
        experts_implementation="eager")).double().eval()
    config = hf.config.to_dict()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    model = interop.from_hf(config, state)
    ids = _ids(33, 2, 8, vocab=40)
    mask = np.ones((2, 8), dtype=np.int64)
    if padded:
        mask[1, -2:] = 0                                   # right padding, shorter than the window
    out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    padding = mask == 0
    logits, _ = model.forward(ids, key_padding_mask=padding if padded else None)
    real = ~padding
    # HF's float64 model still takes RMSNorm, the RoPE tables and the softmaxes in float32
    # (reference/mixtral.py patches them for the fixtures): agreement to float32's rounding,
    # where a window off by one position moves the last logits by about 1e-2 of their size
    theirs = out.logits.detach().numpy()[real]
    assert np.abs(logits[real] - theirs).max() <= 1e-6 * np.abs(theirs).max()
    _, cache = model.forward(ids[:, :5], key_padding_mask=padding[:, :5] if padded else None)
    step, _ = model.forward(ids[:, 5:], key_padding_mask=padding if padded else None,
                            past_kv=cache.present)
    np.testing.assert_allclose(step[real[:, 5:]], logits[:, 5:][real[:, 5:]], rtol=1e-12,
                               atol=1e-12)


def test_bad_config_refusals():
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(3\) must be at most "
                                         r"num_local_experts \(2\)"):
        MixtralConfig(num_local_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match="num_experts_per_tok must be a positive integer"):
        MixtralConfig(num_experts_per_tok=-1)
    with pytest.raises(ValueError, match=r"sliding_window must be None or a positive int .*; got -4"):
        MixtralConfig(sliding_window=-4)
    with pytest.raises(TypeError, match="output_router_logits must be True or False"):
        MixtralConfig(output_router_logits=1)
    with pytest.raises(TypeError, match="config must be a MixtralConfig"):
        Mixtral({"vocab_size": 24})
    with pytest.raises(TypeError, match="output_router_logits must be True or False"):
        MixtralLoss(Mixtral(_config()), output_router_logits="yes")
