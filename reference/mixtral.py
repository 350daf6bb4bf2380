"""Fixtures for the Mixtral family: Hugging Face MixtralForCausalLM built offline from small
MixtralConfigs with random weights (never downloaded), and its sparse mixture-of-experts block
(MixtralSparseMoeBlock) alone.

Model cases: top-2 of 4 experts with grouped-query heads and the auxiliary loss; top-1 of 4
with one key/value head and a tied head; top-2 with right padding (a pad_token_id, the
auxiliary loss over the real tokens only); top-3 of 4 without output_router_logits (the loss is
the cross-entropy alone, HF's default) and with a sliding_window of 9, the length of its ids
(HF's window lets query i see key j when i - j < 9: every earlier key). Each case holds the logits, HF's loss and every
parameter gradient of it (the router's included). The loss is HF's
`loss` of MixtralForCausalLM with labels and output_router_logits:

    mean next-token cross-entropy (padded targets ignored) + router_aux_loss_coef * aux_loss

with aux_loss HF's load_balancing_loss_func of every layer's router logits and the
attention_mask, as HF returns it in out.aux_loss. The cross-entropy is computed here (as
reference/llama.py does) because HF's loss_function casts the logits to float32 first.

Layer cases (kind sparse_moe): MixtralSparseMoeBlock forward and backward, top-2 and top-1 of
4 experts, a random upstream gradient.

float32 cases run HF exactly as it ships (experts_implementation and attn_implementation
"eager": the readable loops). In a float64 model HF still computes in float32: RMSNorm, the
RoPE tables and the eager attention softmax (as in Llama; reference/llama.py's replacements are
reused), the router's softmax (MixtralTopKRouter casts the logits to float32, so the routing
weights are float32) and the auxiliary loss (load_balancing_loss_func sums in float32). The
float64 cases run under `float64_faithful()`, which computes those five in the working dtype
(listed in each case's meta); for float32 the replacements perform exactly HF's operations:
build() checks that the float32 logits and loss are bit-identical with and without them.

Routing is a piecewise-constant function of the router logits: every case records the
smallest top-k margin (the k-th largest router probability minus the next one, over every
token and layer) and build() refuses a seed whose margin is below MIN_MARGIN, so a float32
rounding difference or a finite-difference step cannot change which experts a token uses.
"""
from __future__ import annotations

import contextlib

import torch

from common import DTYPES, generator, meta, normal, run_module_case, save_case, to_numpy
from gpt import hf_config_dict, lm_case, next_token_loss, spread_weights
from llama import (_eager_attention_in_working_dtype, _rms_norm_in_working_dtype,
                   _rotary_in_working_dtype)

FILE = "mixtral.py"
MIN_MARGIN = 1e-3

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64: MixtralRMSNorm.forward (HF casts to float32), "
    "MixtralRotaryEmbedding.forward (HF builds inv_freq and the angles in float32), the eager "
    "attention softmax (HF uses dtype=float32), MixtralTopKRouter.forward (HF takes the router "
    "softmax of router_logits.float(), so the routing weights are float32) and "
    "load_balancing_loss_func (HF sums the token fractions and router probabilities in "
    "float32) compute in the model's dtype; float32 cases run HF unpatched (the patch is "
    "bit-identical there, checked when generating)")

# name, seed, MixtralConfig changes, right padding
CASES = [
    ("mixtral_top2", 110, {"num_key_value_heads": 2, "output_router_logits": True}, False),
    ("mixtral_top1_mqa_tied", 111, {"num_key_value_heads": 1, "num_experts_per_tok": 1,
                                    "tie_word_embeddings": True, "head_dim": 6,
                                    "router_aux_loss_coef": 0.02,
                                    "output_router_logits": True}, False),
    ("mixtral_top2_padded", 112, {"num_key_value_heads": 2, "pad_token_id": 0,
                                  "router_aux_loss_coef": 0.05,
                                  "output_router_logits": True}, True),
    ("mixtral_top3_no_aux", 113, {"num_key_value_heads": 4, "num_experts_per_tok": 3,
                                  "sliding_window": 9}, False),
]
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, num_local_experts=4, max_position_embeddings=16,
             bos_token_id=1, eos_token_id=2, attn_implementation="eager",
             experts_implementation="eager")

