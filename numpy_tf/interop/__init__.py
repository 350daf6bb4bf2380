"""Exact converters between numpy_tf and other projects' layouts: Hugging Face checkpoints
(hf.py, hf_bert.py, hf_mixtral.py), torch.nn modules (torch_modules.py), the name tables they share
(layout.py), and the pretrained SmolLM2 GGUF file (pretrained.py).

    model = interop.from_hf(config, state_dict, dtype=np.float64)
    ours = interop.config_from_hf(config)   # the GPTConfig, LlamaConfig or BertConfig it equals
    params = interop.to_hf(model, config)              # the loaded state_dict, bit for bit
    grads = interop.to_hf(model, config, grads=True)   # {HF key: gradient in HF layout}
    module = interop.from_torch(kind, kwargs, state_dict, dtype=np.float64)
    params = interop.to_torch(module, kind, kwargs)
"""
from .hf import (config_from_hf, from_hf, gpt2_config, gpt2_layout, llama_config, llama_layout,
                 to_hf)
from .hf_bert import bert_config, bert_layout
from .hf_mixtral import hub_layout, mixtral_config, mixtral_layout
from .layout import Layout
from .torch_modules import from_torch, to_torch, torch_equivalent, torch_kwargs
