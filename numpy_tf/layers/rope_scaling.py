"""Scaled RoPE: the frequency tables that stretch a model's context (HF's rope_type linear,
dynamic, llama3, yarn and longrope), each computed as Hugging Face's rope initialisation
computes it.

Shapes: D head_dim (even), omega (D/2,) the inverse frequencies, base the RoPE theta.
Unscaled, omega_i = base^(-2i/D) (numpy_tf.layers.positions.inverse_frequencies). Each type
changes omega, and yarn and longrope also scale cos and sin by an attention factor m:

    cos' = m cos(p omega_i),  sin' = m sin(p omega_i)

so the map on each pair is m R(p omega_i): still linear in x, its backward is its transpose
m R(p omega_i)^T, which rope_backward applies unchanged from the scaled cos and sin it caches.
The scores q.k see m^2: yarn's "attention temperature".

- linear (position interpolation):  omega_i / factor.
- dynamic (NTK-aware, recomputed from the length): with L = the largest position of the call
  + 1, and M = original_max_position_embeddings (HF: the config's max_position_embeddings),
  omega is unscaled while L <= M; beyond, the base grows to
      base' = base (factor L / M - (factor - 1))^(D / (D - 2)),
  omega_i = base'^(-2i/D). HF keeps the longest length seen so far on the module
  (max_seq_len_cached) and only recomputes when a call goes beyond it (or resets when a call
  is shorter than M): numpy_tf computes from each call's own positions, which is HF's value
  for a freshly built model, for every call whose length is not below the longest earlier
  length above M (KV-cache decoding, whose positions only grow), and for every call shorter
  than M. They differ for a call above M or of exactly M after a longer one (HF keeps the
  longer call's frequencies).
  Keys already in a KV cache keep the rotation they were cached with, in both.
- llama3 (Llama 3.1): with the wavelength lambda_i = 2 pi / omega_i, the old context M and
  the bounds M / low_freq_factor > M / high_freq_factor: lambda_i > M / low_freq_factor:
  omega_i / factor; lambda_i < M / high_freq_factor: omega_i; between, with
  s = (M / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor):
  (1 - s) omega_i / factor + s omega_i.
- yarn: a ramp r_i = clip((i - low) / (high - low), 0, 1) over the pair index i between the
  dimensions where a wave turns beta_fast and beta_slow times in M positions,
  low/high = D ln(M / (beta 2 pi)) / (2 ln base) (floor and ceil when truncate, clipped to
  [0, D - 1]); omega_i = (omega_i / factor) r_i + omega_i (1 - r_i), and
  m = attention_factor, by default 0.1 ln(factor) + 1 (1 for factor <= 1), or
  mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given.
- longrope (Phi-3 128k, Phi-3.5): one rescale factor per pair, the long ones when the call's
  largest position + 1 exceeds M, else the short ones: omega_i = 1 / (f_i base^(2i/D)); and
  m = attention_factor, by default sqrt(1 + ln(factor) / ln(M)) (1 for factor <= 1). HF picks
  the set from each call's positions too (stateless, unlike dynamic).

Every table is computed with HF's operations in the working dtype (HF itself builds them in
float32: a float32 model matches, a float64 model is exact where HF's is rounded to float32).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..core import validate
from .positions import inverse_frequencies

ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """One scaled-RoPE rule (HF's rope_parameters with a rope_type other than default).
    original_max_position_embeddings is the context the model was trained with: llama3's,
    yarn's and longrope's old context, and dynamic's threshold (HF's max_position_embeddings
    there)."""
    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None        # llama3
    high_freq_factor: float | None = None       # llama3
    beta_fast: float = 32.0                     # yarn
    beta_slow: float = 1.0                      # yarn
    attention_factor: float | None = None       # yarn, longrope; None: from factor (and mscale)
    mscale: float | None = None                 # yarn
    mscale_all_dim: float | None = None         # yarn
    truncate: bool = True                       # yarn: floor / ceil the ramp's bounds
    short_factor: tuple[float, ...] | None = None   # longrope: D/2 factors within M positions
    long_factor: tuple[float, ...] | None = None    # longrope: D/2 factors beyond

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {', '.join(ROPE_TYPES)}; got "
                             f"{self.rope_type!r}")
        validate.positive_float("factor", self.factor)
        for name in ("short_factor", "long_factor"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(float(f) for f in getattr(self, name)))
        if self.rope_type in ("dynamic", "llama3", "yarn", "longrope"):
            validate.positive_int("original_max_position_embeddings",
                                  self.original_max_position_embeddings)
        if self.rope_type == "llama3":
            low = validate.positive_float("low_freq_factor", self.low_freq_factor)
            high = validate.positive_float("high_freq_factor", self.high_freq_factor)
            if not high > low:
                raise ValueError(f"high_freq_factor ({high}) must be greater than "
                                 f"low_freq_factor ({low}) for rope_type 'llama3'")
        if self.rope_type == "longrope":
            for name in ("short_factor", "long_factor"):
                factors = getattr(self, name)
                if not factors or not all(math.isfinite(f) and f > 0 for f in factors):
                    raise ValueError(f"{name} must be a list of positive numbers (one per "
                                     f"rotated pair) for rope_type 'longrope'; got {factors!r}")
            if len(self.short_factor) != len(self.long_factor):
                raise ValueError(f"short_factor and long_factor must have the same length; got "
                                 f"{len(self.short_factor)} and {len(self.long_factor)}")
        if self.rope_type in ("yarn", "longrope") and self.attention_factor is not None:
            validate.positive_float("attention_factor", self.attention_factor)
        if self.rope_type == "yarn":
            validate.positive_float("beta_fast", self.beta_fast)
            validate.positive_float("beta_slow", self.beta_slow)

    def to_dict(self) -> dict:
        return asdict(self)


def as_rope_scaling(value) -> RopeScaling | None:
    """None, a RopeScaling, or its fields as a dict (a config read back from JSON)."""
    if value is None or isinstance(value, RopeScaling):
        return value
    if isinstance(value, dict):
        return RopeScaling(**value)
    raise TypeError(f"rope_scaling must be None, a RopeScaling or its fields as a dict; got "
                    f"{type(value).__name__}")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(scaling: RopeScaling) -> float:
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)
    if scaling.mscale and scaling.mscale_all_dim:
        return _yarn_mscale(scaling.factor, scaling.mscale) / \
            _yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return _yarn_mscale(scaling.factor)


def scaled_inverse_frequencies(head_dim: int, base: float, scaling: RopeScaling | None,
                               dtype, length: int = 0) -> tuple[np.ndarray, float]:
    """(omega (D/2,) in `dtype`, attention factor m) of `scaling` (None: plain RoPE, m = 1).
    `length` is the call's largest position + 1 (dynamic only)."""
    if scaling is None:
        return inverse_frequencies(head_dim, base, dtype), 1.0
    kind, factor = scaling.rope_type, float(scaling.factor)
    if kind == "linear":
        return inverse_frequencies(head_dim, base, dtype) / factor, 1.0
    context = scaling.original_max_position_embeddings
    if kind == "dynamic":
        if length > context:
            base = base * ((factor * length / context) - (factor - 1)) ** \
                (head_dim / (head_dim - 2))
        return inverse_frequencies(head_dim, base, dtype), 1.0
    if kind == "llama3":
        return _llama3(inverse_frequencies(head_dim, base, dtype), scaling, context), 1.0
    if kind == "longrope":
        return _longrope(head_dim, base, scaling, context, dtype, length)
    return _yarn(head_dim, base, scaling, context, dtype), yarn_attention_factor(scaling)


