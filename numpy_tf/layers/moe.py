"""The sparse mixture-of-experts feed-forward (Mixtral's MixtralSparseMoeBlock) and the router's
load-balancing auxiliary loss (the Switch Transformer's, as HF's load_balancing_loss_func).

Shapes: N tokens (every (batch, time) position, flattened), C hidden, F intermediate (of one
expert), E experts, k experts per token (top_k), L layers (for the auxiliary loss).

Each token x_t (C,) is sent to k of E SwiGLU experts, chosen by a linear router:

    z_t = W_router x_t                         (E,)  router logits, W_router (E, C)
    p_t = softmax(z_t)                         (E,)  over ALL experts, as HF computes it
    S_t = the k experts of largest p_t         (k,)  descending (torch.topk's order)
    w_tj = p_t[S_tj] / sum_i p_t[S_ti]         (k,)  renormalised over the selected
    y_t = sum_j w_tj SwiGLU_{S_tj}(x_t)        (C,)

The renormalised w_t is the softmax of the selected logits alone (the common factor
1 / sum_e exp(z_te) cancels); HF computes it through p, and so does the code, for the same
rounding. Expert e is layers/mlp.py's SwiGLU, down_e(silu(gate_e x) * up_e(x)), with weights
W_gate[e] (F, C), W_up[e] (F, C), W_down[e] (C, F). Transformers 5 stores the first two stacked
as gate_up_proj (E, 2F, C), gate_up_proj[e] = [W_gate[e]; W_up[e]], and the third as
down_proj (E, C, F): those are the parameters' names here (SparseMoE.experts).

The auxiliary loss (load_balancing_loss_forward) pushes the router toward using every expert
equally; see its backward for the formula and its gradient.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from ..core import validate
from ..core.module import Module, Parameter
from .linear import Linear, LinearCache, linear_backward, linear_forward
from .mlp import SwiGLUCache, swiglu_backward, swiglu_forward
from .softmax import SoftmaxCache, softmax_backward, softmax_forward


def top_k_experts(probs: np.ndarray, top_k: int) -> np.ndarray:
    """(N, k) the indices of the k largest probabilities of each row, largest first (as
    torch.topk; a tie goes to the lower index, where torch leaves the order unspecified)."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]


class ExpertCall(NamedTuple):
    tokens: np.ndarray          # (n,) the rows t routed to this expert (each at most once)
    slots: np.ndarray           # (n,) which of the token's k choices it is (j with S_tj = e)
    swiglu: SwiGLUCache         # of SwiGLU_e on x[tokens]
    out: np.ndarray             # (n, C) SwiGLU_e(x_t), before the routing weight


class MoECache(NamedTuple):
    shape: tuple                # x's shape (..., C)
    router: LinearCache         # x (N, C), W_router (E, C)
    probs: SoftmaxCache         # p (N, E), the softmax over every expert
    selected: np.ndarray        # (N, k) S, int
    top_probs: np.ndarray       # (N, k) q_tj = p_t[S_tj]
    weights: np.ndarray         # (N, k) w = q / sum_j q_j
    experts: tuple              # per expert e, an ExpertCall, or None if no token chose e
    router_logits: np.ndarray   # (N, E) z, what the auxiliary loss reads (HF's router_logits)
    hidden: int                 # F, an expert's intermediate width

    @property
    def output_spec(self):      # the (shape, dtype) dout must have: x's
        return self.shape, self.router.x.dtype


def _check_moe(x, router_weight, gate_weights, up_weights, down_weights, top_k) -> int:
    validate.float_array("x", x, min_ndim=1, shape="(..., C)")
    validate.float_array("router_weight", router_weight, ndim=2, shape="(E, C)")
    experts, width = router_weight.shape
    for name, weights in (("gate_weights", gate_weights), ("up_weights", up_weights),
                          ("down_weights", down_weights)):
        validate.float_array(name, weights, ndim=3, shape="(E, F, C) or (E, C, F)")
    hidden = gate_weights.shape[1]
    expected = {"gate_weights": (experts, hidden, width), "up_weights": (experts, hidden, width),
                "down_weights": (experts, width, hidden)}
    given = {"gate_weights": gate_weights.shape, "up_weights": up_weights.shape,
             "down_weights": down_weights.shape}
    if given != expected:
        raise ValueError(f"router_weight (E, C) = {router_weight.shape} asks for gate_weights "
                         "(E, F, C), up_weights (E, F, C) and down_weights (E, C, F) with the "
                         f"same E and C; got {given}")
    validate.last_dim("x", x, width, "the router's C")
    validate.same_dtype(x=x, router_weight=router_weight, gate_weights=gate_weights,
                        up_weights=up_weights, down_weights=down_weights)
    return check_top_k(top_k, experts)


