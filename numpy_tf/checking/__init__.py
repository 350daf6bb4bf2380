"""Checking: finite-difference gradient checks (finite_differences.py), the case file format
(case_file.py), whole-model case export (export.py), tensor-by-tensor comparison (compare.py),
the runner of the torch fixtures behind `numpy-tf check` (fixtures.py), and the bridge that
runs a torch module on a case (torch_bridge.py; torch is imported inside its function)."""
from .case_file import Case
from .finite_differences import GradcheckReport, gradcheck, gradcheck_module
