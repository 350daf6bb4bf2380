"""Looking inside a forward pass: the attention probabilities every layer computed.

Every attention layer keeps its probabilities P (B, H, Tq, Tk) in its cache (they are what its
backward needs), so a model's cache already holds every layer's attention map:

    logits, cache = model.forward(ids)
    maps = attention_maps(cache)             # one (B, H, Tq, Tk) array per attention layer
    maps[3][0, 5]                            # layer 3, head 5: row i is where query i looked
    plot_attention(maps, tokens, layers=[3], path="layer3.png")    # every head of layer 3
    save_attention("maps.npz", maps, tokens)          # every layer and the tokens, one file
"""
from __future__ import annotations

import numpy as np

from ..core import validate
from ..core.npz import bad_file, load_npy, load_npz, save_npz
from ..layers.attention import AttentionCache
from .figure import check_path, finish, new_figure, token_label


def attention_maps(cache) -> list[np.ndarray]:
    """Every attention layer's probabilities, in forward order (a decoder layer's self-
    attention before its cross-attention), found by walking the nested cache."""
    if not isinstance(cache, tuple):
        raise TypeError("cache must be the cache a model's or layer's forward returned (out, "
                        f"cache = model.forward(ids)); got {validate.kind_of(cache)}")
    found: list[np.ndarray] = []

    def walk(node) -> None:
        if isinstance(node, AttentionCache):
            found.append(node.probs)
        elif isinstance(node, (tuple, list)):
            for item in node:
                walk(item)

    walk(cache)
    return found


def save_attention(path, maps, tokens, batch: int = 0) -> None:
    """Every layer's map (row `batch` of attention_maps' arrays) and the tokens in one .npz:
    "attention/<i>" (H, Tq, Tk) per layer i and "tokens" (Tk,) strings, read by
    load_attention and `numpy-tf plot attention`. Written atomically, without pickle."""
    layers = _layer_maps(maps, batch)
    arrays = {f"attention/{i}": probs for i, probs in enumerate(layers)}
    arrays["tokens"] = np.array([str(token) for token in tokens], dtype=str)
    save_npz(path, arrays)


def load_attention(path) -> tuple[list[np.ndarray], list[str] | None]:
    """(maps, tokens) from save_attention's .npz, or ([probs], None) from a .npy holding one
    layer's (H, T, T) probabilities (what `generate --save-attention FILE.npy` writes)."""
    path = str(path)
    if path.endswith(".npy"):
        probs = load_npy(path)
        if probs.ndim != 3 or probs.dtype.kind != "f":
            raise bad_file(path, "does not hold one layer's attention probabilities",
                           "a float (H, T, T) array", f"shape {probs.shape} dtype {probs.dtype}")
        return [probs], None
    arrays = load_npz(path)
    keys = sorted((key for key in arrays if key.startswith("attention/")
                   and key.split("/", 1)[1].isdigit()), key=lambda key: int(key.split("/")[1]))
    if not keys or "tokens" not in arrays:
        raise bad_file(path, "holds no attention maps", "attention/<i> and tokens arrays, as "
                       "save_attention writes them", ", ".join(arrays) or "no arrays")
    maps, tokens = [arrays[key] for key in keys], arrays["tokens"]
    if tokens.ndim != 1 or tokens.dtype.kind not in "US":
        raise bad_file(path, "entry 'tokens' is not a list of strings", "a 1-D string array",
                       f"shape {tokens.shape} dtype {tokens.dtype}")
    for key, probs in zip(keys, maps):
        if probs.ndim != 3 or probs.dtype.kind != "f" or probs.shape[-1] != len(tokens):
            raise bad_file(path, f"entry {key!r} is not an attention map of its "
                           f"{len(tokens)} tokens", f"a float (H, T, {len(tokens)}) array",
                           f"shape {probs.shape} dtype {probs.dtype}")
    return maps, [str(token) for token in tokens]


def format_attention(probs: np.ndarray, tokens: list[str], top: int = 3) -> str:
    """A (Tq, Tk) map as text: for each query token, its `top` most attended keys."""
    lines = []
    for i, row in enumerate(probs):
        best = np.argsort(-row, kind="stable")[:top]
        keys = ", ".join(f"{tokens[j]!r} {row[j]:.2f}" for j in best if row[j] > 0)
        lines.append(f"{i:>3} {tokens[i]!r:>16} -> {keys}")
    return "\n".join(lines)


