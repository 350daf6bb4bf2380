"""`numpy-tf plot`: the study folder's pictures, to PNG or SVG by the output's suffix.

    numpy-tf plot attention FILE [--tokens TOKENS] [--layers 0,1] [--heads 0,3] -o OUT.png
        FILE: what `generate --save-attention` wrote (a .npz holds every layer and the tokens;
        a .npy one layer, its tokens given with --tokens), or a `numpy-tf train` checkpoint
        run on --prompt TEXT
    numpy-tf plot loss RUN -o OUT.png          a run's loss, train and held out
    numpy-tf plot norms RUN -o OUT.png         each block's gradient and update norms
    numpy-tf plot sinusoidal [--length 64] [--width 32] -o OUT.png
    numpy-tf plot rope [--head-dim 8] [--positions 24] [--base 10000] -o OUT.png
    numpy-tf plot activations -o OUT.png       GELU, SiLU and their derivatives
    numpy-tf plot gradcheck LAYER [--shape 2,3,4] [--case N] -o OUT.png

RUN is a `numpy-tf train --out` folder or its history.csv. matplotlib is an optional extra:
pip install 'numpy-tf[plot]'.
"""
from __future__ import annotations

import json
from pathlib import Path

MAX_DEFAULT_LAYERS = 4          # more saved layers than this: choose some with --layers


def _indices(text: str) -> list[int]:
    import argparse

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected indices like 0,3; got {text!r}") from None


def _tokens(spec: str | None) -> list[str] | None:
    """--tokens: a JSON list of strings (inline, or a .json file holding one), else the tokens
    separated by whitespace."""
    if spec is None:
        return None
    text = Path(spec).read_text(encoding="utf-8") if spec.endswith(".json") and \
        Path(spec).is_file() else spec
    if text.lstrip().startswith("["):
        try:
            tokens = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--tokens: not a valid JSON list ({error})") from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError("--tokens: the JSON list must hold strings")
        return tokens
    return text.split()


def _checkpoint_maps(arrays: dict, path: str, prompt: str | None):
    """A trained checkpoint's attention maps on `prompt`, and the prompt's tokens."""
    import numpy as np

    from ..study import attention_maps
    from ..text.tokenizers import ByteTokenizer
    from ..training.checkpoint import load_checkpoint

    if prompt is None:
        raise ValueError(f"{path} is a checkpoint: give the text to look at with --prompt")
    if "tokenizer" not in arrays:
        raise ValueError(f"{path} holds no tokenizer; it was not written by numpy-tf train")
    checkpoint = load_checkpoint(path)
    tokenizer = ByteTokenizer.from_arrays(arrays, path)
    ids = tokenizer.encode(prompt)[None, :]
    limit = getattr(checkpoint.model.config, "max_context", None)
    if ids.shape[1] == 0:
        raise ValueError("--prompt must not be empty")
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"--prompt has {ids.shape[1]} tokens, more than the model's "
                         f"max_context = {limit}")
    _, cache = checkpoint.model.forward(np.asarray(ids))
    return attention_maps(cache), [tokenizer.decode([int(t)]) for t in ids[0]]


def _attention_input(args):
    from ..core.npz import load_npz
    from ..study.attention import load_attention

    tokens = _tokens(args.tokens)
    if args.file.endswith(".npy"):
        maps, _ = load_attention(args.file)
        return maps, tokens
    arrays = load_npz(args.file)
    if "meta" in arrays and "tokens" not in arrays:
        return _checkpoint_maps(arrays, args.file, args.prompt)
    maps, saved = load_attention(args.file)
    return maps, tokens or saved


def plot_attention_command(args):
    from ..study import plot_attention

    maps, tokens = _attention_input(args)
    layers = args.layers
    if layers is None and len(maps) > MAX_DEFAULT_LAYERS:
        raise ValueError(f"{args.file} holds {len(maps)} layers of attention, too many panels "
                        f"for one picture: choose some with --layers, e.g. --layers 0,"
                        f"{len(maps) // 2},{len(maps) - 1}")
    figure = plot_attention(maps, tokens, layers=layers, heads=args.heads,
                            columns=args.columns, path=args.out)
    shown = layers if layers is not None else range(len(maps))
    return (f"attention of layer{'s' * (len(shown) != 1)} {', '.join(map(str, shown))}, "
            f"{len(figure.axes) - 1} panels")