def check_top_k(top_k, num_experts: int) -> int:
    """1 <= top_k <= num_experts, the number of experts each token is sent to."""
    top_k = validate.positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(f"top_k must be at most the number of experts ({num_experts}): each "
                         f"token chooses top_k different experts; got {top_k}")
    return top_k


def moe_forward(x: np.ndarray, router_weight: np.ndarray, gate_weights: np.ndarray,
                up_weights: np.ndarray, down_weights: np.ndarray, top_k: int):
    """y = sum_j w_j SwiGLU_{S_j}(x) per token (the module text's formulas). x (..., C),
    router_weight (E, C), gate_weights (E, F, C), up_weights (E, F, C), down_weights
    (E, C, F) -> y (..., C). The experts' outputs are added in the order of their index, as
    HF's loop adds them."""
    top_k = _check_moe(x, router_weight, gate_weights, up_weights, down_weights, top_k)
    tokens = x.reshape(-1, x.shape[-1])                                 # (N, C)
    logits, router_cache = linear_forward(tokens, router_weight)        # (N, E) z
    probs, probs_cache = softmax_forward(logits)                        # (N, E) p
    selected = top_k_experts(probs, top_k)                              # (N, k) S
    top_probs = np.take_along_axis(probs, selected, axis=-1)            # (N, k) q
    weights = top_probs / top_probs.sum(axis=-1, keepdims=True)         # (N, k) w
    out = np.zeros_like(tokens)                                         # (N, C)
    calls = []
    for expert in range(router_weight.shape[0]):
        rows, slots = np.nonzero(selected == expert)                    # (n,), (n,)
        if rows.size == 0:
            calls.append(None)
            continue
        expert_out, swiglu_cache = swiglu_forward(
            tokens[rows], gate_weights[expert], up_weights[expert],
            down_weights[expert])                                       # (n, C)
        out[rows] += weights[rows, slots, None] * expert_out    # rows are distinct: no lost add
        calls.append(ExpertCall(rows, slots, swiglu_cache, expert_out))
    return out.reshape(x.shape), MoECache(x.shape, router_cache, probs_cache, selected,
                                          top_probs, weights, tuple(calls), logits,
                                          gate_weights.shape[1])


