"""The sizes benchmarked, the two models built with identical weights, and the FLOP count.

Both sides are the Pre-LN GPT of GPTConfig.tiny() at larger sizes (token embedding + learned
positions, Pre-LN blocks with a fused qkv without bias, an output projection without bias, an FFN
with biases and the exact GELU, a final LayerNorm, an output head without bias): numpy_tf's GPT
and the torch mirror reference/gpt.py TinyGPT, whose state_dict keys are the same names. torch
is imported here only; numpy_tf never imports it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from numpy_tf.models.gpt import GPT, GPTConfig

#            vocab    T  width heads layers batch
SIZES = {
    "tiny":   (20,     4,   16,  4,   2,   2),
    "small":  (256,   64,  128,  4,   4,  16),
    "medium": (1024, 128,  256,  8,   6,   8),
    "large":  (4096, 256,  512,  8,   8,   4),
}
LOGIT_TOLERANCE = {"float64": (1e-9, 1e-11), "float32": (1e-4, 1e-5)}   # rtol, atol


def config_for(size: str, max_context: int | None = None) -> GPTConfig:
    vocab, length, width, heads, layers, _ = SIZES[size]
    return GPTConfig(vocab_size=vocab, max_context=max_context or length, width=width,
                     heads=heads, layers=layers)


def batch_ids(size: str, seed: int = 0) -> np.ndarray:
    """(B, T) int64 token ids drawn uniformly."""
    vocab, length, _, _, _, batch = SIZES[size]
    return np.random.default_rng(seed).integers(0, vocab, (batch, length))


def step_flops(size: str) -> dict[str, float]:
    """Matmul FLOPs (2 per multiply-add) of one forward and of a training step.

    Per block, N = B T rows: qkv 2 N C 3C, output 2 N C C, FFN 2 N C 4C twice (24 N C^2 in
    all); the attention's q k^T and P v over the full T x T (what is computed, masked or not)
    4 B T^2 C; the head 2 N C V. The backward does two products for each forward one (the
    input and the weight gradients of a Linear; dP, dv and dq, dk in attention), so a step is
    3 forwards."""
    vocab, length, width, _, layers, batch = SIZES[size]
    rows = batch * length
    forward = layers * (24 * rows * width ** 2 + 4 * batch * length ** 2 * width) \
        + 2 * rows * width * vocab
    return {"forward": float(forward), "step": 3.0 * forward}


def torch_mirror(model: GPT):
    """reference/gpt.py's TinyGPT with model's weights copied in (same names, same dtype)."""
    import torch

    reference = Path(__file__).resolve().parent.parent / "reference"
    if str(reference) not in sys.path:
        sys.path.insert(0, str(reference))
    from gpt import TinyGPT  # reference/gpt.py

    c = model.config
    mirror = TinyGPT(c.vocab_size, c.max_context, c.width, c.heads, c.layers)
    dtype = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
    mirror = mirror.to(dtype[model.dtype])
    state = {name: torch.from_numpy(array.copy()) for name, array in model.state_dict().items()}
    mirror.load_state_dict(state, strict=True)
    return mirror


def check_agreement(model: GPT, mirror, ids: np.ndarray) -> float:
    """The largest |logits difference| of the two models; raises if they disagree."""
    import torch

    ours, _ = model.forward(ids)
    with torch.no_grad():
        theirs = mirror(torch.from_numpy(ids)).numpy()
    rtol, atol = LOGIT_TOLERANCE[np.dtype(model.dtype).name]
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol,
                               err_msg="numpy_tf and the torch mirror disagree on the logits")
    return float(np.abs(ours - theirs).max())
