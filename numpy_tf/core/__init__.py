"""The core every other part stands on, importing nothing else of numpy_tf: Parameter and
Module (module.py), the checks of user input (validate.py), what "equal" means (tolerances.py),
safe .npz files (npz.py), erf / erfc (special.py), the one text-table printer of every report
(table.py), the switch between the kernels and the reference functions (paths.py:
reference_path, kernels_enabled), and the threads of the kernels' blocks and NumPy's BLAS
(threads.py: use_threads, default_threads)."""
from .module import (FLOAT_DTYPES, Module, ModuleList, Parameter, Sequential, SequentialCache,
                     float_dtype, record_activations)
from .npz import FileFormatError
from .paths import kernels_enabled, reference_path
from .special import erf, erfc
