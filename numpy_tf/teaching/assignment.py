"""Homework skeletons written from numpy_tf's own source.

    text = assignment(["layernorm", "attention"], filename="homework.py")

For each requested layer the skeleton holds, taken from numpy_tf's family file with
inspect/ast: the cache NamedTuple, the forward (complete), and the backward's signature with a
docstring reduced to the definitions (the derivation is the exercise), the line numpy_tf's
backward opens with given as it is (`validate.backward_inputs(dout, cache, <Layer>Cache)`: the
cache is the forward's, dout has the output's shape and dtype; so a student's backward refuses
bad input as numpy_tf's does), then a body that raises NotImplementedError. It is
self-contained: the helpers of the layer's own family file that the forward or numpy_tf's
backward use are copied in (so a student has the same tools); names from other numpy_tf
modules, and the functions of layers not requested, are imported from numpy_tf.
`numpy-tf grade homework.py` grades it (numpy_tf.grading).
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Sequence

from .layer_table import LAYERS, LayerSpec, layer
from .notebook import notebook

# every layer's functions and cache: imported from numpy_tf unless the homework asks for them
_REGISTRY_NAMES = {f"{name}_{kind}" for name in LAYERS for kind in ("forward", "backward")} | \
    {spec.cache.__name__ for spec in LAYERS.values() if spec.cache}


@dataclass
class _ModuleIndex:
    """A family file's top-level names: where each is defined, or how it is imported."""
    definitions: dict[str, tuple[int, str]]      # name -> (line, source)
    imports: dict[str, str]                      # name -> an absolute import line


def _index(module) -> _ModuleIndex:
    source = inspect.getsource(module)
    lines = source.splitlines()
    package = module.__package__
    definitions, imports = {}, {}
    for node in ast.parse(source).body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "\n".join(lines[start - 1:node.end_lineno])   # whole lines: comments kept
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            definitions[node.name] = (node.lineno, text)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    definitions[target.id] = (node.lineno, text)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:                  # `from ..core import y` -> `from numpy_tf.core import y`
                base = importlib.util.resolve_name("." * node.level + base, package)
            for alias in node.names:
                suffix = f" as {alias.asname}" if alias.asname else ""
                imports[alias.asname or alias.name] = f"from {base} import {alias.name}{suffix}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                suffix = f" as {alias.asname}" if alias.asname else ""
                imports[alias.asname or alias.name.split(".")[0]] = \
                    f"import {alias.name}{suffix}"
    return _ModuleIndex(definitions, imports)


def _names(source: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}


def _opening_check(function: ast.FunctionDef, lines: list[str]) -> list[str]:
    """The `validate.backward_inputs(dout, cache, ...)` line that opens numpy_tf's backward
    (right after its docstring), as given code with a comment; [] if it opens otherwise."""
    if len(function.body) < 2:
        return []
    first = function.body[1]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and
            isinstance(first.value.func, ast.Attribute) and
            first.value.func.attr == "backward_inputs"):
        return []
    indent = lines[first.lineno - 1][:first.col_offset]
    return [f"{indent}# given: numpy_tf's check of the cache's kind and dout's shape and dtype",
            *lines[first.lineno - 1:first.end_lineno]]


def _stub(spec: LayerSpec, source: str) -> str:
    """The backward's signature, its definitions as the docstring, the check of its inputs
    numpy_tf's backward opens with (if it does), NotImplementedError."""
    function = ast.parse(source).body[0]
    lines = source.splitlines()
    signature = lines[:function.body[0].lineno - 1]
    check = "".join(line + "\n" for line in _opening_check(function, lines))
    docstring = "\n".join(("    " + line).rstrip() for line in [
        *spec.definitions.splitlines(), "",
        "Derive each gradient from these definitions (write the steps here), then code it.",
        "The cache holds what the forward saved for you."])
    return "\n".join(signature) + f'\n    """{docstring.lstrip()}\n    """\n{check}' \
        f'    raise NotImplementedError("{spec.name}_backward: derive it, then write it")'


