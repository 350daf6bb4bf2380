"""numpy_tf.jax_bridge.run_jax: a Flax mirror of the tiny GPT (GPTConfig.tiny(), 7,232
parameters) and Flax's MultiHeadDotProductAttention against numpy_tf, in float64
(jax_enable_x64) and float32; the two JAX conventions compare explains; a plain JAX function."""
import math

import numpy as np
import pytest

from numpy_tf.checking.case_file import Case
from numpy_tf.checking.compare import compare_files
from numpy_tf.checking.conventions import FLOAT32_SIZE
from numpy_tf.checking.export import export_case, spread_weights
from numpy_tf.checking.flash_case import export_flash_attention_case
from numpy_tf.layers.attention import attention_forward
from numpy_tf.layers.multihead import MultiHeadAttention

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax", reason="the JAX bridge tests need jax: pip install "
                                        "'numpy-tf[jax]'")
nn = pytest.importorskip("flax.linen", reason="the JAX bridge tests need flax: pip install "
                                              "'numpy-tf[jax]'")
jnp = jax.numpy
import flax_gpt  # noqa: E402 (needs flax)
from numpy_tf.jax_bridge import run_jax  # noqa: E402 (the documented path)


def gpt_case(tmp_path, dtype, seed=5):
    path = tmp_path / f"gpt_{dtype}.npz"
    export_case("tiny-gpt", seed=seed, dtype=dtype).save(path)
    return path


def run_gpt(tmp_path, path, **options):
    theirs = tmp_path / "jax.npz"
    run_jax(flax_gpt.TinyGPT(**options), path, theirs, params=flax_gpt.parameter_names(),
            activations=flax_gpt.activation_paths())
    return theirs, compare_files(path, theirs, allow_missing=True)   # positions: P alone


def worst_size(result) -> float:
    """max over tensors of max abs error / max(1, S), S the largest |value| of the group."""
    reference = Case.load(result.reference).arrays
    groups = {"act": "forward", "output": "forward", "loss": "forward"}
    scale = {}
    for row in result.rows:
        group = groups.get(row.comparison.key.split("/")[0], row.comparison.key.split("/")[0])
        scale[group] = max(scale.get(group, 0.0), np.abs(reference[row.comparison.key]).max())
    return max(row.comparison.max_abs_error / max(1.0, scale[groups.get(
        row.comparison.key.split("/")[0], row.comparison.key.split("/")[0])])
        for row in result.rows)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_flax_tiny_gpt_agrees_number_by_number(tmp_path, dtype):
    path = gpt_case(tmp_path, dtype)
    theirs, result = run_gpt(tmp_path, path)
    assert result.passed, str(result)
    case = Case.load(path)
    assert result.only_reference == ["act/positions", "grad_act/positions"]
    assert not result.only_theirs and len(result.rows) == len(case.arrays) - 2
    written = Case.load(theirs)
    assert written.meta["x64"] == (dtype == "float64") and written.meta["jax"] == jax.__version__
    assert all(a.dtype == np.dtype(dtype) for k, a in written.arrays.items()
               if a.dtype.kind == "f")
    assert sum(a.size for k, a in written.arrays.items() if k.startswith("param/")) == 7232
    worst = max(row.comparison.max_abs_error for row in result.rows)
    assert worst < (1e-13 if dtype == "float64" else 2e-5)


def test_a_planted_eps_in_one_norm_is_found_at_that_norm(tmp_path):
    path = gpt_case(tmp_path, "float64", seed=6)
    _, result = run_gpt(tmp_path, path, planted_eps=(1, 1e-3))
    assert result.first_divergence.comparison.key == "act/blocks.1.norm1"
    assert result.explanation is None