def _llama3(omega: np.ndarray, scaling: RopeScaling, context: int) -> np.ndarray:
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    low_freq_wavelength, high_freq_wavelength = context / low, context / high
    wavelength = 2 * math.pi / omega                                        # (D/2,)
    stretched = np.where(wavelength > low_freq_wavelength, omega / factor, omega)
    smooth = (context / wavelength - low) / (high - low)                    # s
    smoothed = (1 - smooth) * stretched / factor + smooth * stretched
    medium = ~(wavelength < high_freq_wavelength) & ~(wavelength > low_freq_wavelength)
    return np.where(medium, smoothed, stretched)


def check_rope_scaling(scaling: RopeScaling, head_dim: int) -> None:
    """What a rule needs of the head it rotates: longrope one factor per pair."""
    if scaling.rope_type == "longrope" and len(scaling.short_factor) != head_dim // 2:
        raise ValueError(f"rope_scaling's short_factor and long_factor must hold head_dim / 2 = "
                         f"{head_dim // 2} factors (one per rotated pair); got "
                         f"{len(scaling.short_factor)}")


def _longrope(head_dim: int, base: float, scaling: RopeScaling, context: int, dtype,
              length: int) -> tuple[np.ndarray, float]:
    check_rope_scaling(scaling, head_dim)
    factors = scaling.long_factor if length > context else scaling.short_factor
    if scaling.attention_factor is not None:
        attention = float(scaling.attention_factor)
    else:
        attention = 1.0 if scaling.factor <= 1 else \
            math.sqrt(1 + math.log(scaling.factor) / math.log(context))
    exponents = np.arange(0, head_dim, 2, dtype=dtype) / head_dim           # (D/2,)
    powers = (base ** exponents.astype(np.float64)).astype(dtype)           # base^(2i/D)
    return 1.0 / (np.asarray(factors, dtype=dtype) * powers), attention


def _yarn(head_dim: int, base: float, scaling: RopeScaling, context: int,
          dtype) -> np.ndarray:
    factor = scaling.factor

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001                       # HF's guard against a zero-width ramp
    exponents = np.arange(0, head_dim, 2, dtype=dtype) / head_dim           # (D/2,)
    powers = (base ** exponents.astype(np.float64)).astype(dtype)           # base^(2i/D)
    extrapolation = 1.0 / powers                                            # omega
    interpolation = 1.0 / (factor * powers)                                 # omega / factor
    ramp = np.clip((np.arange(head_dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
    keep = 1 - ramp                                                         # (D/2,)
    return interpolation * (1 - keep) + extrapolation * keep