def plot_run_command(args):
    from ..study import plot_loss, plot_norms

    draw = plot_loss if args.kind == "loss" else plot_norms
    draw(args.history, path=args.out)
    return f"{args.kind} of {args.history}"


def plot_gradcheck_command(args):
    from ..study import plot_gradcheck
    from ..teaching.layer_table import gradcheck_layer

    report, _ = gradcheck_layer(args.layer, args.shape, args.dtype, args.case, args.seed)
    plot_gradcheck(report, path=args.out)
    return f"{report.title}: {'all passed' if report.passed else 'FAILED'}"


def plot_command(args) -> int:
    """Run one `numpy-tf plot` kind; a mistake or a missing matplotlib is one line, status 2."""
    from ..study.figure import check_path
    from .commands import UserError

    try:
        check_path(args.out)
        what = args.draw(args)
    except (ImportError, ValueError, TypeError, OSError) as error:
        raise UserError(str(error)) from None
    print(f"wrote {args.out}: {what}")
    return 0


def loss_plot_line(out: Path) -> str:
    """After `numpy-tf train`: draw out/loss.png from out/history.csv; one line saying so (or
    how to get it when matplotlib is absent)."""
    from ..study import plot_loss

    try:
        plot_loss(out / "history.csv", path=out / "loss.png", title=f"numpy-tf train: {out}")
    except ImportError:
        return "no loss plot: matplotlib is absent (pip install 'numpy-tf[plot]')"
    return f"loss plot {out / 'loss.png'}"


def add_plot_parser(commands) -> None:
    """The `plot` subcommand and its kinds, under the `numpy-tf` parser's subcommands."""
    from .commands import _shape

    parser = commands.add_parser("plot", help="draw a picture (PNG or SVG): attention, a run's "
                                 "loss or norms, positions, RoPE, activations, a gradcheck",
                                 description="Draw one picture to -o OUT.png or OUT.svg. Needs "
                                 "matplotlib: pip install 'numpy-tf[plot]'.")
    parser.set_defaults(run=plot_command)
    kinds = parser.add_subparsers(dest="kind", required=True)

    def kind(name: str, draw, help: str):
        p = kinds.add_parser(name, help=help)
        p.add_argument("-o", "--out", required=True, help="the picture: .png or .svg")
        p.set_defaults(draw=draw)
        return p

    p = kind("attention", plot_attention_command, "attention heatmaps per layer and head")
    p.add_argument("file", help="generate --save-attention's .npz or .npy, or a checkpoint")
    p.add_argument("--tokens", help="the tokens on the axes: a JSON list (or .json file) or "
                   "words separated by spaces (default: the file's, else positions)")
    p.add_argument("--prompt", help="with a checkpoint: the text whose attention to draw")
    p.add_argument("--layers", type=_indices, help="which layers, e.g. 0,3 (default all, up "
                   f"to {MAX_DEFAULT_LAYERS})")
    p.add_argument("--heads", type=_indices, help="which heads, e.g. 0,1 (default all)")
    p.add_argument("--columns", type=int, default=None, help="panels per row")
    for name, help in (("loss", "a run's loss, on training batches and held out"),
                       ("norms", "a run's gradient and update norms per parameter group")):
        kind(name, plot_run_command, help).add_argument(
            "history", metavar="RUN", help="a numpy-tf train --out folder, or its history.csv")
    p = kind("sinusoidal", lambda a: _draw("plot_sinusoidal", a, "length", "width"),
             "the sinusoidal position table")
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    p = kind("rope", lambda a: _draw("plot_rope", a, "head_dim", "positions", "base"),
             "RoPE rotating a vector over positions, both layouts")
    p.add_argument("--head-dim", type=int, default=8)
    p.add_argument("--positions", type=int, default=24)
    p.add_argument("--base", type=float, default=10000.0)
    kind("activations", lambda a: _draw("plot_activations", a),
         "GELU, SiLU and their derivatives")
    p = kind("gradcheck", plot_gradcheck_command, "a layer's finite-difference check")
    p.add_argument("layer")
    p.add_argument("--shape", type=_shape, default=None, help="the main input's shape")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--case", type=int, default=0, help="which edge case of the layer")
    p.add_argument("--seed", type=int, default=0)


def _draw(name: str, args, *fields: str) -> str:
    from .. import study

    getattr(study, name)(**{field: getattr(args, field) for field in fields}, path=args.out)
    return name.removeprefix("plot_").replace("_", " ")