def moe_backward(dout: np.ndarray, cache: MoECache, drouter_logits: np.ndarray | None = None):
    """With g_t = dL/dy_t, the forward in reverse.

    1. The experts. y_t = sum_j w_tj o_tj, o_tj = SwiGLU_{S_tj}(x_t), is linear in each:
           dL/do_tj = w_tj g_t     -> swiglu_backward gives expert e's weight gradients
                                      (summed over the tokens routed to it) and a part of dx_t
           dL/dw_tj = <g_t, o_tj>  (the cached expert output)
    2. The selection S_t is piecewise constant in z_t: a small change of z_t that leaves the
       order of p_t's k-th and (k+1)-th largest entries alone leaves S_t alone, so dS/dz = 0
       wherever the top-k margin p_t[S_tk] - (the next largest) is not zero. At a tie S_t jumps
       (an expert swaps in, y_t jumps) and y has no derivative; the gradient below is the
       derivative everywhere else, and finite-difference checks must keep every step smaller
       than the top-k margin (tests/test_moe.py draws the logits so).
    3. The renormalisation w_tj = q_tj / s_t, q_tj = p_t[S_tj], s_t = sum_i q_ti:
           dw_tj/dq_ti = ([i = j] - w_tj) / s_t,   so   dq_ti = (dw_ti - sum_j dw_tj w_tj) / s_t
    4. The softmax over every expert: dp_te = dq_tj where e = S_tj, 0 for an expert not chosen;
           dz_t = p_t (dp_t - <dp_t, p_t>)      (softmax_backward)
       In closed form this is dz_te = w_tj (dw_tj - <dw_t, w_t>) at e = S_tj and 0 elsewhere:
       the derivative of the softmax of the selected logits (<dp_t, p_t> = s_t <dq_t, w_t> = 0).
       The code goes through p, as the forward does. A gradient arriving at the router logits
       from elsewhere (`drouter_logits`, the auxiliary loss's) is added to dz here.
    5. z_t = W_router x_t:  dW_router = sum_t dz_t x_t^T,  and x_t gets dz_t W_router besides
       the experts' parts of step 1.

    Cached: x and W_router (the router's Linear cache), p, S, q, w, and per expert the routed
    rows, their slots, SwiGLU's cache and its output o. Returns (dx, drouter_weight,
    dgate_weights, dup_weights, ddown_weights) in the forward's shapes.
    """
    validate.backward_inputs(dout, cache, MoECache)
    if drouter_logits is not None:
        validate.gradient("drouter_logits", drouter_logits, cache.router_logits.shape,
                          cache.router_logits.dtype, "the router")
    width = cache.shape[-1]
    g = dout.reshape(-1, width)                                         # (N, C)
    experts, hidden = len(cache.experts), cache.hidden
    dtokens = np.zeros_like(g)                                          # (N, C)
    dweights = np.zeros_like(cache.weights)                             # (N, k) dL/dw
    dgate = np.zeros((experts, hidden, width), dtype=g.dtype)           # (E, F, C)
    dup = np.zeros((experts, hidden, width), dtype=g.dtype)             # (E, F, C)
    ddown = np.zeros((experts, width, hidden), dtype=g.dtype)           # (E, C, F)
    for expert, call in enumerate(cache.experts):
        if call is None:
            continue
        g_rows = g[call.tokens]                                         # (n, C)
        dweights[call.tokens, call.slots] = (g_rows * call.out).sum(axis=-1)
        dexpert_out = cache.weights[call.tokens, call.slots, None] * g_rows   # (n, C)
        dx_rows, dgate[expert], dup[expert], ddown[expert], *_ = swiglu_backward(
            dexpert_out, call.swiglu)                                   # (n, C), expert e's
        dtokens[call.tokens] += dx_rows                 # tokens are distinct within an expert
    sums = cache.top_probs.sum(axis=-1, keepdims=True)                  # (N, 1) s
    dtop = (dweights - (dweights * cache.weights).sum(axis=-1, keepdims=True)) / sums  # dq
    dprobs = np.zeros_like(cache.probs.probs)                           # (N, E) dp
    np.put_along_axis(dprobs, cache.selected, dtop, axis=-1)
    dlogits = softmax_backward(dprobs, cache.probs)                     # (N, E) dz
    if drouter_logits is not None:
        dlogits = dlogits + drouter_logits.reshape(dlogits.shape)
    drouter_x, drouter_weight, _ = linear_backward(dlogits, cache.router)   # (N, C), (E, C)
    return (dtokens + drouter_x).reshape(cache.shape), drouter_weight, dgate, dup, ddown


