"""A layout: how one family's weights are named and shaped on the other side of a converter
(numpy_tf.interop), as a table of rows, so that loading checks every key and shape and names
each problem, and exporting returns the loaded arrays bit for bit.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np


class Layout:
    """Rows (numpy_tf name, their name, transposed?) of one family's weights.

    Their name may be a tuple of names: those tensors are joined along axis 0 into ours (HF
    BERT's query, key and value weights are torch's in_proj_weight) and ours is split into as
    many equal parts on export. Several rows may name one numpy_tf tensor that the other side
    keeps under two names: the values given must be equal, and all but one may be absent.
    `unused` maps their names that take no part in their own model's computation to the shape:
    such a tensor may be absent, must be zero when given (numpy_tf keeps no copy), and is
    exported as zeros. `order` is their state_dict's key order (default: the rows').

    Ours may be a tuple of names instead: their one tensor is split along axis 0 into ours, in
    order, each part as many rows as ours has (HF Phi-3's qkv_proj is q_proj, k_proj and
    v_proj, of H d, G d and G d rows), and ours are joined back on export (their gradients
    too: a fused weight's gradient is its parts' gradients, joined)."""

    def __init__(self, rows: list[tuple[str | tuple[str, ...], str | tuple[str, ...], bool]],
                 unused: Mapping[str, tuple[int, ...]] | None = None,
                 order: list[str] | None = None):
        self.rows = rows
        self.unused = dict(unused or {})
        self.order = order

    @staticmethod
    def _parts(their) -> tuple[str, ...]:
        return (their,) if isinstance(their, str) else tuple(their)

    def _read(self, state, parts, transpose, shape, mismatched) -> np.ndarray | None:
        """The joined (and transposed) value of `parts`, or None after noting what is wrong."""
        values = [state[part] for part in parts]
        for part, value in zip(parts, values):
            if not isinstance(value, np.ndarray):
                mismatched.append(f"{part}: expected a numpy array, got {type(value).__name__}")
                return None
        want = shape[::-1] if transpose else shape
        want = (want[0] // len(parts), *want[1:])
        wrong = [f"{part}: expected shape {want}, got {value.shape}"
                 for part, value in zip(parts, values) if value.shape != want]
        if wrong:
            mismatched.extend(wrong)
            return None
        value = values[0] if len(values) == 1 else np.concatenate(values, axis=0)
        return value.T if transpose else value

    def to_ours(self, state: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                dtype: np.dtype, optional: set[str], ignored: Callable[[str], bool]
                ) -> dict[str, np.ndarray]:
        """Their state_dict as numpy_tf's, after checking every key and shape."""
        variants: dict[str, list] = {}
        fused = [(ours, their) for ours, their, _ in self.rows if not isinstance(ours, str)]
        for ours, their, transpose in self.rows:
            if isinstance(ours, str):
                variants.setdefault(ours, []).append((self._parts(their), transpose))
        theirs = {part for rows in variants.values() for parts, _ in rows for part in parts}
        theirs |= {their for _, their in fused}
        missing, mismatched, disagreeing, converted = [], [], [], {}
        for ours, their in fused:
            sizes = [expected[name].shape[0] for name in ours]
            want = (sum(sizes), *expected[ours[0]].shape[1:])
            value = state.get(their)
            if value is None:
                missing.append(their)
            elif not isinstance(value, np.ndarray):
                mismatched.append(f"{their}: expected a numpy array, got {type(value).__name__}")
            elif value.shape != want:
                mismatched.append(f"{their}: expected shape {want} ({' + '.join(map(str, sizes))}"
                                  f" rows: {', '.join(ours)}), got {value.shape}")
            else:
                for name, part in zip(ours, np.split(value, np.cumsum(sizes)[:-1], axis=0)):
                    converted[name] = np.ascontiguousarray(part, dtype=dtype)
        for ours, rows in variants.items():
            given = [(parts, transpose) for parts, transpose in rows
                     if all(part in state for part in parts)]
            if not given:
                missing += [part for part in rows[0][0] if part not in state
                            and part not in optional]
                continue
            values = [(parts, self._read(state, parts, transpose, expected[ours].shape,
                                         mismatched)) for parts, transpose in given]
            values = [(parts, value) for parts, value in values if value is not None]
            for parts, value in values[1:]:
                if not np.array_equal(value, values[0][1]):
                    disagreeing.append(f"{' + '.join(parts)} must equal "
                                       f"{' + '.join(values[0][0])} (both are {ours})")
            if values:
                converted[ours] = np.ascontiguousarray(values[0][1], dtype=dtype)
        for their, shape in self.unused.items():
            value = state.get(their)
            if value is None:
                continue
            if not isinstance(value, np.ndarray) or value.shape != tuple(shape):
                mismatched.append(f"{their}: expected a numpy array of shape {tuple(shape)}")
            elif np.any(value != 0):
                disagreeing.append(f"{their} takes no part in the computation, so numpy_tf "
                                   "keeps no copy of it and exports zeros: it must be zero; "
                                   f"got max |value| {float(np.abs(value).max()):.3g}")
        unexpected = [key for key in state if key not in theirs and key not in self.unused
                      and not ignored(key)]
        problems = []
        if missing:
            problems.append("missing keys: " + ", ".join(missing))
        if unexpected:
            hint = " (these look like numpy_tf's own names: load them with " \
                   "model.load_state_dict)" if any(k in expected for k in unexpected) else ""
            problems.append("unexpected keys: " + ", ".join(unexpected) + hint)
        if mismatched:
            problems.append("mismatched: " + "; ".join(mismatched))
        problems += disagreeing
        if problems:
            raise ValueError("the state_dict does not fit this config: " + " | ".join(problems))
        return converted

    def to_theirs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for ours, their, transpose in self.rows:
            if not isinstance(ours, str):
                out[their] = np.concatenate([arrays[name] for name in ours], axis=0)
                continue
            value = arrays[ours]
            value = np.ascontiguousarray(value.T) if transpose else value
            parts = self._parts(their)
            out.update(zip(parts, np.split(value, len(parts), axis=0)) if len(parts) > 1
                       else [(parts[0], value)])
        dtype = next(iter(arrays.values())).dtype
        out.update({their: np.zeros(shape, dtype) for their, shape in self.unused.items()})
        return out if self.order is None else {key: out[key] for key in self.order}
