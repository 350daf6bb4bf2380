"""Looking inside a model: the attention maps of a forward pass (attention.py)."""
from .attention import attention_maps, format_attention
