"""The module paths of numpy_tf's first, flat layout (`numpy_tf.norm`, `numpy_tf.cases`, ...),
kept working for code written against it: each old path is another name for the module that now
holds that code, so `import numpy_tf.norm` and `numpy_tf.layers.norm` are one module object.

`numpy_tf.gradcheck`, `numpy_tf.feedforward` and `numpy_tf.generate` are not here: those names
are the functions the package exports (the modules are numpy_tf.checking.finite_differences,
numpy_tf.layers.mlp and numpy_tf.generation.decoding).

`numpy_tf.jax_bridge` (numpy_tf.checking.jax_bridge) is here too, though newer than that
layout: the JAX bridge sits at the short path of its torch counterpart.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

OLD_PATHS = {
    "accounting": "models.accounting", "activations": "layers.activations",
    "assignment": "teaching.assignment", "attention": "layers.attention",
    "bert": "models.bert", "bpe": "text.bpe", "cases": "checking.case_file",
    "cbow": "models.cbow", "checkpoint": "training.checkpoint",
    "compare": "checking.compare", "corpus": "text.corpus", "data": "text.datasets",
    "dropout": "layers.dropout", "embedding": "layers.embedding",
    "explain": "teaching.explain", "export": "checking.export",
    "gguf_tokenizer": "text.gguf_tokenizer", "gpt": "models.gpt", "grading": "teaching.grading",
    "interop_bert": "interop.hf_bert", "jax_bridge": "checking.jax_bridge",
    "layer_inputs": "teaching.layer_inputs",
    "layers_registry": "teaching.layer_table", "layout": "interop.layout",
    "linear": "layers.linear", "llama": "models.llama", "loss": "layers.cross_entropy_loss",
    "multihead": "layers.multihead", "norm": "layers.norm", "npz": "core.npz",
    "objectives": "models.objectives", "optimizer": "optim.optimizer",
    "positions": "layers.positions", "pretrained": "interop.pretrained", "rope": "layers.rope",
    "schedule": "optim.schedule", "seq2seq": "models.encoder_decoder.seq2seq",
    "softmax": "layers.softmax", "special": "core.special", "tolerances": "core.tolerances",
    "torch_bridge": "checking.torch_bridge", "train": "training.trainer",
    "transformer": "models.encoder_decoder.transformer",
    "transformer_layers": "models.encoder_decoder.layers", "validate": "core.validate",
    "verify": "checking.fixtures",
}
# old modules whose code now lives in several: the old path shows the names of all of them
SPLIT = {
    "cbow": ("models.cbow", "training.cbow", "text.vocabulary"),
    "data": ("text.datasets", "text.corpus"),
    "train": ("training.trainer", "training.tasks"),
}


class _Joined(types.ModuleType):
    """An old module split in several: each name is looked up in the new modules in order."""

    def __init__(self, name: str, parts: tuple[str, ...]):
        super().__init__(name, f"numpy_tf.{name.rpartition('.')[2]}: now "
                         + ", ".join(f"numpy_tf.{part}" for part in parts))
        self._parts = [importlib.import_module(f"numpy_tf.{part}") for part in parts]

    def __getattr__(self, name: str):
        for part in self._parts:
            if hasattr(part, name):
                return getattr(part, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self):
        return sorted({name for part in self._parts for name in dir(part)})


_JOINED: dict[str, _Joined] = {}


def new_module(old: str):
    """The module an old flat name now stands for (imported on first use)."""
    if old in SPLIT:
        if old not in _JOINED:
            _JOINED[old] = _Joined(f"numpy_tf.{old}", SPLIT[old])
        return _JOINED[old]
    return importlib.import_module(f"numpy_tf.{OLD_PATHS[old]}")


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves `import numpy_tf.<old>` to the module that holds its code now."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package == "numpy_tf" and name in OLD_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return new_module(spec.name.partition(".")[2])     # the existing module object

    def exec_module(self, module) -> None:
        pass                                                # already executed at its new path


def install() -> None:
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())