class MoEExperts(Module):
    """The E SwiGLU experts as transformers 5 stores them (MixtralExperts): gate_up_proj
    (E, 2F, C) = [W_gate[e]; W_up[e]] per expert, down_proj (E, C, F). Only a holder of the
    two Parameters: SparseMoE runs them. Initialised as E torch.nn.Linear would be."""

    def __init__(self, num_experts: int, width: int, hidden: int, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        rng = np.random.default_rng(rng)
        shapes = {"gate_up_proj": (num_experts, 2 * hidden, width),
                  "down_proj": (num_experts, width, hidden)}
        for name, shape in shapes.items():
            bound = 1.0 / np.sqrt(shape[-1])
            setattr(self, name, Parameter(rng.uniform(-bound, bound, shape).astype(dtype)))

    @property
    def hidden(self) -> int:
        return self.down_proj.shape[-1]


class SparseMoE(Module):
    """Mixtral's sparse mixture-of-experts feed-forward (HF MixtralSparseMoeBlock): the router
    `gate` (Linear(C, E), no bias) and `experts` (MoEExperts). forward(x) -> (y, MoECache);
    backward(dy, cache, drouter_logits=None) -> dx, where drouter_logits (N, E) is a gradient
    of the router logits from elsewhere (the auxiliary loss)."""

    def __init__(self, width: int, hidden: int, num_experts: int, top_k: int, *,
                 rng: np.random.Generator | int = 0, dtype=np.float64):
        super().__init__(dtype)
        width = validate.positive_int("width", width)
        hidden = validate.positive_int("hidden", hidden)
        num_experts = validate.positive_int("num_experts", num_experts)
        self.top_k = check_top_k(top_k, num_experts)
        rng = np.random.default_rng(rng)
        self.gate = Linear(width, num_experts, bias=False, rng=rng, dtype=dtype)
        self.experts = MoEExperts(num_experts, width, hidden, rng=rng, dtype=dtype)

    def _expert_weights(self):
        """W_gate (E, F, C), W_up (E, F, C), W_down (E, C, F): views of gate_up_proj and
        down_proj."""
        hidden = self.experts.hidden
        gate_up = self.experts.gate_up_proj.data
        return gate_up[:, :hidden], gate_up[:, hidden:], self.experts.down_proj.data

    def forward(self, x):
        return moe_forward(x, self.gate.weight.data, *self._expert_weights(), self.top_k)

    def backward(self, dout, cache, drouter_logits=None):
        if isinstance(cache, MoECache):
            validate.cache_fits("router weight", cache.router.weight, self.gate.weight.data)
            validate.cache_fits("expert width F", cache.hidden, self.experts.hidden)
        dx, drouter, dgate, dup, ddown = moe_backward(dout, cache, drouter_logits)
        hidden = self.experts.hidden
        self.gate.weight.grad += drouter
        self.experts.gate_up_proj.grad[:, :hidden] += dgate
        self.experts.gate_up_proj.grad[:, hidden:] += dup
        self.experts.down_proj.grad += ddown
        return dx


# -- the load-balancing auxiliary loss ------------------------------------------------------
class LoadBalancingCache(NamedTuple):
    probs: tuple                # per layer, the SoftmaxCache of p_l (N, E)
    keep: np.ndarray            # (N,) m_t: 1 for a real token, 0 for padding
    fractions: np.ndarray       # (E,) f_e, the share of (token, choice) pairs sent to e
    rows: float                 # R = L sum_t m_t, the rows both averages divide by

    @property
    def output_spec(self):      # the (shape, dtype) dloss must have: the 0-d loss's
        return (), self.keep.dtype


def _check_router_logits(router_logits, padding_mask):
    """(the list of (N, E) logits, m (N,): 1 for a real row, 0 for padding), after checking."""
    if isinstance(router_logits, np.ndarray) and router_logits.ndim == 3:
        router_logits = list(router_logits)                             # (L, N, E) -> L (N, E)
    if not isinstance(router_logits, (list, tuple)) or not router_logits:
        raise ValueError("router_logits must be a non-empty list of (N, E) arrays, one per "
                         f"layer, or an (L, N, E) array; got {type(router_logits).__name__}")
    for index, logits in enumerate(router_logits):
        validate.float_array(f"router_logits[{index}]", logits, ndim=2, shape="(N, E)")
        if logits.shape != router_logits[0].shape or logits.dtype != router_logits[0].dtype:
            raise ValueError(f"router_logits[{index}] must have the shape and dtype of "
                             f"router_logits[0] {router_logits[0].shape} "
                             f"{router_logits[0].dtype}; got {logits.shape} {logits.dtype}")
    rows, dtype = router_logits[0].shape[0], router_logits[0].dtype
    if padding_mask is None:
        return router_logits, np.ones(rows, dtype=dtype)
    if not isinstance(padding_mask, np.ndarray) or padding_mask.dtype != bool \
            or padding_mask.shape != (rows,):
        raise ValueError(f"padding_mask must be a bool array of shape (N,) = ({rows},), True "
                         "at padding; got "
                         f"{getattr(padding_mask, 'dtype', type(padding_mask).__name__)} "
                         f"{np.shape(padding_mask)}")
    return router_logits, (~padding_mask).astype(dtype)


def load_balancing_loss_forward(router_logits: Sequence[np.ndarray], top_k: int,
                                padding_mask: np.ndarray | None = None):
    """The Switch Transformer's load-balancing loss over every layer's router logits, as HF's
    load_balancing_loss_func (its aux_loss): router_logits is one (N, E) array per layer (the
    MoE caches' router_logits, HF's outputs.router_logits) or their stack (L, N, E),
    padding_mask (N,) bool is True at
    padding (HF's attention_mask.reshape(-1) == 0; None: every row counts). Returns a 0-d
    array. If every row is padding the loss is 0 with a zero gradient (HF divides by zero).

        m_t = 1 for a real token, 0 for padding;   R = L sum_t m_t
        p_lt = softmax(z_lt),  c_lte = 1 if e is among the top_k of p_lt, else 0
        f_e = sum_{l,t} m_t c_lte / R          (sums to top_k)
        P_e = sum_{l,t} m_t p_lte / R          (sums to 1)
        aux = E sum_e f_e P_e

    Both averages run over every layer at once (HF concatenates the layers' rows): this is
    not the mean of per-layer losses."""
    router_logits, keep = _check_router_logits(router_logits, padding_mask)   # keep: (N,) m
    experts, dtype = router_logits[0].shape[1], router_logits[0].dtype
    top_k = check_top_k(top_k, experts)
    counts = np.zeros(experts, dtype=dtype)                             # (E,) R f
    prob_sums = np.zeros(experts, dtype=dtype)                          # (E,) R P
    rows = dtype.type(0)
    caches = []
    for logits in router_logits:
        probs, probs_cache = softmax_forward(logits)                    # (N, E) p_l
        selected = top_k_experts(probs, top_k)                          # (N, k)
        np.add.at(counts, selected.reshape(-1), np.repeat(keep, top_k))
        prob_sums += (probs * keep[:, None]).sum(axis=0)
        rows += keep.sum()
        caches.append(probs_cache)
    if rows == 0:
        return np.zeros((), dtype=dtype), LoadBalancingCache(tuple(caches), keep,
                                                             np.zeros_like(counts), 0.0)
    fractions = counts / rows                                           # (E,) f
    mean_probs = prob_sums / rows                                       # (E,) P
    loss = np.sum(fractions * mean_probs) * experts
    return np.asarray(loss, dtype=dtype), LoadBalancingCache(tuple(caches), keep, fractions,
                                                             float(rows))


def load_balancing_loss_backward(dloss, cache: LoadBalancingCache) -> np.ndarray:
    """aux = E sum_e f_e P_e (the forward's symbols).

    The fractions f_e count top-k choices: they are piecewise constant in the logits (they
    change only when a choice changes, at a tie), so df/dz = 0 wherever aux has a derivative,
    and the gradient flows through the mean probabilities alone:

        daux/dP_e = E f_e,    dP_e/dp_lte = m_t / R    =>    dp_lte = dloss E f_e m_t / R

    (a padded row gets none), then through each layer's softmax:

        dz_lt = p_lt (dp_lt - <dp_lt, p_lt>)       (softmax_backward)

    Cached: every p_l, m, f and R. Returns dz (L, N, E), one (N, E) gradient per layer in the
    forward's order (layer l's is SparseMoE.backward's drouter_logits)."""
    validate.backward_inputs(dloss, cache, LoadBalancingCache, "dloss")
    if cache.rows == 0:
        return np.zeros((len(cache.probs), *cache.probs[0].probs.shape),
                        dtype=cache.probs[0].probs.dtype)
    experts = cache.fractions.shape[0]
    scale = float(dloss) * experts / cache.rows
    dprobs = (scale * cache.fractions)[None, :] * cache.keep[:, None]   # (N, E), every layer
    return np.stack([softmax_backward(dprobs, probs) for probs in cache.probs])  # (L, N, E)
