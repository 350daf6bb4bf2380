"""map_blocks: a function run on the consecutive blocks of range(size), on worker threads.

A block is a fixed number of bytes, BLOCK_BYTES, of the array (65,536 float32 elements or
32,768 float64): small enough that a kernel's few block-sized temporaries stay in a core's
cache and come back from the allocator's heap instead of being fresh pages from the system each
time, and large enough that the Python calls made per block cost little next to the arithmetic.
Measured on the exact GELU's forward and backward of the benchmarks' small GPT (16 x 64 x 512
elements, 1 thread, best of 7): float32 2.39 ms in blocks of 32,768 elements, 1.84 in blocks of
65,536, 2.01 in 131,072; float64 6.26 in 32,768, 6.49 in 65,536. Each block's calls are calls
made holding the GIL, so fewer blocks also means less waiting when the parts of a BatchSplit
step run on two threads.

The threads are NUMPY_TF_NUM_THREADS, 1 when unset, the faster on the machines measured
(numpy_tf.core.threads says why and by how much): a block's passes are short, and Python
threads spend the time handing the GIL to each other while OpenBLAS's workers spin on the other
cores after each product.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

BLOCK_BYTES = 1 << 18       # bytes of the array per block: 256 KiB


def block_size(itemsize: int) -> int:
    """The elements of a block of an array whose elements take `itemsize` bytes."""
    return max(1, BLOCK_BYTES // itemsize)


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


def map_blocks(function: Callable[[slice], None], size: int, itemsize: int) -> None:
    """function(block) for the consecutive slices of range(size), block_size(itemsize)
    elements each, spread over worker_threads() threads (in order on the calling thread when
    one suffices). `function` writes its block's results into arrays the caller owns, of
    elements of `itemsize` bytes; blocks never overlap."""
    step = block_size(itemsize)
    if size <= step:
        function(slice(0, size))
        return
    blocks = [slice(start, start + step) for start in range(0, size, step)]
    threads = min(worker_threads(), len(blocks))
    if threads <= 1:
        for block in blocks:
            function(block)
        return
    for _ in _pool(threads).map(function, blocks):     # re-raises a block's exception
        pass
