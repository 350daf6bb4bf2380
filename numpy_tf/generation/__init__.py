"""Generation: sampling the next token (sampling.py) and decoding with a KV cache
(decoding.py)."""
from .decoding import generate, generate_seq2seq
from .sampling import sample_next, sampling_probabilities
