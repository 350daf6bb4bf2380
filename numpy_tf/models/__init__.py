"""The model families, each composed of layers: GPT / GPT-2 (gpt.py), Llama and Mistral
(llama.py), Gemma and Gemma2 (gemma.py), GPT-NeoX / Pythia (neox.py), Mixtral (mixtral.py:
Llama's decoder with a sparse mixture of experts), BERT (bert.py), the encoder-decoder
(encoder_decoder/), CBOW word vectors (cbow.py); the losses a model is trained with
(objectives.py), exact parameter counts from configs (accounting.py), and the registry of
families and presets every tool and command reads (registry.py).
Models import layers and the core, never training, generation, interop or the tools."""
from .accounting import Accounting, account, count_parameters, parameter_breakdown
from .bert import Bert, BertConfig, BertEmbeddings, MaskedLMHead
from .cbow import CBOW, cbow_backward, cbow_forward, nearest
from .encoder_decoder import (Seq2Seq, Seq2SeqConfig, Transformer, TransformerDecoder,
                              TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)
from .gemma import Gemma, Gemma2DecoderLayer, GemmaConfig, GemmaDecoderLayer
from .gpt import GPT, DecoderBlock, GPTConfig
from .llama import Llama, LlamaConfig, LlamaDecoderLayer
from .neox import GPTNeoX, NeoXConfig, NeoXLayer
from .mixtral import Mixtral, MixtralConfig, MixtralDecoderLayer, MixtralLoss
from .objectives import MaskedLMLoss, NextTokenLoss, Seq2SeqLoss, TargetLoss, shifted_targets