def test_jax_nn_attention_takes_its_softmax_in_float32_and_compare_explains_it(tmp_path):
    """Measured: jax.nn.dot_product_attention in float64 agrees with float64 attention to
    1.5e-7 of the output's largest value; the GPT using it differs first at the first
    attention output, every tensor by float32 size, and compare says why."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        worst = 0.0
        for _ in range(20):
            q, k, v = (rng.standard_normal((2, 6, 2, 8)) for _ in range(3))     # (B, T, H, d)
            theirs = np.asarray(jax.nn.dot_product_attention(q, k, v))
            assert theirs.dtype == np.float64
            ours, _ = attention_forward(*(a.transpose(0, 2, 1, 3) for a in (q, k, v)))
            ours = ours.transpose(0, 2, 1, 3)
            worst = max(worst, np.abs(theirs - ours).max() / np.abs(ours).max())
    assert 1e-9 < worst < 1e-6                     # float32 size, not float64's 1e-16

    path = gpt_case(tmp_path, "float64")
    _, result = run_gpt(tmp_path, path, attention="jax.nn")
    assert not result.passed
    assert result.first_divergence.comparison.key == "act/blocks.0.attention.output"
    assert result.explanation.convention == "JAX_FLOAT32_SOFTMAX"
    assert 1e-9 < worst_size(result) <= FLOAT32_SIZE
    text = str(result)
    assert "not a bug" in text and "float32 even for float64 inputs" in text
    assert "look here first" not in text
    assert result.to_dict()["explanation"]["convention"] == "JAX_FLOAT32_SOFTMAX"
    # in float32 the same model agrees
    assert run_gpt(tmp_path, gpt_case(tmp_path, "float32"), attention="jax.nn")[1].passed
    # a real bug on top is not explained away
    _, both = run_gpt(tmp_path, path, attention="jax.nn", planted_eps=(1, 1e-3))
    assert both.explanation is None and "look here first" in str(both)


# -- Flax's MultiHeadDotProductAttention on a layer case ---------------------------------------
def attention_case(tmp_path, dtype, fully_masked_row=False, seed=0):
    """numpy_tf's MultiHeadAttention (C = 8, 2 heads, biases) on x (2, 5, 8) with a bool mask:
    a layer case with an upstream gradient."""
    g = np.random.default_rng(seed)
    layer = MultiHeadAttention(8, 2, bias=True, dtype=dtype)
    spread_weights(layer, g, 0.5)
    x = g.standard_normal((2, 5, 8)).astype(dtype)
    mask = g.random((2, 1, 5, 5)) < 0.3
    mask[..., 0] = False                           # every query sees key 0 ...
    if fully_masked_row:
        mask[0, 0, 3] = True                       # ... but query 3 of sequence 0
    layer.zero_grad()
    out, cache = layer.forward(x, attn_mask=mask)
    dout = g.standard_normal(out.shape).astype(dtype)
    dx = layer.backward(dout, cache)
    arrays = {f"param/{name}": value.copy() for name, value in layer.state_dict().items()}
    arrays.update({"input/x": x, "input/attn_mask": mask, "output/out": out,
                   "grad_output/out": dout, "grad_input/x": dx})
    arrays.update({f"grad/{name}": value.copy() for name, value in layer.grad_dict().items()})
    meta = {"generator": "tests/test_jax_bridge.py", "kind": "multihead_attention",
            "level": "layer", "dtype": np.dtype(dtype).name, "inputs": ["x", "attn_mask"],
            "keyword_inputs": ["attn_mask"], "outputs": ["out"]}
    path = tmp_path / f"mha_{np.dtype(dtype).name}.npz"
    Case(meta, arrays).save(path)
    return path


FLAX_MHA_NAMES = {f"{ours}_proj.{kind}": (f"params/{theirs}/{flax_kind}", kind == "weight")
                  for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value"),
                                       ("o", "out"))
                  for kind, flax_kind in (("weight", "kernel"), ("bias", "bias"))}


def run_flax_attention(tmp_path, path):
    module = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, out_features=8)
    variables = module.init(jax.random.PRNGKey(0), jnp.zeros((2, 5, 8)))
    theirs = tmp_path / "flax_mha.npz"
    run_jax(module, path, theirs, variables=variables, params=FLAX_MHA_NAMES,
            call=lambda m, v, x: m.apply(v, x["x"], mask=~x["attn_mask"]))   # Flax: True = keep
    return theirs


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_flax_multi_head_dot_product_attention_agrees(tmp_path, dtype):
    """Flax's (C, heads, head_dim) kernels are numpy_tf's (out, in) weights transposed and
    reshaped; the gradients go back the same way."""
    path = attention_case(tmp_path, dtype)
    theirs = run_flax_attention(tmp_path, path)
    result = compare_files(path, theirs)
    assert result.passed, str(result)
    assert {row.comparison.key for row in result.rows} >= {
        "output/out", "grad_input/x", "grad/q_proj.weight", "grad/o_proj.bias"}
    assert Case.load(theirs).arrays["param/q_proj.weight"].shape == (8, 8)
    worst = max(row.comparison.max_abs_error for row in result.rows)
    assert worst < (1e-13 if dtype == np.float64 else 1e-5)


def test_a_fully_masked_row_gives_the_mean_of_v_in_flax_and_compare_explains_it(tmp_path):
    path = attention_case(tmp_path, np.float64, fully_masked_row=True)
    theirs = run_flax_attention(tmp_path, path)
    result = compare_files(path, theirs)
    assert result.first_divergence.comparison.key == "output/out"
    assert result.explanation.convention == "MASKED_ROW_MEAN"
    assert "only in the 1 query rows" in str(result)
    # measured: Flax's row is o_proj(mean over the keys of v_proj(x)), numpy_tf's is 0 + bias
    a, b = Case.load(path).arrays, Case.load(theirs).arrays
    values = a["input/x"][0] @ a["param/v_proj.weight"].T + a["param/v_proj.bias"]   # (5, 8)
    mean_row = values.mean(axis=0) @ a["param/o_proj.weight"].T + a["param/o_proj.bias"]
    assert np.abs(b["output/out"][0, 3] - mean_row).max() < 1e-14
    np.testing.assert_array_equal(a["output/out"][0, 3], a["param/o_proj.bias"])
    # a difference outside the masked row is not explained away
    b["output/out"][1, 0, 0] += 1e-6
    Case(Case.load(theirs).meta, b).save(tmp_path / "also_wrong.npz")
    other = compare_files(path, tmp_path / "also_wrong.npz")
    assert other.first_divergence.comparison.key == "output/out" and other.explanation is None


# -- a plain JAX function, tapped --------------------------------------------------------------
def jax_attention(variables, inputs, tap):
    """GQA attention with key padding and a causal offset, the flash case's conventions."""
    q, k, v, padding = inputs["q"], inputs["k"], inputs["v"], inputs["key_padding_mask"]
    ratio = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, ratio, axis=1), jnp.repeat(v, ratio, axis=1)
    scores = q @ jnp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    tq, tk = q.shape[2], k.shape[2]
    future = jnp.triu(jnp.ones((tq, tk), dtype=bool), k=tk - tq + 1)
    scores = jnp.where(future | padding[:, None, None, :], -jnp.inf, scores)
    tap("logsumexp", jax.scipy.special.logsumexp(scores, axis=-1))
    return jax.nn.softmax(scores, axis=-1) @ v


