"""The layers: each family file holds its cache NamedTuples, its pure `<name>_forward` /
`<name>_backward` functions (the backward's docstring is its derivation) and a thin Module
class that owns the Parameters. Layers import the core and other layer families, never models.
"""
from .activations import (GELU, ReLU, SiLU, gelu_backward, gelu_forward, relu_backward,
                          relu_forward, silu_backward, silu_forward)
from .attention import ScaledDotProductAttention, attention_backward, attention_forward, causal_mask
from .attention import sliding_window_mask
from .cross_entropy_loss import (CrossEntropyLoss, cross_entropy, cross_entropy_backward,
                                 cross_entropy_forward)
from .dropout import Dropout, dropout_backward, dropout_forward
from .embedding import Embedding, embedding_backward, embedding_forward
from .flash_attention import (FlashAttentionCache, flash_attention_backward,
                              flash_attention_forward, flash_attention_statistics,
                              flash_decoding)
from .linear import Linear, linear_backward, linear_forward
from .mlp import SwiGLU, feedforward, swiglu_backward, swiglu_forward
from .moe import (SparseMoE, load_balancing_loss_backward, load_balancing_loss_forward,
                  moe_backward, moe_forward)
from .multihead import FusedAttention, MultiHeadAttention, TorchMultiheadAttention
from .neox_attention import NeoXAttention
from .norm import (LayerNorm, RMSNorm, layernorm_backward, layernorm_forward, rmsnorm_backward,
                   rmsnorm_forward)
from .positions import (LearnedPositions, SinusoidalPositions, inverse_frequencies,
                        learned_positions_backward, learned_positions_forward,
                        sinusoidal_positions_backward, sinusoidal_positions_forward,
                        sinusoidal_table)
from .rope import RoPECache, RotaryEmbedding, rope_backward, rope_forward, rope_rotate, rope_tables
from .rope import partial_rope_backward, partial_rope_forward
from .softcap import SoftCap, softcap_backward, softcap_forward
from .rope_scaling import RopeScaling, scaled_inverse_frequencies
from .softmax import (LogSoftmax, Softmax, log_softmax_backward, log_softmax_forward,
                      softmax_backward, softmax_forward)
