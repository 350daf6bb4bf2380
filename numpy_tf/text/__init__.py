"""Text: tokenizers (tokenizers.py, bpe.py, gguf_tokenizer.py), the word vocabulary of CBOW
(vocabulary.py), datasets and batches (datasets.py) and the corpus that ships with the package
(corpus.py). Text imports only the core."""
from .corpus import default_corpus
from .datasets import (DIGIT_BOS, DIGIT_EOS, DIGIT_PAD, DIGIT_VOCAB_SIZE, IGNORE_INDEX, CBOWPairs,
                       ReverseDigits, SlidingWindowDataset, batch_indices, cbow_pairs, mask_tokens,
                       reverse_digits, split_documents, split_stream, window_count)
from .gguf_tokenizer import GGUFTokenizer, smollm2_chat
from .tokenizers import DEFAULT_SPECIAL_TOKENS, BPETokenizer, ByteTokenizer, pretokenize
from .vocabulary import Vocabulary, words
