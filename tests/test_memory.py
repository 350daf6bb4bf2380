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
