"""Exact converters between numpy_tf modules and torch.nn modules.

    module = interop.from_torch(kind, kwargs, state_dict, dtype=np.float64)
        kind "transformer" (torch.nn.Transformer) or "multihead_attention"
        (torch.nn.MultiheadAttention); kwargs: the torch constructor's keyword arguments
        (batch_first as torch: False by default, sequence-first (S, B, C) inputs; the weights
        are the same either way); state_dict: {torch key: numpy array}
    params = interop.to_torch(module, kind, kwargs)    # the loaded state_dict, bit for bit
    grads = interop.to_torch(module, kind, kwargs, grads=True)

numpy_tf's parameter names ARE torch's state_dict keys, so the layout is the identity; what is
checked is the constructor's keyword arguments (JSON-able; torch's defaults filled in).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..core import validate
from ..core.module import Module, float_dtype
from ..layers.activations import GELU
from ..layers.multihead import TorchMultiheadAttention
from ..models.encoder_decoder.transformer import TORCH_TRANSFORMER_DEFAULTS, Transformer
from .layout import Layout

_REQUIRED = object()
_TORCH_DEFAULTS = {
    "transformer": TORCH_TRANSFORMER_DEFAULTS,
    "multihead_attention": {"embed_dim": _REQUIRED, "num_heads": _REQUIRED, "dropout": 0.0,
                            "bias": True, "add_bias_kv": False, "add_zero_attn": False,
                            "kdim": None, "vdim": None, "batch_first": False},
}
_TORCH_CLASSES = {"transformer": "torch.nn.Transformer",
                  "multihead_attention": "torch.nn.MultiheadAttention"}


def torch_kwargs(kind: str, kwargs: Mapping) -> dict:
    """torch's keyword arguments for `kind` with its defaults filled in, after refusing every
    option numpy_tf does not implement (each by name)."""
    if kind not in _TORCH_DEFAULTS:
        raise ValueError(f"kind must be one of {', '.join(repr(k) for k in _TORCH_DEFAULTS)}; "
                         f"got {kind!r}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict of {_TORCH_CLASSES[kind]}(...)'s keyword "
                        f"arguments; got {type(kwargs).__name__}")
    args = validate.over_defaults(_TORCH_CLASSES[kind], kwargs, _TORCH_DEFAULTS[kind])
    missing = [key for key, value in args.items() if value is _REQUIRED]
    if missing:
        raise ValueError(f"{_TORCH_CLASSES[kind]} needs {', '.join(missing)}")
    validate.flag("batch_first", args["batch_first"])
    refused = {"custom_encoder": None, "custom_decoder": None, "add_bias_kv": False,
               "add_zero_attn": False}
    for key, supported in refused.items():
        if key in args and args[key] is not supported and args[key] != supported:
            raise ValueError(f"{key}={args[key]!r} is not implemented (numpy_tf needs "
                             f"{key}={supported!r})")
    if kind == "transformer" and args["activation"] not in ("relu", "gelu"):
        raise ValueError("activation must be the string 'relu' or 'gelu' (a callable or "
                         f"another name cannot be converted); got {args['activation']!r}")
    for key in ("kdim", "vdim"):
        if kind == "multihead_attention" and args[key] not in (None, args["embed_dim"]):
            raise ValueError(f"{key}={args[key]!r} is not implemented: numpy_tf's "
                             "MultiheadAttention needs keys and values of width embed_dim "
                             f"({args['embed_dim']})")
    return args


def torch_equivalent(kind: str, kwargs: Mapping, dtype=np.float64) -> Module:
    """A freshly initialised numpy_tf module equal to torch.nn.<kind>(**kwargs)."""
    args = torch_kwargs(kind, kwargs)
    dtype = float_dtype(dtype)
    if kind == "multihead_attention":
        return TorchMultiheadAttention(args["embed_dim"], args["num_heads"], args["dropout"],
                                       args["bias"], batch_first=args["batch_first"],
                                       dtype=dtype)
    names = ("d_model", "nhead", "num_encoder_layers", "num_decoder_layers",
             "dim_feedforward", "dropout", "activation", "layer_norm_eps", "batch_first",
             "norm_first", "bias")
    return Transformer(**{name: args[name] for name in names}, dtype=dtype)


def _kwargs_of(module: Module, kind: str) -> dict:
    """The torch keyword arguments a numpy_tf module was built with (to check to_torch); not
    batch_first: the state_dict is the same in either layout."""
    if kind == "multihead_attention":
        if not isinstance(module, TorchMultiheadAttention):
            raise TypeError(f"kind 'multihead_attention' needs a TorchMultiheadAttention; got "
                            f"{type(module).__name__}")
        return {"embed_dim": module.embed_dim, "num_heads": module.num_heads,
                "dropout": module.dropout, "bias": module.in_proj_bias is not None}
    if not isinstance(module, Transformer):
        raise TypeError(f"kind 'transformer' needs a numpy_tf Transformer; got "
                        f"{type(module).__name__}")
    if module.encoder.norm is None or module.decoder.norm is None:
        raise ValueError("the module was built with final_norms=False, but torch.nn.Transformer "
                         "always has encoder.norm and decoder.norm: it has no such state_dict")
    layer = module.encoder.layers[0]
    return {"d_model": module.d_model, "nhead": module.nhead,
            "num_encoder_layers": len(module.encoder.layers),
            "num_decoder_layers": len(module.decoder.layers),
            "dim_feedforward": layer.linear1.out_features, "dropout": layer.dropout.p,
            "activation": "gelu" if isinstance(layer.activation, GELU) else "relu",
            "layer_norm_eps": layer.norm1.eps, "norm_first": layer.norm_first,
            "bias": layer.linear1.bias is not None}


def from_torch(kind: str, kwargs: Mapping, state_dict: Mapping[str, np.ndarray],
               dtype=np.float64) -> Module:
    """The numpy_tf module equal to torch.nn.<kind>(**kwargs) holding `state_dict` ({torch key:
    numpy array}); every key and shape is checked first, each problem named."""
    module = torch_equivalent(kind, kwargs, dtype)
    expected = module.state_dict()
    identity = Layout([(name, name, False) for name in expected])
    module.load_state_dict(identity.to_ours(state_dict, expected, module.dtype, optional=set(),
                                            ignored=lambda key: False))
    return module


def to_torch(module: Module, kind: str, kwargs: Mapping,
             grads: bool = False) -> dict[str, np.ndarray]:
    """The module's parameters (or, with grads=True, their gradients) as torch's state_dict of
    torch.nn.<kind>(**kwargs); refuses a module that kwargs do not describe."""
    args = torch_kwargs(kind, kwargs)
    built = _kwargs_of(module, kind)
    differ = [f"{key}: module has {value!r}, kwargs say {args[key]!r}"
              for key, value in built.items() if value != args[key]]
    if differ:
        raise ValueError("the module does not match kwargs: " + "; ".join(differ))
    return dict(module.grad_dict() if grads else module.state_dict())
