"""How many threads numpy_tf runs on: NumPy's BLAS, and its own blocks (kernels/blocks.py).

Two pools could do the work of a step: NumPy's BLAS (OpenBLAS, MKL, ...) in the matrix
products, and map_blocks's worker threads in the elementwise kernels. `use_threads(n)` sets
the BLAS to n and leaves the blocks on one thread unless NUMPY_TF_NUM_THREADS says otherwise:

- the BLAS, through threadpoolctl (optional: `pip install threadpoolctl`, or the [bench]
  extra), which changes the count of an already loaded BLAS. Without threadpoolctl the BLAS
  keeps the count it read when NumPy loaded it, from OPENBLAS_NUM_THREADS / OMP_NUM_THREADS /
  MKL_NUM_THREADS (all cores when none is set): a process cannot change it afterwards, so set
  those variables before starting Python (`OPENBLAS_NUM_THREADS=1 numpy-tf train ...`).
- the blocks, NUMPY_TF_NUM_THREADS in this process's environment (map_blocks reads it on each
  call), 1 when unset. One thread is the faster on the machines measured: NumPy's ufuncs
  release the GIL, but a block's operations are short (a pass over 32,768 elements takes a few
  microseconds) and the threads spend the time handing the GIL to each other, while after each
  product OpenBLAS's workers keep spinning on the other cores. Measured in the same process,
  step by step, at 2 BLAS threads on a 2-core AMD EPYC: two block threads made the step of the
  benchmarks' small and medium float32 GPT 6 % and 8 % slower than one (small float64 2 %).

With no count given, `use_threads()` keeps what the environment chose (the BLAS variables for
the BLAS) and sets the rest to `default_threads`: never more threads than idle cores, at least
one. On a machine busy with other processes, a BLAS spinning on every core only takes turns
with them (measured: `train` 4.6 times slower with the default BLAS threads than with one,
under load).
"""
from __future__ import annotations

import contextlib
import functools
import os

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                  "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
BLOCK_VARIABLE = "NUMPY_TF_NUM_THREADS"


def default_threads(cores: int, load: float, machine_cores: int | None = None) -> int:
    """The default thread count: the idle cores, at most the `cores` this process may run on,
    at least 1,

        max(1, min(cores, round(machine_cores - load)))

    `load` is the machine's load average (runnable processes, over all its cores), and
    `machine_cores` the machine's cores (default `cores`): the load counts processes on every
    core, also those this process may not use."""
    machine = cores if machine_cores is None else machine_cores
    return max(1, min(int(cores), int(round(machine - load))))


def machine_threads() -> int:
    """default_threads on this machine: the cores in this process's affinity mask
    (os.sched_getaffinity, or os.cpu_count where there is none), the machine's cores and its
    one-minute load average (os.getloadavg; 0 where there is none)."""
    machine = os.cpu_count() or 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = machine
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return default_threads(cores, load, max(machine, cores))


def use_threads(threads: int | None = None) -> str:
    """Run NumPy's BLAS on `threads` threads (a positive int); None keeps the environment's
    setting, else gives the BLAS machine_threads(). numpy_tf's blocks stay as
    NUMPY_TF_NUM_THREADS says, on one thread when it is unset. Returns one line that says what
    was set."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be a positive integer; got {threads!r}")
    count = machine_threads() if threads is None else threads
    if os.environ.get(BLOCK_VARIABLE, "").strip():
        blocks = f"numpy_tf blocks as {BLOCK_VARIABLE}={os.environ[BLOCK_VARIABLE]}"
    else:
        blocks = "numpy_tf blocks 1"         # the faster (the module says why)
    chosen = [name for name in BLAS_VARIABLES if os.environ.get(name, "").strip()]
    if threads is None and chosen:
        blas = f"BLAS as {chosen[0]}={os.environ[chosen[0]]}"
    else:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            blas = ("BLAS unchanged (threadpoolctl is not installed: pip install "
                    "threadpoolctl, or set OPENBLAS_NUM_THREADS before starting)")
        else:
            threadpool_limits(limits=count, user_api="blas")
            blas = f"BLAS {count}"
    origin = "" if threads is not None else " (idle cores)"
    return f"threads: {count}{origin}; {blocks}, {blas}"


@functools.lru_cache(maxsize=1)
def _blas_controllers() -> tuple:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process; () without
    threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


def _environment_blas_threads() -> int | None:
    """The BLAS thread count the environment set before NumPy loaded it (the first of
    BLAS_VARIABLES that is set), None when none is or it is not a count."""
    for name in BLAS_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return int(value) if value.isdigit() else None
    return None


def can_set_blas_threads() -> bool:
    """Whether blas_threads(1) puts NumPy's BLAS on one thread: with threadpoolctl installed, or
    without it when the environment already did (the first of BLAS_VARIABLES set is 1)."""
    return bool(_blas_controllers()) or _environment_blas_threads() == 1


@contextlib.contextmanager
def blas_threads(threads: int):
    """`with blas_threads(n):` NumPy's BLAS on n threads inside the block, on as many as before
    after it (through threadpoolctl, a few microseconds each way; without threadpoolctl the
    BLAS stays as it is)."""
    controllers = _blas_controllers()
    before = [controller.get_num_threads() for controller in controllers]
    for controller in controllers:
        controller.set_num_threads(threads)
    try:
        yield
    finally:
        for controller, count in zip(controllers, before):
            controller.set_num_threads(count)
