"""Checks of a user's input, run before any computation (SPEC §8).

Each check raises a TypeError (wrong kind or dtype) or ValueError (wrong shape or value) whose
message names the argument, says what was expected and what was given.
"""
from __future__ import annotations

import numpy as np

from .core import FLOAT_DTYPES


def _describe_ndim(ndim) -> str:
    if isinstance(ndim, tuple):
        return " or ".join(str(n) for n in ndim)
    return str(ndim)


def float_array(name: str, x, *, ndim=None, min_ndim: int | None = None, shape: str = ""):
    """`x` must be a float32/float64 ndarray; `ndim` an int or tuple of allowed ranks.
    `shape` is the legend shown in the message, e.g. "(B, T, C)"."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64; got dtype {x.dtype}")
    legend = f" {shape}" if shape else ""
    if ndim is not None:
        allowed = ndim if isinstance(ndim, tuple) else (ndim,)
        if x.ndim not in allowed:
            raise ValueError(f"{name} must have {_describe_ndim(ndim)} dimensions{legend}; "
                             f"got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions{legend}; "
                         f"got shape {x.shape}")
    return x


def same_dtype(**arrays) -> np.dtype:
    """All given arrays (None ones skipped) share one dtype; the message names the two that
    disagree."""
    named = [(name, a) for name, a in arrays.items() if a is not None]
    first_name, first = named[0]
    for name, array in named[1:]:
        if array.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {array.dtype} but {first_name} has dtype "
                            f"{first.dtype}; numpy_tf never casts silently, so convert one "
                            "of them (or build the layer with the matching dtype=)")
    return first.dtype


def last_dim(name: str, x: np.ndarray, size: int, what: str = "") -> None:
    if x.shape[-1] != size:
        detail = f" ({what})" if what else ""
        raise ValueError(f"{name} must have last dimension {size}{detail}; got shape {x.shape}")


def integer_array(name: str, ids, *, ndim=None, shape: str = "") -> np.ndarray:
    """`ids` must be an ndarray of an integer dtype (bool is not an integer here)."""
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of integers; got {type(ids).__name__}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must be integers; got dtype {ids.dtype}")
    legend = f" {shape}" if shape else ""
    if ndim is not None:
        allowed = ndim if isinstance(ndim, tuple) else (ndim,)
        if ids.ndim not in allowed:
            raise ValueError(f"{name} must have {_describe_ndim(ndim)} dimensions{legend}; "
                             f"got shape {ids.shape}")
    return ids


def ids_in_range(name: str, ids: np.ndarray, size: int, *, allowed_extra: int | None = None):
    """Every id in [0, size) (or equal to `allowed_extra`, e.g. an ignore_index); the message
    gives the offending value and its position."""
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= size)
    if allowed_extra is not None:
        bad &= ids != allowed_extra
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        value = int(ids[position])
        extra = f" (or {allowed_extra})" if allowed_extra is not None else ""
        raise ValueError(f"{name} must be integers in [0, {size}){extra}; got {value} at "
                         f"position {position}")


def choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; "
                         f"got {value!r}")


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def even_positive_int(name: str, value, what: str = "") -> int:
    """A positive even integer (a width split into pairs); `what` says why it must be even."""
    value = positive_int(name, value)
    if value % 2:
        reason = f" ({what})" if what else ""
        raise ValueError(f"{name} must be even{reason}; got {value}")
    return value


def non_negative_int(name: str, value) -> int:
    """An integer >= 0: a Python or NumPy integer, or a 0-d integer array (how a case file
    stores a scalar)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    return int(value)


def positive_float(name: str, value) -> float:
    """A finite number > 0 (an eps, a base), returned as a Python float so that it never
    upcasts a float32 array (NumPy 2 keeps np.float64 scalars float64)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def non_negative_entries(name: str, values: np.ndarray) -> None:
    """Every entry >= 0 (positions); the message gives the first negative value and where."""
    negative = values < 0
    if negative.any():
        position = tuple(int(i) for i in np.argwhere(negative)[0])
        raise ValueError(f"{name} must be non-negative; got {int(values[position])} at "
                         f"position {position}")