def _layer_maps(maps, batch: int) -> list[np.ndarray]:
    """maps as a list of (H, Tq, Tk) arrays, one per layer (row `batch` of (B, H, Tq, Tk))."""
    if isinstance(maps, np.ndarray):
        if maps.ndim != 3:
            raise ValueError(f"maps as one array must be one layer's (H, Tq, Tk) "
                             f"probabilities; got shape {maps.shape} (pass a list of layers)")
        maps = [maps]
    if not isinstance(maps, (list, tuple)) or not maps:
        raise TypeError("maps must be attention_maps(cache) (a list of (B, H, Tq, Tk) arrays) "
                        f"or a list of (H, Tq, Tk) arrays; got {type(maps).__name__}")
    layers = []
    for index, probs in enumerate(maps):
        probs = np.asarray(probs)
        if probs.ndim == 4:
            if not 0 <= batch < probs.shape[0]:
                raise ValueError(f"batch must be in [0, {probs.shape[0]}); got {batch}")
            probs = probs[batch]
        if probs.ndim != 3 or not np.issubdtype(probs.dtype, np.floating):
            raise ValueError(f"maps[{index}] must be (B, H, Tq, Tk) or (H, Tq, Tk) floats; got "
                             f"shape {probs.shape}, dtype {probs.dtype}")
        layers.append(probs)
    return layers


def _chosen(name: str, chosen, count: int) -> list[int]:
    if chosen is None:
        return list(range(count))
    chosen = [int(i) for i in chosen]
    wrong = [i for i in chosen if not 0 <= i < count]
    if not chosen or wrong:
        raise ValueError(f"{name} must be indices in [0, {count}); got {chosen}")
    return chosen


def _labels(name: str, tokens, count: int) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(count)]
    tokens = list(tokens)
    if len(tokens) != count:
        raise ValueError(f"{name} must hold one token per position, {count}; got {len(tokens)}")
    return [token_label(token) for token in tokens]


def plot_attention(maps, tokens=None, *, query_tokens=None, layers=None, heads=None,
                   batch: int = 0, columns: int | None = None, path=None):
    """Heatmaps of attention probabilities, one panel per (layer, head): row i of a panel is
    query i, column j key j, the colour P_ij (from 0 to 1, one scale for every panel).

    maps: attention_maps(cache) (one (B, H, Tq, Tk) array per attention layer, row `batch`
    drawn), a list of (H, Tq, Tk) arrays, or one (H, Tq, Tk) array (a single layer).
    tokens: the Tk key tokens (default: their positions). query_tokens: the Tq query tokens
    (default: the last Tq of `tokens`, which are all of them when every token queried).
    layers / heads: which to draw (default all), by their index in `maps` / in the layer.
    columns: panels per row (default: as many heads as fit about 20 inches).
    Returns the Figure (panels first, then the colour bar's axes); saves it to `path` if
    given (.png or .svg)."""
    path = check_path(path)
    probs = _layer_maps(maps, batch)
    layers = _chosen("layers", layers, len(probs))
    head_counts = {probs[i].shape[0] for i in layers}
    heads = _chosen("heads", heads, min(head_counts))
    queries, keys = probs[layers[0]].shape[1:]
    if any(probs[i].shape[1:] != (queries, keys) for i in layers):
        raise ValueError("the chosen layers' maps differ in (Tq, Tk): "
                         + ", ".join(f"layer {i} {probs[i].shape[1:]}" for i in layers))
    key_labels = _labels("tokens", tokens, keys)
    if query_tokens is None and tokens is not None and queries <= keys:
        query_tokens = list(tokens)[keys - queries:]
    query_labels = _labels("query_tokens", query_tokens, queries)

    side = min(max(2.0, 0.17 * max(queries, keys) + 0.9), 7.0)      # inches per panel
    if columns is None:                       # as many as fit 20 inches, rows evenly filled
        rows_per_layer = -(-len(heads) // max(1, min(len(heads), int(20 // side))))
        columns = -(-len(heads) // rows_per_layer)
    columns = validate.positive_int("columns", columns)
    rows_per_layer = -(-len(heads) // columns)
    figure = new_figure(columns * side + 1.0, len(layers) * rows_per_layer * side + 0.3)
    grid = figure.add_gridspec(len(layers) * rows_per_layer, columns)
    fontsize = 8 if max(queries, keys) <= 16 else 7 if max(queries, keys) <= 32 else 6
    panels = []
    for row, layer in enumerate(layers):
        for slot, head in enumerate(heads):
            axes = figure.add_subplot(grid[row * rows_per_layer + slot // columns,
                                           slot % columns])
            image = axes.imshow(probs[layer][head], vmin=0.0, vmax=1.0, cmap="viridis",
                                interpolation="nearest", aspect="equal")
            axes.set_title(f"layer {layer}, head {head}", fontsize=9)
            axes.set_xticks(range(keys), key_labels, rotation=90, fontsize=fontsize)
            axes.set_yticks(range(queries), query_labels, fontsize=fontsize)
            axes.set_xlabel("key", fontsize=8)
            if slot % columns == 0:
                axes.set_ylabel("query", fontsize=8)
            panels.append(axes)
    figure.colorbar(image, ax=panels, shrink=min(0.8, 3.0 / len(panels) ** 0.5 + 0.2),
                    label="attention probability")
    return finish(figure, path)
