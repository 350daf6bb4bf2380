"""Checking: finite-difference gradient checks (finite_differences.py), the case file format
(case_file.py), whole-model case export (export.py), tensor-by-tensor comparison (compare.py)
and the other frameworks' conventions it explains (conventions.py), the low-precision budget
of `compare --precision` (precision.py), the FlashAttention case with its tile statistics
(flash_case.py), the runner of the torch fixtures behind `numpy-tf check` (fixtures.py), and
the bridges that run a torch module (torch_bridge.py) or a JAX / Flax model (jax_bridge.py) on
a case (torch and jax are imported inside their functions)."""
from .case_file import Case
from .finite_differences import GradcheckReport, gradcheck, gradcheck_module
