"""Fixtures for the position-wise feed-forward networks, float64 and float32: SwiGLU from
Hugging Face's own LlamaMLP (down(silu(gate(x)) * up(x)), without and with mlp_bias), and the
classic MLP as torch.nn.Sequential(Linear, GELU, Linear) (exact and tanh GELU, with and without
biases). LlamaMLP has no float32 island: silu runs in the model's dtype.
"""
from __future__ import annotations

from torch import nn

from common import DTYPES, float_case, normal

FILE = "feedforward.py"


def build(out_dir):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    paths = []
    for dtype in DTYPES:
        def x(shape, std):
            return {"x": lambda g: normal(g, shape, dtype, std)}

        for name, seed, bias in [("swiglu", 100, False), ("swiglu_bias", 101, True)]:
            config = {"hidden_size": 6, "intermediate_size": 10, "mlp_bias": bias}
            module = LlamaMLP(LlamaConfig(**config, num_attention_heads=2, hidden_act="silu"))
            paths.append(float_case(
                out_dir, FILE, name, "swiglu", seed, dtype, module, config, x((2, 3, 6), 1.5),
                conventions={"swiglu": "down(silu(gate(x)) * up(x)), HF LlamaMLP"}))

        for name, seed, activation, bias in [("feedforward_gelu", 102, "gelu", True),
                                             ("feedforward_gelu_tanh_nobias", 103,
                                              "gelu_tanh", False)]:
            config = {"width": 6, "hidden": 24, "activation": activation, "bias": bias}
            gelu = nn.GELU(approximate="tanh" if activation == "gelu_tanh" else "none")
            module = nn.Sequential(nn.Linear(6, 24, bias=bias), gelu, nn.Linear(24, 6, bias=bias))
            paths.append(float_case(
                out_dir, FILE, name, "feedforward", seed, dtype, module, config,
                x((2, 3, 6), 1.0),
                conventions={"feedforward": "Linear(C, F), GELU, Linear(F, C) as "
                                            "torch.nn.Sequential"}))
    return paths
