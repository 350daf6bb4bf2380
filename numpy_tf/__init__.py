"""numpy_tf: a pure-NumPy Transformer whose every layer has a hand-written forward and backward,
checked by finite differences and against PyTorch.

    out, cache = layer.forward(*inputs)       # the cache is returned, never kept on the layer
    dinputs = layer.backward(dout, cache)     # parameter gradients are added into Parameter.grad

The package is layered; each folder imports only the ones above it in this list:

    core/       Parameter, Module, input checks, tolerances, .npz files, erf, reference_path
    kernels/    the fast versions the layer classes run, each tested equal to its reference
    layers/     every layer family: cache, pure forward / backward, thin Module
    text/       tokenizers, datasets, the shipped corpus
    models/     GPT, Llama, BERT, the encoder-decoder, CBOW; losses; parameter counts
    optim/      optimizers, clipping, the learning-rate schedule
    training/   the Trainer, checkpoints      generation/  sampling, KV-cache decoding
    interop/    Hugging Face, torch.nn and GGUF layouts
    checking/   gradcheck, case files, export, compare, the torch fixtures
    teaching/   explain, assignment, grading  study/  attention maps
    cli/        the `numpy-tf` command (nothing imports it)

docs/SPEC.md states the promises; `numpy-tf check` is the proof.
"""
from .core import Module, ModuleList, Parameter, Sequential, erf, erfc, reference_path
from .layers import (GELU, CrossEntropyLoss, Dropout, Embedding, FusedAttention, LayerNorm,
                     LearnedPositions, Linear, LogSoftmax, MultiHeadAttention, ReLU, RMSNorm,
                     RoPECache, RotaryEmbedding, ScaledDotProductAttention, SiLU,
                     SinusoidalPositions, Softmax, SwiGLU, TorchMultiheadAttention,
                     attention_backward, attention_forward, causal_mask, cross_entropy,
                     cross_entropy_backward, cross_entropy_forward, dropout_backward,
                     dropout_forward, embedding_backward, embedding_forward, feedforward,
                     flash_attention_backward, flash_attention_forward,
                     flash_attention_statistics, flash_decoding, gelu_backward, gelu_forward, inverse_frequencies, layernorm_backward,
                     layernorm_forward, learned_positions_backward, learned_positions_forward,
                     linear_backward, linear_forward, log_softmax_backward, log_softmax_forward,
                     relu_backward, relu_forward, rmsnorm_backward, rmsnorm_forward,
                     rope_backward, rope_forward, rope_rotate, rope_tables, silu_backward,
                     silu_forward, sinusoidal_positions_backward, sinusoidal_positions_forward,
                     sinusoidal_table, softmax_backward, softmax_forward, swiglu_backward,
                     swiglu_forward)
from .models import (CBOW, GPT, Accounting, Bert, BertConfig, BertEmbeddings, DecoderBlock,
                     GPTConfig, Llama, LlamaConfig, LlamaDecoderLayer, MaskedLMHead,
                     MaskedLMLoss, NextTokenLoss, Seq2Seq, Seq2SeqConfig, Seq2SeqLoss,
                     TargetLoss, Transformer, TransformerDecoder, TransformerDecoderLayer,
                     TransformerEncoder, TransformerEncoderLayer, account, cbow_backward,
                     cbow_forward, count_parameters, nearest, parameter_breakdown,
                     shifted_targets)
from .layers import NeoXAttention, partial_rope_backward, partial_rope_forward
from .models import GPTNeoX, NeoXConfig, NeoXLayer
from .optim import (SGD, Adam, AdamW, Optimizer, adam_update, clip_grad_norm, decay_groups,
                    grads_finite, sgd_update, warmup_cosine)
from .text import (DEFAULT_SPECIAL_TOKENS, DIGIT_BOS, DIGIT_EOS, DIGIT_PAD, DIGIT_VOCAB_SIZE,
                   IGNORE_INDEX, BPETokenizer, ByteTokenizer, CBOWPairs, GGUFTokenizer,
                   ReverseDigits, SlidingWindowDataset, Vocabulary, batch_indices, cbow_pairs,
                   default_corpus, mask_tokens, pretokenize, reverse_digits, smollm2_chat,
                   split_documents, split_stream, window_count)
from .training import (Checkpoint, Trainer, TrainingStopped, TrainSettings, load_cbow,
                       load_checkpoint, save_cbow, save_checkpoint, train_cbow)
from .generation import generate, generate_seq2seq, sample_next, sampling_probabilities
from . import interop
from .interop import pretrained
from .checking import GradcheckReport, gradcheck, gradcheck_module
from .study import attention_maps
from . import _old_paths

__version__ = "0.1.0"

_old_paths.install()


def __getattr__(name: str):
    """`numpy_tf.norm` and the other module names of the first, flat layout (see _old_paths)."""
    if name in _old_paths.OLD_PATHS:
        return _old_paths.new_module(name)
    raise AttributeError(f"module 'numpy_tf' has no attribute {name!r}")
