"""Rotary position embedding (RoPE), applied to the queries and the keys of attention.

Shapes: x (B, H, T, D) queries or keys, D = head_dim (even); positions (T,) shared by the batch,
or (B, T) per sequence (left padding); cos and sin (T, D/2) or (B, 1, T, D/2), which broadcast
against the (B, H, T, D/2) halves of x.

The D features form D/2 pairs (a_i, b_i). At position p, pair i is rotated by the angle
theta = p omega_i, omega_i = base^(-2i / D) (SPEC §5, base 10000 by default):

    a_i' = a_i cos(theta) - b_i sin(theta)
    b_i' = a_i sin(theta) + b_i cos(theta)

Which features form a pair is the layout:
- interleaved=True:  (a_i, b_i) = (x_2i, x_2i+1) (RoFormer, Meta's Llama: x as D/2 complex
  numbers a + ib multiplied by e^(i theta));
- interleaved=False: (a_i, b_i) = (x_i, x_i+D/2) (HF Llama, GPT-NeoX:
  `x * cos + rotate_half(x) * sin` with cos and sin of the angles concatenated twice).
The two are one rotation seen through a fixed permutation of the feature axis: with
perm = [0, 2, 4, ..., 1, 3, 5, ...], rotate_half_layout(x[..., perm]) equals
rotate_interleaved(x)[..., perm]. A checkpoint converted between the layouts permutes the rows
of its query and key projections this way.

Why it encodes relative position: R_m^T R_n = R_(n - m) for rotations, so
<R_m q, R_n k> = <q, R_(n - m) k> depends on m and n only through n - m.

The angles are computed in the working dtype, exactly as HF transformers does in float32:
inv_freq = 1 / base^(arange(0, D, 2) / D), angles = positions * inv_freq, so a float32 run matches
HF's float32 model. (HF keeps the angles in float32 even for a float64 model; numpy_tf computes
them in float64 there.)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core import validate
from ..core.module import Module, float_dtype
from .rope_scaling import RopeScaling, as_rope_scaling, scaled_inverse_frequencies

EVEN_HEAD_DIM = "rotations act on pairs of features"


def rope_tables(positions: np.ndarray, head_dim: int, base: float = 10000.0,
                dtype=np.float64, scaling: RopeScaling | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of the angles positions * omega_i, in `dtype`: (T, D/2) for positions (T,),
    (B, 1, T, D/2) for positions (B, T) (the 1 broadcasts over the heads). With a scaled RoPE
    (numpy_tf.layers.rope_scaling) omega is that rule's, computed from the largest position
    (dynamic), and both tables are multiplied by its attention factor (yarn)."""
    validate.integer_array("positions", positions, ndim=(1, 2), shape="(T,) or (B, T)")
    validate.non_negative_entries("positions", positions)
    head_dim = validate.even_positive_int("head_dim", head_dim, EVEN_HEAD_DIM)
    base = validate.positive_float("base", base)
    dtype = float_dtype(dtype)
    scaling = as_rope_scaling(scaling)
    length = int(positions.max()) + 1 if positions.size else 0
    inv_freq, factor = scaled_inverse_frequencies(head_dim, base, scaling, dtype,
                                                  length)                   # (D/2,), m
    angles = positions[..., None].astype(dtype) * inv_freq                  # (..., T, D/2)
    if positions.ndim == 2:
        angles = angles[:, None]                                            # (B, 1, T, D/2)
    if factor == 1.0:
        return np.cos(angles), np.sin(angles)
    return np.cos(angles) * factor, np.sin(angles) * factor                 # m cos, m sin


def _pairs(x: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """Views (a, b) of x's feature pairs, each (..., D/2), in the chosen layout."""
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool,
                inverse: bool = False) -> np.ndarray:
    """Rotate every pair (a, b) of x by its angle: (a cos - b sin, a sin + b cos); with
    inverse=True by minus the angle: (a cos + b sin, -a sin + b cos). A new array. (The
    rotation by theta is the inverse rotation, rope_backward's, by -theta.)"""
    validate.float_array("x", x, min_ndim=1, shape="(..., D)")
    validate.same_dtype(x=x, cos=cos, sin=sin)
    return rope_backward(x, RoPECache(cos, sin if inverse else -sin, interleaved, x.shape))


