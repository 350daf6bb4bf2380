"""numpy_tf.core.memory.reuse_freed_memory: a repeated step touches no new pages.

Each case runs in a fresh Python process (the setting is process-wide): a "step" allocates and
frees six buffers of 8 to 24 MiB, as a training step does its activations; the third step's
minor page faults are counted (resource.getrusage)."""
import platform
import subprocess
import sys

import pytest

from numpy_tf.core import memory

STEP = """
import resource, sys
import numpy as np
if sys.argv[1] == "reuse":
    from numpy_tf.core.memory import reuse_freed_memory
    assert reuse_freed_memory().startswith("freed memory kept"), reuse_freed_memory()
def step():
    buffers = [np.ones(2**20 * (i % 3 + 1)) for i in range(6)]
    return sum(float(b[0]) for b in buffers)
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def faults_of_a_repeated_step(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", STEP, mode], capture_output=True, text=True,
                          check=True)
    return int(done.stdout.split()[-1])


@glibc
def test_a_repeated_step_touches_no_new_pages():
    plain = faults_of_a_repeated_step("plain")
    assert plain > 1000, f"the control step faulted only {plain} times: nothing to show here"
    assert faults_of_a_repeated_step("reuse") < 50


@glibc
def test_it_says_what_it_set():
    assert memory.reuse_freed_memory() == ("freed memory kept for reuse (mmap threshold 32 "
                                           "MiB, trim threshold 1 GiB)")


def test_elsewhere_it_changes_nothing_and_says_so(monkeypatch):
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.reuse_freed_memory() == "allocator unchanged (not glibc)"


# -- the backward lets the gradient of the logits go ------------------------------------------
def _family(family: str):
    import numpy as np

    from numpy_tf import GPT, Bert, BertConfig, GPTConfig, GPTNeoX, Llama, LlamaConfig, NeoXConfig
    from numpy_tf.models import Gemma, GemmaConfig
    from numpy_tf.models.mixtral import Mixtral, MixtralConfig, MixtralLoss
    from numpy_tf.models.objectives import MaskedLMLoss, NextTokenLoss

    ids = np.random.default_rng(0).integers(1, 30, (2, 6))
    small = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_attention_heads=4)
    labels = np.where(np.arange(6) % 2 == 0, ids, -100)
    build = {
        "gpt": lambda: (NextTokenLoss(GPT(GPTConfig.tiny(vocab_size=32), rng=0)), (ids,)),
        "llama": lambda: (NextTokenLoss(Llama(LlamaConfig(**small, num_key_value_heads=2),
                                              rng=0)), (ids,)),
        "gemma": lambda: (NextTokenLoss(Gemma(GemmaConfig(**small, num_key_value_heads=2),
                                              rng=0)), (ids,)),
        "neox": lambda: (NextTokenLoss(GPTNeoX(NeoXConfig(**small, rotary_pct=0.5), rng=0)),
                         (ids,)),
        "mixtral": lambda: (MixtralLoss(Mixtral(MixtralConfig(
            **small, num_key_value_heads=2, num_local_experts=4), rng=0)), (ids,)),
        "bert": lambda: (MaskedLMLoss(Bert(BertConfig(), rng=0)), (ids, labels)),
    }
    return build[family]()


@pytest.mark.parametrize("family", ["gpt", "llama", "gemma", "neox", "mixtral", "bert"])
def test_the_backward_lets_dlogits_go_once_the_head_has_used_it(monkeypatch, family):
    """The (B, T, V) gradient of the logits, often the step's largest array, is dead before
    the first block's backward starts (a weak reference to it is cleared): no frame of the
    objective's or the model's backward keeps it."""
    import re
    import weakref

    from numpy_tf.layers import cross_entropy_loss
    from numpy_tf.models import mixtral, objectives

    objective, inputs = _family(family)
    made = []

    def remembered(dloss, cache):
        dlogits = cross_entropy_loss.cross_entropy_backward(dloss, cache)
        made.append(weakref.ref(dlogits))
        return dlogits

    for module in (objectives, mixtral):
        monkeypatch.setattr(module, "cross_entropy_backward", remembered)
    seen = []
    blocks = [m for name, m in objective.named_modules()
              if re.fullmatch(r".*\.(blocks|layers|layer)\.\d+", name)]
    assert len(blocks) > 1, family
    first = blocks[-1]                              # the block nearest the head

    backward = first.backward

    def watched(*args, **kwargs):
        seen.append(made[-1]() is None)
        return backward(*args, **kwargs)

    first.backward = watched
    loss, cache = objective.forward(*inputs)
    objective.backward(1.0, cache)
    assert made and seen and all(seen), family


# -- what the step's backward holds at its peak (tracemalloc, deterministic) -------------------
def _traced_peak(function) -> int:
    """Bytes traced at function()'s peak beyond what was traced when it started."""
    import tracemalloc

    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        function()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def test_linear_backward_lets_the_weight_gradient_temporary_go_before_dx_exists():
    """dW's (OUT, IN) temporary is added into the gradient and freed before the (N, IN) dx
    is made: the peak is the larger of the two, not their sum."""
    import numpy as np

    from numpy_tf.kernels.linear import linear_backward_into

    rng = np.random.default_rng(0)
    x, weight = rng.standard_normal((256, 96)), rng.standard_normal((64, 96))
    dout, weight_grad = rng.standard_normal((256, 64)), np.zeros((64, 96))
    peak = _traced_peak(lambda: linear_backward_into(dout, x, weight, weight_grad, None))
    dx_bytes, dweight_bytes = x.nbytes, weight.nbytes
    assert peak < dx_bytes + dweight_bytes - 4096, (peak, dx_bytes, dweight_bytes)


