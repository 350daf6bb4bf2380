"""Every ```python block of README.md and docs/ runs as written, on its own.

Each block runs in a fresh namespace, in a temporary folder of its own, so it can rely on nothing
an earlier block defined or wrote. A block that needs an optional package is skipped, with the
package named, where that package is absent; one that needs torch is marked `torch` (jax or
flax: `jax`) so that CI's torch (JAX) step runs it. A block that is a fragment by design starts
with the line `# sketch`: it is not run, but it must still be valid Python. That is the only way
out: a Python fence spelled otherwise (```py, ```python3, indented) is refused, and a block that
builds a Hugging Face model must put it in eval mode (a fresh one has dropout on). A block
states its claims as asserts, so a false claim fails its test.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKETCH = "# sketch"

# what a block needs, by the modules it imports or the numpy_tf names it uses
OPTIONAL = ("torch", "transformers", "gguf", "matplotlib", "jax", "flax")
NEEDS_TORCH = {"run_torch", "torch_bridge"}
NEEDS_GGUF = {"load_gguf", "load_smollm2", "fetch_smollm2"}
NEEDS_SMOLLM2_WHEEL = {"fetch_smollm2", "load_smollm2"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int              # the line of the block's first line of code
    source: str

    @property
    def name(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

    @property
    def sketch(self) -> bool:
        return self.source.lstrip().startswith(SKETCH)


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, text.count("\n", 0, match.start(1)) + 1, match.group(1))
            for match in FENCE.finditer(text)]


def needs(source: str) -> set[str]:
    """The optional packages a block needs: those it imports, and those numpy_tf's functions it
    calls import (torch for run_torch, gguf for reading GGUF files)."""
    tree = ast.parse(source)
    modules, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    found = {m.split(".")[0] for m in modules} & set(OPTIONAL)
    if names & NEEDS_TORCH or any(m.endswith("torch_bridge") for m in modules):
        found.add("torch")
    if "transformers" in found:
        found.add("torch")
    if names & NEEDS_GGUF:
        found.add("gguf")
    if names & NEEDS_SMOLLM2_WHEEL:
        found.add("smollm2")
    return found


ALL = [block for path in DOCUMENTS for block in blocks(path)]
RUNNABLE = [block for block in ALL if not block.sketch]


def _param(block: Block):
    """A block that needs torch is marked torch, one that needs jax or flax jax, so that CI's
    torch and JAX steps (`pytest -m torch`, `pytest -m jax`) run it after installing them."""
    found = needs(block.source)
    marks = [pytest.mark.torch] if "torch" in found else []
    marks += [pytest.mark.jax] if found & {"jax", "flax"} else []
    return pytest.param(block, id=block.name, marks=marks)


def _skip_unless_available(need: str) -> None:
    if need == "smollm2":
        from numpy_tf import pretrained
        wheel = pretrained.default_cache_dir() / pretrained.SMOLLM2_WHEEL
        if not wheel.is_file():
            pytest.skip(f"the SmolLM2 wheel is not in {wheel.parent} (the block would download "
                        "93 MB; numpy_tf.pretrained.fetch_smollm2() puts it there)")
    elif importlib.util.find_spec(need) is None:
        pytest.skip(f"needs {need}, which is not installed")


@pytest.mark.parametrize("block", [_param(b) for b in RUNNABLE])
def test_block_runs_on_its_own(block, tmp_path, monkeypatch):
    for need in sorted(needs(block.source)):
        _skip_unless_available(need)
    monkeypatch.chdir(tmp_path)
    code = compile(block.source, block.name, "exec")
    exec(code, {"__name__": "__main__"})          # a fresh namespace: nothing carried over


@pytest.mark.parametrize("block", [b for b in ALL if b.sketch], ids=lambda b: b.name)
def test_sketch_is_valid_python(block):
    ast.parse(block.source)


def test_the_documents_have_runnable_blocks():
    """The collection itself works (a broken fence pattern would make every test above vanish)."""
    assert (ROOT / "docs").is_dir()
    assert len(RUNNABLE) >= 10
    assert {block.path.name for block in RUNNABLE} >= {"README.md", "models.md"}


def test_blocks_are_found_with_their_lines_and_sketches_told_apart(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n"
                    "```python\n# sketch\nf(...)\n```\n")
    found = blocks(page)
    assert [(b.line, b.source, b.sketch) for b in found] == [
        (4, "x = 1\n", False), (11, "# sketch\nf(...)\n", True)]


def test_a_block_whose_claim_is_false_fails(tmp_path, monkeypatch):
    """What test_block_runs_on_its_own does with a block that asserts something untrue."""
    page = tmp_path / "page.md"
    page.write_text("```python\nimport numpy as np\nassert np.float64(0.1) * 3 == 0.3\n```\n")
    with pytest.raises(AssertionError):
        test_block_runs_on_its_own(blocks(page)[0], tmp_path, monkeypatch)


# a fence that opens Python code in another spelling would hide its block from FENCE
PYTHON_FENCE = re.compile(r"^[ \t]*(```|~~~)[ \t]*\{?[ \t]*(python3?|py3?|pycon|ipython3?)\b",
                          re.I | re.M)


def test_sketch_is_the_only_way_out():
    """Every fence that opens Python is a plain ```python at the start of a line, so each is
    collected above: a ```py, ```python3, ~~~python or indented fence would silently not run."""
    hidden = [f"{path.relative_to(ROOT)}:{path.read_text().count(chr(10), 0, m.start()) + 1}: "
              f"{m.group(0).strip()!r}" for path in DOCUMENTS
              for m in PYTHON_FENCE.finditer(path.read_text())
              if m.group(0) != "```python" or FENCE.match(path.read_text(), m.start()) is None]
    assert not hidden, hidden
    page = "x\n  ```python\nx = 1\n  ```\n```py\ny = 2\n```\n"
    assert len(PYTHON_FENCE.findall(page)) == 2 and not FENCE.findall(page)


