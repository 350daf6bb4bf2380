"""pytest and hypothesis settings shared by every test.

Hypothesis profiles: "ci" (the default) is derandomized and bounded so a run is repeatable and
fast; "dev" draws more examples with fresh randomness. Choose with HYPOTHESIS_PROFILE=dev.
"""
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=25, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
