"""How the model code reads: every block and model backward is its forward in exact reverse, and
every cache a model returns is a NamedTuple down to the layers' own caches.

The first check reads the source (ast): it lists the sub-layers a forward calls, in order
(`self.norm1.forward(...)`, `block.forward(...)` in a loop over `self.blocks`,
`cbow_forward(...)`, `self.encode(...)`), and the ones the matching backward calls
(`self.norm1.backward(...)`, `self.encode_backward(...)`), one listing per branch of
`if self.norm_first:`, and asks that the second be the first reversed. It also asks that no
backward nests a backward call inside another call and that no listing uses a lambda."""
import ast
import inspect
import textwrap

import numpy as np
import pytest

from numpy_tf.layers.multihead import KVCache
from numpy_tf.models.bert import Bert, BertConfig, BertEmbeddings, MaskedLMHead
from numpy_tf.models.cbow import CBOW
from numpy_tf.models.encoder_decoder.layers import (TransformerDecoderLayer,
                                                    TransformerEncoderLayer)
from numpy_tf.models.encoder_decoder.seq2seq import Seq2Seq, Seq2SeqConfig
from numpy_tf.models.encoder_decoder.transformer import (Transformer, TransformerDecoder,
                                                         TransformerEncoder)
from numpy_tf.models.gpt import GPT, DecoderBlock, GPTConfig
from numpy_tf.models.llama import Llama, LlamaConfig, LlamaDecoderLayer


# -- reading a listing ------------------------------------------------------------------------
def _attribute_path(node) -> str | None:
    """`self.a.b` -> "a.b"; a bare name -> the name; anything else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join(reversed(parts)) if node.id == "self" else \
            ".".join([node.id, *reversed(parts)])
    return None


def _loop_source(loop: ast.For) -> str | None:
    """The `self.<modules>` a for loop walks (`for block in self.blocks`,
    `for layer, c in zip(reversed(list(self.layers)), ...)`)."""
    for node in ast.walk(loop.iter):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            return node.attr
    return None


def _loop_names(loop: ast.For) -> set[str]:
    target = loop.target
    names = target.elts if isinstance(target, ast.Tuple) else [target]
    return {name.id for name in names if isinstance(name, ast.Name)}


def _step(call: ast.Call, direction: str, loops: dict[str, str]) -> str | None:
    """The sub-layer a call runs in `direction` ("forward" or "backward"), or None."""
    func = call.func
    if isinstance(func, ast.Name) and func.id.endswith(f"_{direction}"):      # cbow_forward(..)
        return func.id[:-len(direction) - 1]
    if not isinstance(func, ast.Attribute):
        return None
    owner = _attribute_path(func.value)
    if func.attr == direction and owner is not None:                           # x.forward(..)
        return loops.get(owner, owner)
    if isinstance(func.value, ast.Name) and func.value.id == "self":           # self.encode(..)
        name = func.attr
        if direction == "backward" and name.endswith("_backward"):
            return name[:-len("_backward")]
        if direction == "forward" and not name.endswith("_backward") and "check" not in name:
            return name
    return None


def _listings(statements, direction: str, loops=None) -> list[list[str]]:
    """Every sequence of sub-layer calls, one per branch of `if self.norm_first:`."""
    loops = dict(loops or {})
    listings: list[list[str]] = [[]]
    for statement in statements:
        if isinstance(statement, ast.If) and "norm_first" in ast.unparse(statement.test):
            branches = (_listings(statement.body, direction, loops)
                        + _listings(statement.orelse, direction, loops))
            listings = [done + branch for done in listings for branch in branches]
            continue
        if isinstance(statement, ast.For):
            source = _loop_source(statement)
            inner = {**loops, **{name: source for name in _loop_names(statement)}}
            parts = _listings(statement.body, direction, inner)
            listings = [done + part for done in listings for part in parts]
            continue
        if isinstance(statement, ast.If):           # an optional part: both arms, in order
            parts = _listings(statement.body + statement.orelse, direction, loops)
            listings = [done + part for done in listings for part in parts]
            continue
        steps = [_step(node, direction, loops) for node in ast.walk(statement)
                 if isinstance(node, ast.Call)]
        listings = [done + [s for s in steps if s is not None] for done in listings]
    return listings


def _function(cls, name: str) -> ast.FunctionDef:
    source = textwrap.dedent(inspect.getsource(getattr(cls, name)))
    return ast.parse(source).body[0]


def listing_problems(forward: ast.FunctionDef, backward: ast.FunctionDef) -> list[str]:
    """What keeps `backward` from reading as `forward` in reverse (empty: nothing)."""
    problems = []
    forwards = _listings(forward.body, "forward")
    backwards = _listings(backward.body, "backward")
    if len(forwards) != len(backwards):
        problems.append(f"{len(forwards)} forward listings but {len(backwards)} backward ones")
    for index, (ahead, back) in enumerate(zip(forwards, backwards)):
        if not ahead:
            problems.append(f"listing {index}: the forward calls no sub-layer")
        if back != ahead[::-1]:
            problems.append(f"listing {index}: forward {ahead}, backward {back} (expected "
                            f"{ahead[::-1]})")
    for function in (forward, backward):
        if any(isinstance(node, ast.Lambda) for node in ast.walk(function)):
            problems.append(f"{function.name} uses a lambda")
    for node in ast.walk(backward):
        if isinstance(node, ast.Call):
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                if any(isinstance(inner, ast.Call) and _step(inner, "backward", {})
                       for inner in ast.walk(argument)):
                    problems.append(f"backward nests a call inside a call: "
                                    f"{ast.unparse(node)}")
    return problems


PAIRS = [
    (DecoderBlock, "forward", "backward"),
    (GPT, "forward", "backward"),
    (LlamaDecoderLayer, "forward", "backward"),
    (Llama, "forward", "backward"),
    (BertEmbeddings, "forward", "backward"),
    (MaskedLMHead, "forward", "backward"),
    (Bert, "encode", "encode_backward"),
    (Bert, "forward", "backward"),
    (TransformerEncoderLayer, "forward", "backward"),
    (TransformerDecoderLayer, "forward", "backward"),
    (TransformerEncoder, "forward", "backward"),
    (TransformerDecoder, "forward", "backward"),
    (Transformer, "forward", "backward"),
    (Seq2Seq, "_embed", "_embed_backward"),
    (Seq2Seq, "encode", "encode_backward"),
    (Seq2Seq, "decode", "decode_backward"),
    (Seq2Seq, "forward", "backward"),
    (CBOW, "forward", "backward"),
]


@pytest.mark.parametrize("cls, forward, backward", PAIRS,
                         ids=[f"{cls.__name__}.{backward}" for cls, _, backward in PAIRS])
def test_backward_reads_as_its_forward_in_reverse(cls, forward, backward):
    assert listing_problems(_function(cls, forward), _function(cls, backward)) == []


def test_both_norm_orders_are_listed_for_the_blocks_that_have_them():
    for cls in (DecoderBlock, TransformerEncoderLayer, TransformerDecoderLayer):
        assert len(_listings(_function(cls, "forward").body, "forward")) == 2
        assert len(_listings(_function(cls, "backward").body, "backward")) == 2
    pre, post = _listings(_function(TransformerDecoderLayer, "forward").body, "forward")
    assert pre[:3] == ["norm1", "self_attn", "dropout1"]
    assert post[:3] == ["self_attn", "dropout1", "norm1"]
    assert pre[-1] == "dropout3" and post[-1] == "norm3"


FORWARD = """
    def forward(self, x):
        h, norm1 = self.norm1.forward(x)
        a, attention = self.attention.forward(h)
        return x + a, Cache(norm1, attention)
