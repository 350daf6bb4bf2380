"""The encoder-decoder of "Attention Is All You Need" in torch.nn.Transformer's layout: the
encoder and decoder layers (layers.py), their stacks and the whole Transformer
(transformer.py), and the sequence-to-sequence model with embeddings, positions and a head
(seq2seq.py)."""
from .layers import TransformerDecoderLayer, TransformerEncoderLayer
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .transformer import Transformer, TransformerDecoder, TransformerEncoder