def _section(spec: LayerSpec, own: set[str], emitted: set[str], imports: set[str]
             ) -> tuple[str, str]:
    """One layer's part of the skeleton: (the helpers it needs that are not emitted yet (in
    the family file's order), its cache and its forward; its backward stub)."""
    index = _index(spec.module)
    forward, backward = (inspect.getsource(f).strip() for f in (spec.forward, spec.backward))
    cache = index.definitions[spec.cache.__name__][1] if spec.cache else ""
    helpers: dict[str, tuple[int, str]] = {}
    pending = list(_names(cache) | _names(forward) | _names(backward))
    while pending:
        name = pending.pop()
        if name in own or name in emitted or name in helpers:
            continue
        if name in index.definitions and name not in _REGISTRY_NAMES:
            helpers[name] = index.definitions[name]
            pending.extend(_names(helpers[name][1]))
        elif name in index.definitions:         # another layer's function: numpy_tf's own
            imports.add(f"from {spec.module.__name__} import {name}")
        elif name in index.imports:
            imports.add(index.imports[name])
    emitted |= set(helpers)
    parts = [source for _, source in sorted(helpers.values())]
    parts += [part for part in (cache, forward) if part]
    title = f"# -- {spec.name} "
    return title + "-" * (96 - len(title)) + "\n" + "\n\n\n".join(parts), _stub(spec, backward)


def _import_block(lines: set[str]) -> str:
    """`import x` lines, then `from x import a, b` (one line per module), numpy_tf's last."""
    plain = sorted(line for line in lines if line.startswith("import "))
    grouped: dict[str, list[str]] = {}
    for line in lines - set(plain):
        module, name = line[len("from "):].split(" import ")
        grouped.setdefault(module, []).append(name)
    order = sorted(grouped, key=lambda module: (module.startswith("numpy_tf"), module))
    return "\n".join(plain + [f"from {module} import {', '.join(sorted(grouped[module]))}"
                              for module in order])


def assignment(layers: Sequence[str], filename: str = "homework.py", format: str = "py") -> str:
    """The text of a homework file for `layers` (names of numpy_tf.teaching.layer_table.LAYERS;
    an unknown name is a ValueError listing the known ones): a Python file (format "py"), or
    a Jupyter notebook ("ipynb": the same code, a cell for the imports, then for each layer a
    cell of what is given and a cell to write; `numpy-tf grade` reads either)."""
    if format not in ("py", "ipynb"):
        raise ValueError(f"format must be 'py' or 'ipynb'; got {format!r}")
    if not layers:
        raise ValueError(f"name at least one layer; known layers: {', '.join(LAYERS)}")
    specs = list({name: layer(name) for name in layers}.values())
    own = {f"{spec.name}_{kind}" for spec in specs for kind in ("forward", "backward")}
    own |= {spec.cache.__name__ for spec in specs if spec.cache}
    emitted: set[str] = set()
    imports: set[str] = set()
    sections = [_section(spec, own, emitted, imports) for spec in specs]
    names = ", ".join(spec.name for spec in specs)
    instructions = (
        f"Homework: the backward passes of {names}.\n\n"
        f"Written by `numpy-tf assignment {' '.join(spec.name for spec in specs)}` from numpy_tf's "
        "own source.\nEach forward is complete; each `<layer>_backward(dout, cache)` raises "
        "NotImplementedError:\nderive the gradient from the definitions in its docstring and "
        "write it. `dout` is the\ngradient of the loss with respect to the forward's output; "
        "return the gradients with\nrespect to the forward's inputs, in the order the docstring "
        "gives.\n\nCheck your work (numpy_tf's own backward and finite differences of its "
        f"forward, on edge cases):\n\n    numpy-tf grade {filename}            "
        "(add --json for a machine-readable report)\n\n"
        "Read numpy_tf's answer afterwards with `numpy-tf explain <layer>`.\n")
    preamble = "from __future__ import annotations\n\n" + _import_block(imports)
    if format == "ipynb":
        cells = [("markdown", instructions.replace("\n    numpy-tf", "\n    !numpy-tf")),
                 ("code", preamble)]
        for given, stub in sections:
            cells += [("code", given), ("code", stub)]
        return notebook(cells)
    return f'"""{instructions}"""\n' + preamble + "\n\n\n" + \
        "\n\n\n".join(f"{given}\n\n\n{stub}" for given, stub in sections) + "\n"
