"""The thread settings (numpy_tf.core.threads): the default rule as a pure function of the
cores and the load, what use_threads sets, and the --threads option of the commands."""
import csv
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_tf.cli import main
from numpy_tf.core import threads
from numpy_tf.kernels.blocks import worker_threads


@pytest.mark.parametrize("cores, load, machine, expected", [
    (2, 0.0, None, 2),          # an idle 2-core machine: both cores
    (2, 0.4, None, 2),          # a little load rounds away
    (2, 0.6, None, 1),          # more than half a core busy: one idle core
    (2, 13.3, None, 1),         # 13 runnable processes on 2 cores: still one thread, never 0
    (8, 3.0, None, 5),
    (8, 8.0, None, 1),
    (2, 10.0, 64, 2),           # a 2-core affinity mask on a 64-core machine with 10 busy
    (16, 60.0, 64, 4),          # ... a 16-core mask on it, 60 busy: the 4 idle cores
    (1, 0.0, None, 1),
])
def test_the_default_is_the_idle_cores_and_at_least_one(cores, load, machine, expected):
    assert threads.default_threads(cores, load, machine) == expected


@given(st.integers(1, 256), st.floats(0.0, 1000.0), st.integers(0, 256))
def test_the_default_never_exceeds_the_cores_nor_the_idle_ones(cores, load, more):
    machine = cores + more
    count = threads.default_threads(cores, load, machine)
    assert 1 <= count <= cores
    assert count == 1 or count <= machine - load + 0.5


def test_machine_threads_reads_the_affinity_and_the_load(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 5.0, 5.0))
    assert threads.machine_threads() == 3             # the mask, not the 4 cores
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    assert threads.machine_threads() == 2             # 4 cores, 2 busy
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert threads.machine_threads() == 1


def _blas_threads() -> set:
    from threadpoolctl import threadpool_info
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_use_threads_sets_the_blas_and_leaves_the_blocks_on_one_thread(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.delenv("NUMPY_TF_NUM_THREADS", raising=False)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):   # restored on leaving
        line = threads.use_threads(2)
        assert worker_threads() == 1 and _blas_threads() == {2}
        assert line == "threads: 2; numpy_tf blocks 1, BLAS 2"
        threads.use_threads(1)
        assert worker_threads() == 1 and _blas_threads() == {1}


def test_an_explicit_count_keeps_the_blocks_variable(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setenv("NUMPY_TF_NUM_THREADS", "2")
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        line = threads.use_threads(1)
        assert worker_threads() == 2 and _blas_threads() == {1}
    assert line == "threads: 1; numpy_tf blocks as NUMPY_TF_NUM_THREADS=2, BLAS 1"


def test_the_default_keeps_what_the_environment_chose(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setenv("NUMPY_TF_NUM_THREADS", "3")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "machine_threads", lambda: 2)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        line = threads.use_threads()
        assert worker_threads() == 3 and _blas_threads() == {1}
    assert "NUMPY_TF_NUM_THREADS=3" in line and "OPENBLAS_NUM_THREADS=1" in line


def test_the_default_uses_the_idle_cores_where_nothing_is_set(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    for name in threads.BLAS_VARIABLES + (threads.BLOCK_VARIABLE,):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "machine_threads", lambda: 2)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        assert threads.use_threads() == "threads: 2 (idle cores); numpy_tf blocks 1, BLAS 2"
        assert worker_threads() == 1 and _blas_threads() == {2}


def test_without_threadpoolctl_the_blas_is_left_and_the_line_says_how(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_threadpoolctl(name, *args, **kwargs):
        if name == "threadpoolctl":
            raise ImportError("no threadpoolctl")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_threadpoolctl)
    monkeypatch.delenv("NUMPY_TF_NUM_THREADS", raising=False)
    line = threads.use_threads(1)
    assert worker_threads() == 1
    assert "BLAS unchanged" in line and "OPENBLAS_NUM_THREADS" in line


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_use_threads_refuses_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="threads must be a positive integer; got"):
        threads.use_threads(bad)


@pytest.mark.parametrize("command", [["train", "--steps", "1"], ["generate", "--prompt", "a"]])
@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "two", ""])
def test_a_bad_thread_count_is_one_line_and_status_2(capsys, command, bad):
    assert main(command + ["--threads", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--threads must be a positive integer" in err and repr(bad) in err


def test_train_runs_on_the_threads_given_and_says_so(tmp_path, capsys, monkeypatch):
    pytest.importorskip("threadpoolctl")
    monkeypatch.delenv("NUMPY_TF_NUM_THREADS", raising=False)     # restored after the test
    assert main(["train", "--config", "tiny-gpt", "--steps", "2", "--batch-size", "2",
                 "--out", str(tmp_path), "--sample-tokens", "2", "--threads", "1"]) == 0
    assert "[threads: 1; numpy_tf blocks 1, BLAS 1]" in capsys.readouterr().out
    assert worker_threads() == 1 and _blas_threads() == {1}


def test_benchmark_thread_counts(capsys):
    from benchmarks.run import thread_counts
    assert thread_counts("1,2") == [1, 2] and thread_counts("4") == [4]
    for bad in ("0", "1,-1", "1.5", "", "1,,2"):
        with pytest.raises(SystemExit) as stopped:
            thread_counts(bad)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--threads must be positive integers" in err


def test_train_splits_the_batch_only_when_threads_are_given(tmp_path, capsys, monkeypatch):
    """--threads 2 hands the Trainer a BatchSplit (numpy_tf.training.split; tiny-gpt's parts
    would be too small, so its batches still run whole: tests/test_split.py checks the parts'
    values); without --threads the Trainer runs the objective itself."""
    pytest.importorskip("threadpoolctl")
    monkeypatch.delenv("NUMPY_TF_NUM_THREADS", raising=False)
    losses = {}
    for given in ("1", "2", None):
        out = tmp_path / str(given)
        argv = ["train", "--config", "tiny-gpt", "--steps", "3", "--batch-size", "4",
                "--out", str(out), "--sample-tokens", "0", "--log-every", "1"]
        assert main(argv + (["--threads", given] if given else [])) == 0
        said = capsys.readouterr().out
        assert ("batch in up to 2 parts on 2 threads" in said) == (given == "2"), said
        with open(out / "history.csv") as history:
            losses[given] = [float(row["loss"]) for row in csv.DictReader(history)]
    assert len(losses["2"]) == 3 and losses["2"] != [0.0] * 3
    np.testing.assert_allclose(losses["2"], losses["1"], rtol=1e-6)