def hf_models_left_in_training_mode(source: str) -> list[str]:
    """The Hugging Face model classes a block builds without ever calling .eval(): a fresh HF
    model is in training mode, dropout on, so its outputs are random (GPT-2's logits differ
    from numpy_tf's by 0.4)."""
    tree = ast.parse(source)
    classes = {alias.asname or alias.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("transformers") for alias in node.names
               if not alias.name.endswith(("Config", "Tokenizer", "TokenizerFast"))}
    built = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id in classes}
    built |= {"from_pretrained" for node in ast.walk(tree) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained"}
    evaluated = any(isinstance(node, ast.Attribute) and node.attr == "eval"
                    for node in ast.walk(tree))
    return [] if evaluated else sorted(built)


@pytest.mark.parametrize("block", [b for b in RUNNABLE if "transformers" in needs(b.source)],
                         ids=lambda b: b.name)
def test_hugging_face_models_are_put_in_eval_mode(block):
    assert not hf_models_left_in_training_mode(block.source), block.name


def test_a_model_left_in_training_mode_is_seen():
    built = ("from transformers import GPT2Config, GPT2LMHeadModel\n"
             "hf = GPT2LMHeadModel(GPT2Config())\n")
    assert hf_models_left_in_training_mode(built) == ["GPT2LMHeadModel"]
    evaluated = built.replace("GPT2Config())", "GPT2Config()).eval()")
    assert not hf_models_left_in_training_mode(evaluated)
    assert hf_models_left_in_training_mode("import transformers\nm = transformers.AutoModel."
                                           "from_pretrained('x')\n") == ["from_pretrained"]


def test_needs_sees_imports_and_numpy_tf_functions():
    assert needs("import torch\n") == {"torch"}
    assert needs("from transformers import GPT2Config\n") == {"torch", "transformers"}
    assert needs("from numpy_tf.torch_bridge import run_torch\n") == {"torch"}
    assert needs("from numpy_tf.pretrained import load_gguf\n") == {"gguf"}
    assert needs("import numpy as np\nnp.zeros(3)\n") == set()
