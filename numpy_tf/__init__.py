"""numpy_tf: a pure-NumPy Transformer whose every layer has a hand-written forward and backward,
checked by finite differences and against PyTorch.

    out, cache = layer.forward(*inputs)       # the cache is returned, never kept on the layer
    dinputs = layer.backward(dout, cache)     # parameter gradients are added into Parameter.grad

See SPEC (the promises) in the README, and `numpy-tf check` for the proof.
"""
from .core import Module, ModuleList, Parameter, Sequential
from .activations import (GELU, ReLU, SiLU, gelu_backward, gelu_forward, relu_backward,
                          relu_forward, silu_backward, silu_forward)
from .attention import (ScaledDotProductAttention, attention_backward, attention_forward,
                        causal_mask)
from .dropout import Dropout, dropout_backward, dropout_forward
from .embedding import Embedding, embedding_backward, embedding_forward
from .gradcheck import GradcheckReport, gradcheck, gradcheck_module
from .linear import Linear, linear_backward, linear_forward
from .loss import CrossEntropyLoss, cross_entropy, cross_entropy_backward, cross_entropy_forward
from .multihead import FusedAttention, MultiHeadAttention, TorchMultiheadAttention
from .softmax import (LogSoftmax, Softmax, log_softmax_backward, log_softmax_forward,
                      softmax_backward, softmax_forward)
from .optim import (SGD, Adam, AdamW, adam_update, clip_grad_norm, decay_groups, grads_finite,
                    sgd_update)
from .optimizer import Optimizer
from .schedule import warmup_cosine
from .norm import (LayerNorm, RMSNorm, layernorm_backward, layernorm_forward, rmsnorm_backward,
                   rmsnorm_forward)
from .positions import (LearnedPositions, SinusoidalPositions, inverse_frequencies,
                        learned_positions_backward, learned_positions_forward,
                        sinusoidal_positions_backward, sinusoidal_positions_forward,
                        sinusoidal_table)
from .rope import RoPECache, RotaryEmbedding, rope_backward, rope_forward, rope_rotate, rope_tables
from .special import erf, erfc
from .feedforward import SwiGLU, feedforward, swiglu_backward, swiglu_forward
from .gpt import GPT, DecoderBlock, GPTConfig
from .llama import Llama, LlamaConfig, LlamaDecoderLayer
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .bert import Bert, BertConfig, BertEmbeddings, MaskedLMHead
from .objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss, TargetLoss, shifted_targets
from .accounting import Accounting, account, count_parameters, parameter_breakdown
from .generate import generate, generate_seq2seq, sample_next, sampling_probabilities
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .train import Trainer, TrainingStopped, TrainSettings
from . import interop
from .study import attention_maps
from .text import BPETokenizer, ByteTokenizer, DEFAULT_SPECIAL_TOKENS, pretokenize
from .gguf_tokenizer import GGUFTokenizer, smollm2_chat
from . import pretrained
from .data import (DIGIT_BOS, DIGIT_EOS, DIGIT_PAD, DIGIT_VOCAB_SIZE, IGNORE_INDEX, CBOWPairs,
                   ReverseDigits, SlidingWindowDataset, batch_indices, cbow_pairs,
                   default_corpus, mask_tokens, reverse_digits, split_documents, split_stream,
                   window_count)
from .cbow import (CBOW, Vocabulary, cbow_backward, cbow_forward, load_cbow, nearest, save_cbow,
                   train_cbow)

__version__ = "0.1.0"