"""
IN_ORDER = """
    def backward(self, dy, cache):
        dh = self.attention.backward(dy, cache.attention)
        dx = dy + self.norm1.backward(dh, cache.norm1)
        return dx
"""
SWAPPED = """
    def backward(self, dy, cache):
        dx = dy + self.norm1.backward(dy, cache.norm1)
        dh = self.attention.backward(dx, cache.attention)
        return dh
"""
NESTED = """
    def backward(self, dy, cache):
        return dy + self.norm1.backward(self.attention.backward(dy, cache.attention),
                                        cache.norm1)
"""
LAMBDA = """
    def backward(self, dy, cache):
        undo = lambda d: self.attention.backward(d, cache.attention)
        dh = undo(dy)
        return dy + self.norm1.backward(dh, cache.norm1)
"""


@pytest.mark.parametrize("backward, complaint", [
    (SWAPPED, "expected ['attention', 'norm1']"), (NESTED, "nests a call inside a call"),
    (LAMBDA, "uses a lambda"), (IN_ORDER, None)])
def test_the_listing_check_fails_on_a_backward_out_of_order(backward, complaint):
    source = "class Block:" + FORWARD + backward
    forward_node, backward_node = ast.parse(source).body[0].body
    problems = listing_problems(forward_node, backward_node)
    if complaint is None:
        assert problems == []
    else:
        assert any(complaint in problem for problem in problems), problems


# -- every cache a NamedTuple ------------------------------------------------------------------
def _plain_tuples(node, path="cache") -> list[str]:
    """The paths of the tuples in a cache tree that are not NamedTuples (a shape, a tuple of
    ints such as a cache's x_shape, is a value, not a group of caches)."""
    found = []
    if isinstance(node, tuple) and all(isinstance(item, (int, np.integer)) for item in node) \
            and getattr(type(node), "_fields", None) is None:
        return found
    if isinstance(node, tuple):
        fields = getattr(type(node), "_fields", None)
        if fields is None:
            found.append(path)
            names = [f"{path}[{i}]" for i in range(len(node))]
        else:
            names = [f"{path}.{name}" for name in fields]
        for name, item in zip(names, node):
            found += _plain_tuples(item, name)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _plain_tuples(item, f"{path}[{index}]")
    return found


# Tuples a layer or container builds, not a model (none left: layers/ and core/ name theirs too).
LAYER_TUPLES = ()


def _rng():
    return np.random.default_rng(0)


def _model_caches():
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 0]])
    padding = np.array([[False] * 4, [False, False, True, True]])
    src = np.random.default_rng(1).standard_normal((2, 5, 8))
    tgt = np.random.default_rng(2).standard_normal((2, 3, 8))
    seq2seq = Seq2Seq(Seq2SeqConfig(d_model=8, nhead=2, dropout=0.1))
    yield "gpt", GPT(GPTConfig.tiny()).forward(ids, padding)[1]
    yield "gpt post-ln", GPT(GPTConfig.tiny(norm_first=False, dropout=0.1)).forward(
        ids, rng=_rng())[1]
    yield "llama", Llama(LlamaConfig()).forward(ids, padding)[1]
    yield "bert", Bert(BertConfig(dropout=0.1)).forward(ids, padding, rng=_rng())[1]
    yield "bert pre-ln", Bert(BertConfig(norm_first=True)).forward(ids, padding)[1]
    for norm_first in (False, True):
        model = Transformer(8, 2, 2, 2, 16, 0.1, norm_first=norm_first)
        yield f"transformer {norm_first}", model.forward(src, tgt, tgt_is_causal=True,
                                                          rng=_rng())[1]
    yield "seq2seq", seq2seq.forward(ids % 10, ids[:, :3] % 10, rng=_rng())[1]
    yield "cbow", CBOW(10, 4).forward(ids)[1]


