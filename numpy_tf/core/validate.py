"""Checks of a user's input, run before any computation (SPEC §8).

Each check raises a TypeError (wrong kind or dtype) or ValueError (wrong shape or value) whose
message names the argument, says what was expected and what was given.
"""
from __future__ import annotations

import math

import numpy as np

from .module import FLOAT_DTYPES, Module


def _describe_ndim(ndim) -> str:
    if isinstance(ndim, tuple):
        return " or ".join(str(n) for n in ndim)
    return str(ndim)


def plain_arithmetic(name: str, x: np.ndarray) -> None:
    """Refuse the two ndarray subclasses whose operations mean something else: numpy.matrix
    (always 2-D, its * a matrix product: LayerNorm's x - mean would not broadcast) and numpy.ma's
    masked arrays (a mask that numpy_tf's layers would drop in some operations and carry in
    others). Any other subclass is merely unusual and passes."""
    if type(x) is np.ndarray:
        return
    if isinstance(x, np.matrix):
        raise TypeError(f"{name} must be a plain numpy array, not a numpy.matrix (whose * is a "
                        f"matrix product); pass np.asarray({name})")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain numpy array, not a masked array (numpy_tf "
                        f"reads no mask); pass {name}.filled(value), or np.asarray({name}) "
                        "for its data as it is")


def float_array(name: str, x, *, ndim=None, min_ndim: int | None = None, shape: str = ""):
    """`x` must be a float32/float64 ndarray (not a matrix or masked array: plain_arithmetic);
    `ndim` an int or tuple of allowed ranks. `shape` is the legend shown in the message, e.g.
    "(B, T, C)"."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(x).__name__}")
    plain_arithmetic(name, x)
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


def is_plain_input(x, dtype: np.dtype, last: int) -> bool:
    """The usual case, tested in one expression: x is an ndarray of `dtype` whose last axis
    has `last` entries. A layer that gets False runs its full checks, which say what is wrong
    (or let through what is merely unusual, such as an ndarray subclass)."""
    return type(x) is np.ndarray and x.dtype == dtype and x.ndim > 0 and x.shape[-1] == last


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
    plain_arithmetic(name, ids)
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
    if ids.size == 0 or (allowed_extra is None and ids.min() >= 0 and ids.max() < size):
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


def module(name: str, value, kind: type = Module, what: str = "a numpy_tf Module"):
    """`value` is a `kind` (a Module, or a model class), else a TypeError naming it."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}; got {kind_of(value)}")
    return value


def choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; "
                         f"got {value!r}")


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def token_ids(name: str, ids, *, size: int | None = None) -> np.ndarray:
    """A 1-D sequence of token ids as an int64 array: an integer ndarray, or a list/tuple of
    Python ints (an empty list is an empty sequence, not a float array). With `size`, every id
    must be in [0, size)."""
    if not isinstance(ids, np.ndarray):
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"{name} must be a 1-D array or list of integer ids; got "
                            f"{type(ids).__name__}")
        ids = np.asarray(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    integer_array(name, ids, ndim=1, shape="(N,)")
    if size is not None:
        ids_in_range(name, ids, size)
    return ids.astype(np.int64, copy=False)


def integer(name: str, value) -> int:
    """A Python or NumPy integer (bool is refused: True is not a length)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r}")
    return int(value)


def generator(name: str, rng, *, allow_none: bool = False):
    """An explicit numpy.random.Generator (a seed is refused so that every shuffle's source is
    visible: pass np.random.default_rng(seed))."""
    if rng is None and allow_none:
        return None
    if not isinstance(rng, np.random.Generator):
        expected = "None or a numpy.random.Generator" if allow_none else \
            "a numpy.random.Generator"
        raise TypeError(f"{name} must be {expected} (e.g. np.random.default_rng(0)); got "
                        f"{type(rng).__name__}")
    return rng


def fraction(name: str, value) -> float:
    """A number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) \
            or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number strictly between 0 and 1; got {value!r}")
    return float(value)


