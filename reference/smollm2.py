"""Hugging Face's side of the SmolLM2-135M comparison: LlamaForCausalLM with the GGUF file's
weights, dequantised by transformers' own GGUF loader (never by numpy_tf).

    python reference/smollm2.py PATH.gguf 504,3575,282,4649,314

prints HF's greedy continuation of those token ids ("The capital of France is"). tests/test_smollm2.py imports `hf_model` to compare numpy_tf's
logits (float32 and float64), greedy tokens and every parameter gradient with it. Nothing here
is committed as a fixture: the float64 gradient alone is 1 GB.

In float64, HF computes RMSNorm, the RoPE tables and the attention softmax in float32 (its
"islands"); `float64_faithful` (reference/llama.py) swaps in the same computations in the
working dtype, as the Llama fixtures do.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama import float64_faithful  # noqa: E402,F401  (re-exported for the tests)


def hf_model(gguf_path, dtype=torch.float32):
    """LlamaForCausalLM in eval mode with the file's weights (eager attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(str(gguf_path))["config"]
    config = {key: value for key, value in config.items() if key != "model_type"}
    with torch.device("meta"):
        meta_model = LlamaForCausalLM(LlamaConfig(**config))
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True,
                                   model_to_load=meta_model)["tensors"]
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="eager"))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"GGUF tensors do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.to(dtype).eval()


def greedy(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """HF's own generate, greedy, with its KV cache."""
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=steps, do_sample=False,
                              attention_mask=torch.ones_like(ids), pad_token_id=2)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    ids = torch.tensor([[int(token) for token in sys.argv[2].split(",")]])
    print(greedy(hf_model(sys.argv[1]), ids, 32)[0].tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