def _model_plain_tuples(cache) -> list[str]:
    return [path for path in _plain_tuples(cache) if path.rsplit(".", 1)[-1] not in LAYER_TUPLES]


def test_every_cache_a_model_builds_is_a_named_tuple():
    for name, cache in _model_caches():
        plain = _model_plain_tuples(cache)
        assert plain == [], f"{name}: anonymous tuples at {plain}"


def test_an_anonymous_tuple_in_a_cache_is_found():
    layer = TransformerEncoderLayer(8, 2, 16, 0.0)
    _, cache = layer.forward(np.random.default_rng(3).standard_normal((2, 4, 8)))
    assert _model_plain_tuples(cache) == []
    changed = cache._replace(dropout1=(cache.dropout1, None))
    assert _model_plain_tuples(changed) == ["cache.dropout1"]


# -- the KV caches ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_present_is_a_kv_cache_and_a_plain_pair_still_works(family):
    model = GPT(GPTConfig.tiny()) if family == "gpt" else Llama(LlamaConfig(num_key_value_heads=2))
    ids = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 1]])
    full, _ = model.forward(ids)
    _, cache = model.forward(ids[:, :3])
    heads = 4 if family == "gpt" else 2
    for kv in cache.present:
        assert isinstance(kv, KVCache) and kv._fields == ("k", "v")
        assert kv.k.shape == kv.v.shape == (2, heads, 3, 4)
        assert kv.k is kv[0] and kv.v is kv[1]
    first_block = cache.blocks[0].attention if family == "gpt" else cache.layers[0].self_attn
    assert cache.present[0] is first_block.present
    plain = [(np.array(k), np.array(v)) for k, v in cache.present]      # a user's own pairs
    named, named_cache = model.forward(ids[:, 3:], past_kv=cache.present)
    from_plain, _ = model.forward(ids[:, 3:], past_kv=plain)
    np.testing.assert_array_equal(named, from_plain)
    np.testing.assert_allclose(named, full[:, 3:], rtol=1e-12, atol=1e-13)
    assert [kv.k.shape[2] for kv in named_cache.present] == [5] * len(cache.present)


def test_decoder_present_and_cross_kv_are_kv_caches():
    model = Transformer(8, 2, 1, 2, 16, 0.0)
    memory, _ = model.encoder.forward(np.random.default_rng(4).standard_normal((2, 5, 8)))
    tgt = np.random.default_rng(5).standard_normal((2, 3, 8))
    full, _ = model.decoder.forward(tgt, memory, tgt_is_causal=True)
    first, cache = model.decoder.forward(tgt[:, :2], memory, tgt_is_causal=True)
    for layer_cache, present, cross in zip(cache.layers, cache.present, cache.cross_kv):
        assert isinstance(present, KVCache) and isinstance(cross, KVCache)
        assert present is layer_cache.present and cross is layer_cache.cross_kv
        assert present.k.shape == (2, 2, 2, 4) and cross.v.shape == (2, 2, 5, 4)
    plain_past = [tuple(kv) for kv in cache.present]
    plain_static = [tuple(kv) for kv in cache.cross_kv]
    step, _ = model.decoder.forward(tgt[:, 2:], None, tgt_is_causal=True, past_kv=plain_past,
                                    static_kv=plain_static)
    np.testing.assert_allclose(np.concatenate([first, step], axis=1), full, rtol=1e-12,
                               atol=1e-13)