# name, seed, top_k (layer cases of MixtralSparseMoeBlock: C 6, F 5, E 4, x (2, 5, 6))
LAYER_CASES = [("sparse_moe_top2", 120, 2), ("sparse_moe_top1", 121, 1)]


def _router_in_working_dtype(self, hidden_states):
    """HF's MixtralTopKRouter with the softmax taken in the logits' dtype."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)
    router_probs = torch.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)
    top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def _load_balancing_in_working_dtype(gate_logits, num_experts=None, top_k=2,
                                     attention_mask=None):
    """HF's load_balancing_loss_func with every sum in the logits' dtype."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    dtype = gate_logits[0].dtype
    counts = torch.zeros(num_experts, dtype=dtype)
    prob_sums = torch.zeros(num_experts, dtype=dtype)
    rows = 0.0
    keep = None if attention_mask is None else attention_mask.reshape(-1).to(dtype)
    for logits in gate_logits:
        probs = torch.softmax(logits, dim=-1)
        _, selected = torch.topk(probs, top_k, dim=-1)
        weights = torch.ones(selected.numel(), dtype=dtype) if keep is None \
            else keep.repeat_interleave(top_k)
        counts = counts + torch.zeros(num_experts, dtype=dtype).scatter_add_(
            0, selected.reshape(-1), weights)
        prob_sums = prob_sums + (probs if keep is None else probs * keep.unsqueeze(-1)).sum(0)
        rows = rows + (probs.shape[0] if keep is None else keep.sum())
    return torch.sum((counts / rows) * (prob_sums / rows).unsqueeze(0)) * num_experts


@contextlib.contextmanager
def float64_faithful():
    """Swap in the five working-dtype computations for the duration of the block."""
    from transformers.models.mixtral import modeling_mixtral as mixtral

    saved = (mixtral.MixtralRMSNorm.forward, mixtral.MixtralRotaryEmbedding.forward,
             mixtral.eager_attention_forward, mixtral.MixtralTopKRouter.forward,
             mixtral.load_balancing_loss_func)
    mixtral.MixtralRMSNorm.forward = _rms_norm_in_working_dtype
    mixtral.MixtralRotaryEmbedding.forward = _rotary_in_working_dtype
    mixtral.eager_attention_forward = _eager_attention_in_working_dtype
    mixtral.MixtralTopKRouter.forward = _router_in_working_dtype
    mixtral.load_balancing_loss_func = _load_balancing_in_working_dtype
    try:
        yield
    finally:
        (mixtral.MixtralRMSNorm.forward, mixtral.MixtralRotaryEmbedding.forward,
         mixtral.eager_attention_forward, mixtral.MixtralTopKRouter.forward,
         mixtral.load_balancing_loss_func) = saved


def hf_mixtral_loss(model, ids, attention_mask):
    """The logits and HF's loss with output_router_logits as the config says: the next-token
    cross-entropy, plus router_aux_loss_coef times HF's aux_loss."""
    out = model(input_ids=ids, attention_mask=attention_mask, output_router_logits=True)
    loss = next_token_loss(out.logits, ids, attention_mask)
    if model.config.output_router_logits:
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return out.logits, loss


def top_k_margin(router_logits, top_k: int) -> float:
    """The smallest gap between the k-th and the (k+1)-th router probability of any row."""
    margins = []
    for logits in router_logits:
        probs = torch.softmax(logits.detach().double(), dim=-1).sort(dim=-1, descending=True)[0]
        if top_k < probs.shape[-1]:
            margins.append((probs[:, top_k - 1] - probs[:, top_k]).min().item())
    return min(margins, default=float("inf"))