def number(name: str, value, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """A real number (not a bool, not NaN; finite unless `finite=False`, for a choice such as
    an infinity norm) in the given interval, returned as a Python float, so that a float32
    array times it stays float32 (a numpy float64 scalar would upcast it). NumPy scalars
    (np.float32(0.7)) are numbers too. `low_open`/`high_open` exclude the end point."""
    interval = ""
    if low is not None or high is not None:
        left = "-inf" if low is None else f"{low:g}"
        right = "inf" if high is None else f"{high:g}"
        interval = (f" in {'(' if low_open or low is None else '['}{left}, {right}"
                    f"{')' if high_open or high is None else ']'}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number{interval}; got {value!r}")
    given, value = value, float(value)
    if finite and value in (math.inf, -math.inf):
        raise ValueError(f"{name} must be a finite number{interval}; got {given!r}")
    if (value != value or (low is not None and (value < low or (low_open and value == low)))
            or (high is not None and (value > high or (high_open and value == high)))):
        raise ValueError(f"{name} must be a number{interval}; got {given!r}")
    return value


def flag(name: str, value) -> bool:
    """A plain bool (a 0 or "no" is more likely a mistake than a choice)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)


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


def mask_array(name: str, mask, shapes: dict[str, tuple], dtype,
               meaning: str = "blocked") -> None:
    """None, or a bool mask (True = `meaning`) or a float mask of the inputs' `dtype` (added to
    the scores) of one of the `shapes` ({legend: shape}, e.g. {"(T, T)": (4, 4)})."""
    if mask is None:
        return
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(mask).__name__}")
    plain_arithmetic(name, mask)
    if mask.dtype != bool and mask.dtype != dtype:
        raise TypeError(f"{name} must be bool (True = {meaning}) or a float mask of the input "
                        f"dtype {np.dtype(dtype)}; got dtype {mask.dtype}")
    if mask.shape not in shapes.values():
        allowed = " or ".join(f"{legend} = {shape}" for legend, shape in shapes.items())
        raise ValueError(f"{name} must have shape {allowed}; got {mask.shape}")


def over_defaults(name: str, given, defaults) -> dict:
    """`given` (a Mapping of keyword arguments) over `defaults`, each of its keys one of
    theirs; an unknown key is an error naming `name` (a class, "torch.nn.Transformer") and
    what numpy_tf reads."""
    unknown = [key for key in given if key not in defaults]
    if unknown:
        raise ValueError(f"{name} has no supported argument {', '.join(map(repr, unknown))}; "
                         f"numpy_tf reads {', '.join(defaults)}")
    return {**defaults, **given}


def kind_of(value) -> str:
    """How a message names what it got: a NamedTuple by its class, a plain tuple by its length."""
    if isinstance(value, tuple) and type(value) is not tuple:
        return f"a {type(value).__name__}"
    if isinstance(value, tuple):
        return f"a plain tuple of {len(value)} items"
    return f"a {type(value).__name__}"


def gradient(name: str, value, shape: tuple, dtype: np.dtype, layer: str = "the forward"):
    """An upstream gradient (`dout`): a real float ndarray of exactly `shape` and `dtype`, those
    of `layer`'s output. Another dtype is refused, not cast (a float64 dout would turn a float32
    layer's gradients into float64); so is a complex one, and one of the right size whose axes
    are in another order. A 0-d output (a loss) also takes a Python or NumPy real number."""
    if type(value) is np.ndarray and value.dtype == dtype and value.shape == shape:
        return value
    if shape == () and isinstance(value, (int, float, np.integer, np.floating)) \
            and not isinstance(value, (bool, np.bool_)):
        return value
    output = f"{layer}'s output"
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of the shape {shape} and dtype "
                        f"{np.dtype(dtype)} of {output}; got {type(value).__name__}")
    plain_arithmetic(name, value)
    if value.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a real float array of the dtype of {output} "
                        f"{np.dtype(dtype)}; got dtype {value.dtype}")
    if value.shape != shape:
        raise ValueError(f"{name} must have the shape of {output} {shape}; got {value.shape}")
    if value.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of {output} {np.dtype(dtype)}; got "
                        f"{value.dtype} (numpy_tf never casts a gradient: convert it)")
    return value


def cache_kind(cache, kind: type) -> None:
    """`cache` is a `kind`: the NamedTuple the matching forward returned (or a subclass)."""
    if not isinstance(cache, kind):
        raise TypeError(f"cache must be the {kind.__name__} its forward returned; got "
                        f"{kind_of(cache)}")


def backward_inputs(dout, cache, kind: type, name: str = "dout"):
    """The check that opens every backward: `cache` is a `kind` (the NamedTuple the matching
    forward returned, or a subclass of it), and `dout` is what `gradient` accepts for that
    forward's output, whose (shape, dtype) the cache gives as `cache.output_spec`. In the
    usual case that is one isinstance and three comparisons. Messages name the layer by its
    cache (GELUCache: "GELU's output")."""
    cache_kind(cache, kind)
    shape, dtype = cache.output_spec
    if type(dout) is np.ndarray and dout.dtype == dtype and dout.shape == shape:
        return dout
    return gradient(name, dout, shape, dtype, kind.__name__.removesuffix("Cache"))


def _shape_and_dtype(array) -> tuple | None:
    return None if array is None else (tuple(array.shape), np.dtype(array.dtype))


def cache_fits(what: str, made, own) -> None:
    """A layer's backward given a cache that a layer of another size or dtype made: `made` is
    the parameter as the cache saw it, `own` this layer's (arrays, compared by shape and dtype;
    None for an absent parameter; or plain values such as a bias flag)."""
    if made is own:
        return
    made, own = (_shape_and_dtype(a) if isinstance(a, np.ndarray) else a for a in (made, own))
    if made != own:
        def describe(spec):
            if spec is None:
                return "absent"
            return f"{spec[0]} {spec[1]}" if isinstance(spec, tuple) else repr(spec)
        raise ValueError(f"cache was made by a layer whose {what} is {describe(made)}; this "
                         f"layer's {what} is {describe(own)} (pass the cache this layer's "
                         "forward returned)")


def finite_number(name: str, value) -> float:
    """A finite real number (any sign), returned as a Python float (so that it never upcasts a
    float32 array)."""
    if isinstance(value, (bool, np.bool_)) or \
            not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a finite real number; got {value!r}")
    if not np.isfinite(value):
        raise ValueError(f"{name} must be a finite real number; got {value!r}")
    return float(value)
# -- the edges of models, training and sampling ---------------------------------------------------
def optional_index(name: str, value, size: int, what: str = "") -> int | None:
    """None, or an integer id in [0, size) (a padding or special token of a vocabulary of
    `size`); a bool or 2.7 is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not 0 <= value < size:
        detail = f", {what}" if what else ""
        raise ValueError(f"{name} must be None or in [0, {size}) (an integer id{detail}); got "
                         f"{value!r}")
    return int(value)