class RoPECache(NamedTuple):
    cos: np.ndarray         # (T, D/2) or (B, 1, T, D/2)
    sin: np.ndarray         # same shape as cos
    interleaved: bool
    x_shape: tuple          # (B, H, T, D) of the output

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_shape, self.cos.dtype


def _check_interleaved(interleaved) -> bool:
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"interleaved must be True (pairs 2i, 2i+1) or False (halves i, "
                        f"i+D/2); got {interleaved!r}")
    return bool(interleaved)


def rope_forward(x: np.ndarray, positions: np.ndarray, base: float = 10000.0,
                 interleaved: bool = False, scaling: RopeScaling | None = None):
    """Rotate x (B, H, T, D) at `positions` ((T,) or (B, T) non-negative integers), with the
    frequencies of `scaling` when given (a scaled RoPE: numpy_tf.layers.rope_scaling).
    Returns (out (B, H, T, D), RoPECache)."""
    validate.float_array("x", x, ndim=4, shape="(B, H, T, head_dim)")
    if x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension head_dim ({EVEN_HEAD_DIM}); "
                         f"got shape {x.shape}")
    interleaved = _check_interleaved(interleaved)
    validate.integer_array("positions", positions, ndim=(1, 2), shape="(T,) or (B, T)")
    batch, _, length, _ = x.shape
    expected = (length,) if positions.ndim == 1 else (batch, length)
    if positions.shape != expected:
        raise ValueError(f"positions must have shape {expected} to match x's (B, T) = "
                         f"({batch}, {length}); got {positions.shape}")
    cos, sin = rope_tables(positions, x.shape[-1], base, x.dtype, scaling)  # (..., T, D/2)
    a, b = _pairs(x, interleaved)                                           # (..., D/2) each
    out = np.empty_like(x)                                                  # (B, H, T, D)
    out_a, out_b = _pairs(out, interleaved)                                 # views of out
    out_a[...] = a * cos - b * sin                                          # a'
    out_b[...] = a * sin + b * cos                                          # b'
    return out, RoPECache(cos, sin, interleaved, x.shape)


def rope_backward(dout: np.ndarray, cache: RoPECache) -> np.ndarray:
    """RoPE is linear in x: each pair is multiplied by the rotation matrix

        R(theta) = [[cos theta, -sin theta],
                    [sin theta,  cos theta]],      [a', b'] = R(theta) [a, b].

    The Jacobian of [a', b'] with respect to [a, b] is R(theta) itself, so the gradient is the
    transpose applied to the upstream gradient:

        [da, db] = R(theta)^T [da', db'].

    A rotation is orthogonal, and R(theta)^T = R(-theta) (cos is even, sin is odd): the
    backward is the inverse rotation,

        da =  da' cos(theta) + db' sin(theta)
        db = -da' sin(theta) + db' cos(theta),

    in the same layout. A scaled RoPE with an attention factor m (yarn) caches m cos and
    m sin: the map m R(theta) has the transpose m R(theta)^T, the same formulas on the cached
    tables. Cached: only cos and sin (x is not needed, the map being linear).
    Integer positions get no gradient. Returns dx.
    """
    validate.backward_inputs(dout, cache, RoPECache)
    cos, sin, interleaved, _ = cache
    da_out, db_out = _pairs(dout, interleaved)                              # da', db'
    dx = np.empty_like(dout)                                                # (B, H, T, D)
    da, db = _pairs(dx, interleaved)                                        # views of dx
    da[...] = da_out * cos + db_out * sin
    db[...] = db_out * cos - da_out * sin
    return dx