def _pre_ln_block():
    import numpy as np

    from numpy_tf import GPTConfig
    from numpy_tf.models.gpt import DecoderBlock

    config = GPTConfig(vocab_size=16, max_context=32, width=32, heads=4, layers=1)
    block = DecoderBlock(config, rng=0)
    x = np.random.default_rng(1).standard_normal((24, 32, 32))     # 2 chunks: the kernels
    dy = np.random.default_rng(2).standard_normal(x.shape)
    return block, x, dy


def test_a_block_writing_du_into_dy_gives_the_same_bits():
    """overwrite_dy=True (what GPT.backward asks of its blocks) changes where du lives, not
    what any gradient is; without it dy is left as it was."""
    import numpy as np

    block, x, dy = _pre_ln_block()
    _, cache = block.forward(x)
    kept = dy.copy()
    dx_plain = block.backward(dy, cache)
    grads_plain = {name: p.grad.copy() for name, p in block.named_parameters()}
    assert np.array_equal(dy, kept)
    block.zero_grad()
    written = dy.copy()
    dx_written = block.backward(written, cache, overwrite_dy=True)
    assert not np.array_equal(written, kept)            # du went into dy's own array
    assert dx_written.tobytes() == dx_plain.tobytes()
    for name, p in block.named_parameters():
        assert p.grad.tobytes() == grads_plain[name].tobytes(), name


def test_attention_backward_runs_with_one_block_sized_gradient_fewer():
    """With overwrite_dy the block's backward peaks at least one (B, T, C) array lower: du
    lives in dy's array, and the heads' gradient is let go before the qkv Linear's backward."""
    block, x, dy = _pre_ln_block()
    _, cache = block.forward(x)
    plain = _traced_peak(lambda: block.backward(dy.copy(), cache))
    written = _traced_peak(lambda: block.backward(dy.copy(), cache, overwrite_dy=True))
    assert plain - written >= dy.nbytes, (plain, written, dy.nbytes)


def test_fused_attention_lets_the_heads_gradient_go_before_the_qkv_backward(monkeypatch):
    """The (B, H, T, d) gradient of the heads that qkv_gradient reads is dead by the time
    the qkv Linear's backward (the step's peak) starts."""
    import weakref

    from numpy_tf.layers import multihead

    block, x, dy = _pre_ln_block()
    attention = block.attention
    _, cache = attention.forward(x, is_causal=True)
    assert type(cache.attention).__name__ == "AttentionKernelCache"
    made, seen = [], []
    qkv_gradient, qkv_backward = multihead.qkv_gradient, attention.qkv.backward

    def remembered(dheads, *rest):
        made.append(weakref.ref(dheads))
        return qkv_gradient(dheads, *rest)

    def watched(*args):
        seen.append(made[-1]() is None)
        return qkv_backward(*args)

    monkeypatch.setattr(multihead, "qkv_gradient", remembered)
    attention.qkv.backward = watched
    attention.backward(dy, cache)
    assert made and seen == [True]