def kv_cache(name: str, pair, *, batch: int, heads: int, head_dim: int, dtype,
             length: int | None = None, legend: str = "B, H, P, d") -> int:
    """One attention layer's KV cache: a pair (k, v) of arrays of `dtype`, each
    (B, heads, P, head_dim) with the same P (and P == `length` when given, so that every
    layer of a model holds the same positions). Returns P."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a pair (k, v) (the `present` of an earlier call); "
                        f"got {kind_of(pair)}")
    for part, array in zip("kv", pair):
        if not isinstance(array, np.ndarray) or array.ndim != 4:
            raise ValueError(f"{name} must be (k, v), each of shape ({legend}); got {part} "
                             f"{type(array).__name__} of shape {np.shape(array)}")
        plain_arithmetic(f"{name}.{part}", array)
        past = length if length is not None else array.shape[2]
        expected = (batch, heads, past, head_dim)
        if array.shape != expected:
            raise ValueError(f"{name} must be (k, v), each of shape ({legend}) = {expected}: "
                             f"the `present` of an earlier call; got {part} of shape "
                             f"{array.shape}")
        if array.dtype != dtype:
            raise TypeError(f"{name}.{part} must have the model's dtype {np.dtype(dtype)}; "
                            f"got dtype {array.dtype}")
        length = past
    return length


def optional(check):
    """`check` that also lets None through (a field whose None means "the default")."""
    def check_optional(name, value):
        return None if value is None else check(name, value)
    return check_optional


def bounded(low=None, high=None, *, low_open=False, high_open=False):
    """`number` with its interval fixed: a check for `config_fields`."""
    def check_number(name, value):
        return number(name, value, low=low, high=high, low_open=low_open, high_open=high_open)
    return check_number


def config_fields(config, checks: dict) -> None:
    """Each field of a (frozen) dataclass named in `checks` checked by its check(name, value),
    in the given order, and replaced by what the check returns (a NumPy integer or float
    becomes a Python one, so the config stays JSON-able); the message names the field, which
    is the argument the caller passed."""
    for name, check in checks.items():
        object.__setattr__(config, name, check(name, getattr(config, name)))


def one_of(*allowed):
    """`choice` among `allowed`: a check for `config_fields`."""
    def check_choice(name, value):
        choice(name, value, allowed)
        return value
    return check_choice