class RotaryEmbedding(Module):
    """RoPE for x (B, H, T, head_dim); no parameters (cos and sin are built in x's dtype at
    each call, from the positions).

    forward(x, positions=None, offset=0): positions default to offset .. offset + T - 1 (offset
    = the tokens already in a KV cache); give explicit positions (T,) or (B, T) instead for left
    padding. Returns (out, cache); backward(dout, cache) -> dx.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False,
                 dtype=np.float64, scaling: RopeScaling | None = None):
        super().__init__(dtype)
        self.head_dim = validate.even_positive_int("head_dim", head_dim, EVEN_HEAD_DIM)
        self.base = validate.positive_float("base", base)
        self.interleaved = _check_interleaved(interleaved)
        self.scaling = as_rope_scaling(scaling)

    def forward(self, x, positions=None, offset=0):
        validate.float_array("x", x, ndim=4, shape="(B, H, T, head_dim)")
        validate.last_dim("x", x, self.head_dim, "head_dim")
        offset = validate.non_negative_int("offset", offset)
        if positions is None:
            positions = np.arange(offset, offset + x.shape[2])                 # (T,)
        elif offset:
            raise ValueError(f"give positions or offset, not both: positions already say where "
                             f"each token is; got offset={offset} with explicit positions")
        return rope_forward(x, positions, self.base, self.interleaved, self.scaling)

    def backward(self, dout, cache):
        return rope_backward(dout, cache)


# -- partial rotary: only the first rotary_dim features of each head rotate (GPT-NeoX, Pythia) --
class PartialRoPECache(NamedTuple):
    rope: RoPECache         # the rotation of the first rotary_dim features
    rotary_dim: int         # R: features 0 .. R-1 rotate, R .. D-1 pass through
    x_shape: tuple          # (B, H, T, D), the output's shape

    @property
    def output_spec(self):  # the (shape, dtype) dout must have
        return self.x_shape, self.rope.cos.dtype


def partial_rope_forward(x: np.ndarray, positions: np.ndarray, rotary_dim: int,
                         base: float = 10000.0, interleaved: bool = False):
    """Rotate the first `rotary_dim` = R features of each head of x (B, H, T, D), as RoPE over
    a head of width R (so omega_i = base^(-2i / R)), and pass features R .. D-1 through
    unchanged: HF GPT-NeoX's `rotary_pct` / `partial_rotary_factor` (R = int(D * factor)), in
    either layout (GPT-NeoX: halves, pairs (i, i + R/2)). R = D is rope_forward. Returns
    (out (B, H, T, D), PartialRoPECache)."""
    validate.float_array("x", x, ndim=4, shape="(B, H, T, head_dim)")
    rotary_dim = validate.even_positive_int("rotary_dim", rotary_dim, EVEN_HEAD_DIM)
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be at most x's head_dim "
                         f"({x.shape[-1]}); got x of shape {x.shape}")
    rotated, rope = rope_forward(x[..., :rotary_dim], positions, base=base,
                                 interleaved=interleaved)
    out = np.concatenate([rotated, x[..., rotary_dim:]], axis=-1)         # (B, H, T, D)
    return out, PartialRoPECache(rope, rotary_dim, x.shape)


def partial_rope_backward(dout: np.ndarray, cache: PartialRoPECache) -> np.ndarray:
    """Split x = [x_r, x_p] with x_r = x[..., :R] and x_p = x[..., R:]. The forward is

        out = [rope(x_r), x_p],

    so its Jacobian is block diagonal: the rotation R(theta) on the first R features and the
    identity on the rest. The gradient is the transpose applied to dout = [dout_r, dout_p]:

        dx_r = R(theta)^T dout_r = rope_backward(dout_r)   (the inverse rotation)
        dx_p = dout_p                                      (passed through unchanged).

    Cached: the rotation's cos and sin, R and x's shape. Integer positions get no gradient.
    Returns dx."""
    validate.backward_inputs(dout, cache, PartialRoPECache)
    rope, rotary_dim, _ = cache
    drotated = rope_backward(dout[..., :rotary_dim], rope)                 # (B, H, T, R)
    return np.concatenate([drotated, dout[..., rotary_dim:]], axis=-1)    # (B, H, T, D)
