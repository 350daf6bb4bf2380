"""Freed memory kept for the next step: glibc's malloc told not to hand large buffers back to the
system, so that a training step reuses the pages of the step before.

A step allocates the same arrays every time: activations, probabilities, gradients, most of
them larger than glibc's default threshold for mapping a buffer of its own (128 KiB, raised as
buffers are freed). Such a buffer is unmapped when freed, and the next step's buffer of the same
size is fresh pages again, each first touch a page fault the kernel must serve (about 44,000
per step of the benchmarks' medium GPT). `reuse_freed_memory()` sets two of glibc's malloc
parameters through mallopt (the MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ environment
variables set the same ones at start-up):

- M_MMAP_THRESHOLD = 32 MiB, the largest glibc accepts on 64-bit systems: buffers up to that
  size come from the heap, where a freed one is reused by the next allocation;
- M_TRIM_THRESHOLD = 1 GiB: the heap's free top is handed back to the system only beyond that.

Nothing is computed differently, and the peak memory is the same: what stays with the process
after a step is what the step's peak needed. The process's resident size stays near that peak
until it exits. `numpy-tf train` and `generate` and the benchmarks call this; in a script of
your own, call it once. Elsewhere than glibc (macOS, Windows, musl) it changes nothing and
says so.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3         # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30


def reuse_freed_memory() -> str:
    """Set glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD as the module says; returns one line
    saying what was done."""
    if not sys.platform.startswith("linux"):
        return "allocator unchanged (not glibc)"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "allocator unchanged (no mallopt)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or \
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "allocator unchanged (mallopt refused)"
    return "freed memory kept for reuse (mmap threshold 32 MiB, trim threshold 1 GiB)"
