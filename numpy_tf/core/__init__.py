"""The core every other part stands on, importing nothing else of numpy_tf: Parameter and
Module (module.py), the checks of user input (validate.py), what "equal" means (tolerances.py),
safe .npz files (npz.py), erf / erfc (special.py), and the one text-table printer of every
report (table.py)."""
from .module import (FLOAT_DTYPES, Module, ModuleList, Parameter, Sequential, float_dtype,
                     record_activations)
from .special import erf, erfc