def test_a_plain_jax_function_against_the_flash_case(tmp_path):
    path = tmp_path / "flash.npz"
    export_flash_attention_case(seed=2).save(path)
    theirs = run_jax(jax_attention, path, tmp_path / "theirs.npz", variables={}, jit=False)
    result = compare_files(path, tmp_path / "theirs.npz", allow_missing=True)   # no tiles
    assert result.passed, str(result)
    keys = {row.comparison.key for row in result.rows}
    assert {"act/logsumexp", "output/out", "grad_input/q", "grad_input/k", "grad_input/v"} <= keys
    assert "grad_act/logsumexp" in result.only_theirs
    assert "act/tiles.row_max" in result.only_reference
    assert theirs.meta["module"] == "jax_attention"
    jitted = run_jax(jax_attention, path, variables={})          # the same numbers compiled
    for key, value in theirs.arrays.items():
        np.testing.assert_allclose(jitted.arrays[key], value, rtol=1e-13, atol=1e-15)


def test_bridge_errors(tmp_path):
    path = gpt_case(tmp_path, "float32")
    names = flax_gpt.parameter_names()
    with pytest.raises(ValueError, match="module parameters given no value: params/output/"):
        run_jax(flax_gpt.TinyGPT(), path, params={k: v for k, v in names.items()
                                                  if k != "output.weight"})
    with pytest.raises(ValueError, match="no parameter name of the case matches"):
        run_jax(flax_gpt.TinyGPT(), path)
    with pytest.raises(ValueError, match=r"activations: x = 'blocks_9': not the path of a "
                                         r"module this model calls \(its paths: blocks_0, "):
        run_jax(flax_gpt.TinyGPT(), path, params=names, activations={"x": "blocks_9"})
    untransposed = dict(names, **{"output.weight": ("params/output/kernel", False)})
    with pytest.raises(ValueError, match=r"param 'output.weight' has shape \(20, 16\); its "
                                         r"leaf has shape \(16, 20\)"):
        run_jax(flax_gpt.TinyGPT(), path, params=untransposed)
    with pytest.raises(ValueError, match="a plain JAX model needs variables="):
        run_jax(jax_attention, path)
    with pytest.raises(TypeError, match="must be a flax.linen.Module or a function"):
        run_jax(42, path)
    padded = tmp_path / "padded.npz"
    export_case("gpt2", seed=1, pad=1).save(padded)
    with pytest.raises(ValueError, match=r"keyword inputs \['key_padding_mask'\]: pass call="):
        run_jax(flax_gpt.TinyGPT(), padded, params=names)
