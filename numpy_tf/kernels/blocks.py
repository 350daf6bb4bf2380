"""map_blocks: a function run on the consecutive blocks of range(size), on worker threads.

A block is small enough that its temporaries come back from the allocator's heap instead of
being fresh pages from the system each time, and large enough that the Python calls made per
block cost little next to the arithmetic. The threads are NUMPY_TF_NUM_THREADS, 1 when unset,
the faster on the machines measured (numpy_tf.core.threads says why and by how much): a
block's passes are short, and Python threads spend the time handing the GIL to each other
while OpenBLAS's workers spin on the other cores after each product.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

BLOCK = 32768      # elements per block: 256 KB of float64 per temporary


def worker_threads() -> int:
    """The threads map_blocks uses: NUMPY_TF_NUM_THREADS if it is set to a positive count,
    else 1."""
    return _threads_for(os.environ.get("NUMPY_TF_NUM_THREADS"))


@functools.lru_cache(maxsize=16)
def _threads_for(setting: str | None) -> int:
    value = (setting or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


@functools.lru_cache(maxsize=None)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="numpy_tf")


def map_blocks(function: Callable[[slice], None], size: int) -> None:
    """function(block) for the consecutive slices of range(size), BLOCK elements each, spread
    over worker_threads() threads (in order on the calling thread when one suffices).
    `function` writes its block's results into arrays the caller owns; blocks never overlap."""
    if size <= BLOCK:
        function(slice(0, size))
        return
    blocks = [slice(start, start + BLOCK) for start in range(0, size, BLOCK)]
    threads = min(worker_threads(), len(blocks))
    if threads <= 1:
        for block in blocks:
            function(block)
        return
    for _ in _pool(threads).map(function, blocks):     # re-raises a block's exception
        pass
