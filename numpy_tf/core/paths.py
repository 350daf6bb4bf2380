"""Which tier a layer class runs: the kernels (numpy_tf.kernels, the default) or the reference
functions (`<name>_forward` / `<name>_backward`, the ones `numpy-tf explain` prints).

    with numpy_tf.reference_path():
        logits, cache = model.forward(ids)      # every layer runs its reference function
        model.backward(dlogits, cache)

The setting is read by each layer class's forward. A backward follows its cache, not the
setting: a cache made by a kernel is undone by the kernel's backward and a reference cache by
the reference backward, wherever the backward is called. The setting is a context variable, so
each thread (and each asyncio task) has its own, and a `with` block restores what it found.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_KERNELS_ENABLED = contextvars.ContextVar("numpy_tf_kernels_enabled", default=True)


def kernels_enabled() -> bool:
    """True unless the caller is inside `reference_path()`."""
    return _KERNELS_ENABLED.get()


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Inside the block, every layer class runs its reference functions instead of its
    kernels; on leaving it, the previous setting is back (nested blocks are fine)."""
    token = _KERNELS_ENABLED.set(False)
    try:
        yield
    finally:
        _KERNELS_ENABLED.reset(token)
