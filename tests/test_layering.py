"""The package's folders are layers: each imports only the ones below it (docs/SPEC.md §9).

Read from the source with ast, so an import inside a function counts as much as one at the top
of a file (it is a dependency all the same); only torch, transformers and the optional extras
are required to stay inside functions.
"""
import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "numpy_tf"

# what each folder may import of numpy_tf, besides itself
ALLOWED = {
    "core": set(),
    "kernels": {"core"},
    "layers": {"core", "kernels"},
    "text": {"core"},
    "models": {"core", "layers", "text"},
    "optim": {"core", "layers"},
    "generation": {"core", "layers", "models"},
    "training": {"core", "layers", "models", "optim", "text", "generation"},
    "interop": {"core", "layers", "models", "text"},
    "checking": {"core", "layers", "models", "optim", "text", "training", "generation",
                 "interop"},
    "study": {"core", "layers", "models", "text", "checking"},
    "teaching": {"core", "layers", "models", "optim", "text", "checking"},
    "cli": {"core", "layers", "models", "optim", "text", "training", "generation", "interop",
            "checking", "teaching", "study"},
}
# imported only inside the functions that need them (optional, heavy, or both)
FUNCTION_ONLY = {"torch", "transformers", "gguf", "jax", "jaxlib", "flax", "matplotlib",
                 "nbformat", "nbclient", "ml_dtypes", "threadpoolctl", "safetensors"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        yield path, name, package


def _imports(path: Path, package: str):
    """(absolute module name, line, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, package)
            yield base, node.lineno, id(node) in top_level
            if base in {"numpy_tf", package}:            # from . import x: x is a module too
                for alias in node.names:
                    yield f"{base}.{alias.name}", node.lineno, id(node) in top_level


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "numpy_tf" else None


MODULES = list(_modules())


@pytest.mark.parametrize("path, name, package", MODULES, ids=[m[1] for m in MODULES])
def test_each_folder_imports_only_the_layers_below_it(path, name, package):
    folder = _folder(name)
    if folder is None or folder.startswith("_") or folder == "__main__":
        return                                      # the package's own __init__ and __main__
    assert folder in ALLOWED, f"{folder}/ is a new folder: give it a place in ALLOWED"
    wrong = []
    for target, line, _ in _imports(path, package):
        other = _folder(target)
        if other is None or other == folder or other.startswith("_"):
            continue
        if other not in ALLOWED[folder]:
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_the_cli():
    wrong = [f"{path.relative_to(ROOT)}:{line}" for path, name, package in MODULES
             if _folder(name) != "cli" and not name.endswith("__main__")
             for target, line, _ in _imports(path, package) if _folder(target) == "cli"]
    assert not wrong, wrong


def test_heavy_and_optional_packages_are_imported_only_inside_functions():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target} at module level"
             for path, name, package in MODULES
             for target, line, top in _imports(path, package)
             if top and target.split(".")[0] in FUNCTION_ONLY]
    assert not wrong, "\n".join(wrong)


def test_reference_never_imports_numpy_tf():
    """The torch side stands on its own, or an error in numpy_tf could be copied into the very
    fixture meant to catch it (SPEC §7)."""
    wrong = [f"{path.relative_to(ROOT)}:{line}"
             for path in sorted((ROOT / "reference").rglob("*.py"))
             for target, line, _ in _imports(path, "reference")
             if target.split(".")[0] == "numpy_tf"]
    assert not wrong, wrong


def test_the_check_itself_sees_imports(tmp_path):
    """A file that breaks the rule is caught (so the tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\n\ndef f():\n    from ..models.gpt import GPT\n"
                   "import torch\n")
    found = list(_imports(bad, "numpy_tf.layers"))
    assert ("numpy_tf.models.gpt", 4, False) in found
    assert ("torch", 5, True) in found