def _labels_loss(model, ids, mask):
    """HF's own `loss` (labels = ids, -100 at padding; its float32 cross-entropy)."""
    labels = ids.clone()
    if mask is not None:
        labels[mask == 0] = -100
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def _check_float32(model, ids, mask):
    """The replacements only remove casts: on a float32 model they change no bit; and the loss
    written equals HF's own labels= loss."""
    with torch.no_grad():
        plain_logits, plain = hf_mixtral_loss(model, ids, mask)
        with float64_faithful():
            patched_logits, patched = hf_mixtral_loss(model, ids, mask)
        own = _labels_loss(model, ids, mask)
    if not (torch.equal(plain_logits, patched_logits) and torch.equal(plain, patched)):
        raise AssertionError("float64_faithful() changed HF's float32 logits or loss")
    if not torch.allclose(plain, own, rtol=1e-6, atol=0.0):
        raise AssertionError(f"the loss written ({plain.item()}) is not HF's labels= loss "
                             f"({own.item()})")


def _layer_cases(out_dir):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    paths = []
    for dtype in DTYPES:
        for name, seed, top_k in LAYER_CASES:
            g = generator(seed)
            config = MixtralConfig(hidden_size=6, intermediate_size=5, num_local_experts=4,
                                   num_experts_per_tok=top_k, experts_implementation="eager")
            block = MixtralSparseMoeBlock(config).to(DTYPES[dtype]).eval()
            with torch.no_grad():
                for parameter in block.parameters():
                    parameter.copy_(normal(g, parameter.shape, dtype, 0.5))
            x = normal(g, (2, 5, 6), dtype)
            margin = top_k_margin([block.gate(x)[0]], top_k)
            if margin < MIN_MARGIN:
                raise AssertionError(f"{name}: seed {seed} routes a token with top-k margin "
                                     f"{margin:.3g}; choose another seed")
            patch = float64_faithful() if dtype == "float64" else contextlib.nullcontext()
            with patch:
                arrays = run_module_case(block, {"x": x}, g, dtype)
            layer_config = {"hidden_size": 6, "intermediate_size": 5, "num_local_experts": 4,
                            "num_experts_per_tok": top_k}
            conventions = {"routing": "softmax over all experts, top-k, renormalised over the "
                                      "selected (HF MixtralTopKRouter)"}
            if dtype == "float64":
                conventions["float64"] = FLOAT64_CONVENTION
            paths.append(save_case(out_dir / f"{name}_{dtype}.npz",
                                   meta(FILE, "sparse_moe", seed, dtype, layer_config, ["x"],
                                        top_k_margin=margin, conventions=conventions),
                                   arrays))
    return paths


def build(out_dir):
    from transformers import MixtralConfig, MixtralForCausalLM

    paths = _layer_cases(out_dir)
    for dtype in DTYPES:
        for name, seed, changes, padded in CASES:
            g = generator(seed)
            hf_config = MixtralConfig(**SMALL, **changes)
            model = MixtralForCausalLM(hf_config).to(DTYPES[dtype]).eval()
            spread_weights(model, g, dtype)
            ids = torch.randint(0, hf_config.vocab_size, (2, 9), generator=g)
            mask = None
            if padded:
                mask = torch.ones(2, 9, dtype=torch.long)
                mask[1, 6:] = 0
                ids[1, 6:] = hf_config.pad_token_id
            with torch.no_grad():
                router_logits = model(input_ids=ids, attention_mask=mask,
                                      output_router_logits=True).router_logits
            margin = top_k_margin(router_logits, hf_config.num_experts_per_tok)
            if margin < MIN_MARGIN:
                raise AssertionError(f"{name}: seed {seed} routes a token with top-k margin "
                                     f"{margin:.3g}; choose another seed")
            path = out_dir / f"{name}_{dtype}.npz"
            conventions = {"loss": "HF's loss with output_router_logits: mean cross-entropy of "
                                   "ids[t+1] given ids[:t+1], padded targets ignored, plus "
                                   "router_aux_loss_coef * load_balancing_loss_func(router "
                                   "logits, attention_mask) when the config's "
                                   "output_router_logits is true",
                           "top_k_margin": margin}
            if dtype == "float32":
                _check_float32(model, ids, mask)
                paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                     "hf_mixtral", seed, dtype, hf_mixtral_loss, FILE,
                                     conventions))
            else:
                with float64_faithful():
                    paths.append(lm_case(path, model, ids, mask, hf_config_dict(hf_config),
                                         "hf_mixtral", seed, dtype, hf_mixtral_loss, FILE,
                                         {"float64": FLOAT64_CONVENTION, **conventions}))
    return paths
