"""The two ready-made training tasks behind `numpy-tf train`: a GPT on a text (next-token
prediction), and the encoder-decoder learning to reverse digit strings (exact match of greedy
decoding on held-out strings proves its backward end to end)."""
from __future__ import annotations

import numpy as np

from .trainer import Trainer, TrainSettings


# -- a language model on a text -------------------------------------------------------------------
def language_model_trainer(text: str, config, settings: TrainSettings | None, *, tokenizer=None,
                           checkpoint_path=None, val_fraction: float = 0.1,
                           eval_batches: int = 4, dtype=np.float64, resume=None,
                           extra_meta: dict | None = None) -> Trainer:
    """A Trainer for a decoder-only model (GPTConfig) on `text`: byte-level tokens by default,
    the last `val_fraction` of the token stream held out (split before windowing, so no held-out
    text is trained on), random next-token windows of max_context tokens per step.

    With `resume` (a Checkpoint this function's Trainer saved) the model, settings, tokenizer,
    optimizer state, step, Generator and history come from it (config, settings, tokenizer
    and dtype are then not read): given the same text, the run continues exactly as if it had
    never stopped."""
    from ..models.gpt import GPT
    from ..models.objectives import TargetLoss
    from ..text.datasets import SlidingWindowDataset, split_stream
    from ..text.tokenizers import ByteTokenizer

    if resume is not None:
        settings = TrainSettings(**resume.meta["settings"])
        config, tokenizer = resume.model.config, ByteTokenizer.from_arrays(resume.arrays)
    tokenizer = tokenizer or ByteTokenizer()
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                         f"vocab_size is {config.vocab_size}")
    ids = tokenizer.encode(text)
    train_ids, val_ids = split_stream(ids, val_fraction)
    context = config.max_context
    train = SlidingWindowDataset(train_ids, context, stride=1)
    train.check_nonempty()
    held_out = SlidingWindowDataset(val_ids, context, stride=context)
    batches = [held_out.windows(np.arange(start, min(start + settings.batch_size,
                                                     len(held_out))))
               for start in range(0, min(len(held_out), eval_batches * settings.batch_size),
                                  settings.batch_size)]

    def sample_batch(rng: np.random.Generator):
        return train.windows(rng.integers(0, len(train), settings.batch_size))

    if resume is not None:
        return Trainer.resume(resume, TargetLoss, sample_batch, eval_batches=batches,
                              checkpoint_path=checkpoint_path)
    model = GPT(config, rng=settings.seed, dtype=dtype)
    return Trainer(TargetLoss(model), sample_batch, settings, eval_batches=batches,
                   checkpoint_path=checkpoint_path, extra_arrays=tokenizer.to_arrays(),
                   extra_meta={"task": "language model", "tokens": int(len(ids)),
                               "held_out_tokens": int(len(val_ids)), **(extra_meta or {})})


# -- the encoder-decoder on reversing digit strings ------------------------------------------------
def reverse_digits_batch(data) -> tuple:
    """The arguments of Seq2SeqLoss.forward from numpy_tf.data.reverse_digits' arrays."""
    return (data.source, data.decoder_input, data.target, data.source_padding_mask,
            data.target_padding_mask)


def reverse_digits_trainer(config, settings: TrainSettings | None, *, min_length: int = 1,
                           max_length: int = 8, eval_count: int = 256, checkpoint_path=None,
                           dtype=np.float64, resume=None) -> Trainer:
    """A Trainer for a Seq2Seq model (Seq2SeqConfig with the digit vocabulary) that learns to
    reverse digit strings: fresh random strings every step, a fixed held-out set (its own
    seed) for the evaluation loss. With `resume` (a Checkpoint this function's Trainer
    saved), everything comes from it and the run continues exactly."""
    from ..models.encoder_decoder.seq2seq import Seq2Seq
    from ..models.objectives import Seq2SeqLoss
    from ..text.datasets import reverse_digits

    if resume is not None:
        settings, config = TrainSettings(**resume.meta["settings"]), resume.model.config
        min_length, max_length = resume.meta["min_length"], resume.meta["max_length"]
    if config.src_features is not None:
        raise ValueError(f"reversing digits reads digit ids as the source; a config with "
                         f"src_features={config.src_features} reads feature vectors")
    held_out = reverse_digits(eval_count, np.random.default_rng(settings.seed + 1_000_003),
                              min_length, max_length)

    def sample_batch(rng: np.random.Generator):
        return reverse_digits_batch(reverse_digits(settings.batch_size, rng, min_length,
                                                   max_length))

    if resume is not None:
        trainer = Trainer.resume(resume, Seq2SeqLoss, sample_batch,
                                 eval_batches=[reverse_digits_batch(held_out)],
                                 checkpoint_path=checkpoint_path)
    else:
        model = Seq2Seq(config, rng=settings.seed, dtype=dtype)
        trainer = Trainer(Seq2SeqLoss(model), sample_batch, settings,
                          eval_batches=[reverse_digits_batch(held_out)],
                          checkpoint_path=checkpoint_path,
                          extra_meta={"task": "reverse digits", "min_length": min_length,
                                      "max_length": max_length})
    trainer.held_out = held_out
    return trainer


def exact_match(model, data) -> float:
    """The fraction of sources whose greedy decoding is exactly the reversed string + EOS."""
    from ..generation.decoding import generate_seq2seq
    from ..text.datasets import DIGIT_BOS, DIGIT_EOS, IGNORE_INDEX

    decoded = generate_seq2seq(model, data.source, data.target.shape[1], DIGIT_BOS, DIGIT_EOS,
                               src_key_padding_mask=data.source_padding_mask)[:, 1:]
    width = data.target.shape[1]
    decoded = np.pad(decoded, ((0, 0), (0, width - decoded.shape[1])),
                     constant_values=DIGIT_EOS)
    real = data.target != IGNORE_INDEX
    return float(np.mean([(d[m] == t[m]).all() for d, t, m in zip(decoded, data.target, real)]))
