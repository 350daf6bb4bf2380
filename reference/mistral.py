"""Fixtures for Mistral: Hugging Face MistralForCausalLM built offline from small MistralConfigs
with random weights (never downloaded), a sliding window of 3 or 4 positions over 9 tokens so
that most queries lose keys to it: grouped-query heads, tied and untied heads, right padding
(shorter than the window, so every query row keeps a key: see below), and cached decoding.

Model cases (kind hf_mistral) hold the logits, the mean next-token cross-entropy and every
parameter gradient of that loss. Decoding cases (kind kv_decoding) hold the logits HF's
generation loop computes: a prompt of 3 tokens, then one token per call through HF's
DynamicCache (whose sliding layers keep only the last window - 1 keys) up to 9 tokens, past
the window; the same ids through the whole model in one call must give the same logits.

float32 cases run HF's model exactly as it ships. float64 cases patch HF's three float32
islands of modeling_mistral as llama.py does for Llama (MistralRMSNorm.forward,
MistralRotaryEmbedding.forward, eager_attention_forward compute in the model's dtype; the
patch is bit-identical on float32, checked when generating).

A query row whose keys are all blocked (right padding at least a window long) is where HF's
eager attention and numpy_tf part: HF adds finfo.min to every score of the row, and its softmax
is then uniform over all keys (padding and future keys included); numpy_tf gives the row 0
(SPEC §4). Such a row is a padded position, whose target the loss ignores, so the loss and
every gradient agree either way; the cases here keep the padding shorter than the window.
"""
from __future__ import annotations

import contextlib

import torch

from common import DTYPES, generator, save_case, to_numpy, meta
from gpt import hf_config_dict, hf_lm_loss, lm_case, spread_weights
from llama import (_eager_attention_in_working_dtype, _rms_norm_in_working_dtype,
                   _rotary_in_working_dtype)

FILE = "mistral.py"

FLOAT64_CONVENTION = (
    "HF's float32 islands patched to float64: MistralRMSNorm.forward (HF casts to float32), "
    "MistralRotaryEmbedding.forward (HF builds inv_freq and the angles in float32) and the "
    "eager attention softmax (HF uses dtype=float32) compute in the model's dtype; float32 "
    "cases run HF unpatched (the patch is bit-identical there, checked when generating)")

# name, seed, MistralConfig changes, right padding
CASES = [
    ("mistral_window", 130, {"num_key_value_heads": 2, "sliding_window": 3}, False),
    ("mistral_window_tied_padded", 131, {"num_key_value_heads": 1, "sliding_window": 4,
                                         "tie_word_embeddings": True, "pad_token_id": 0,
                                         "head_dim": 6}, True),
]
DECODING = [("mistral_decoding", 132, {"num_key_value_heads": 2, "sliding_window": 3})]
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=16, bos_token_id=1,
             eos_token_id=2, attn_implementation="eager")


@contextlib.contextmanager
def replaced(module, replacements: dict):
    """Set module attributes (a dotted "Class.method" or a function name) to the given
    values for the duration of the block, and put the originals back."""
    def owner_and_name(path):
        *owners, name = path.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part)
        return owner, name

    saved = {path: getattr(*owner_and_name(path)) for path in replacements}
    for path, value in replacements.items():
        setattr(*owner_and_name(path), value)
    try:
        yield
    finally:
        for path, value in saved.items():
            setattr(*owner_and_name(path), value)


def float64_faithful():
    """modeling_mistral's three float32 islands computed in the working dtype."""
    from transformers.models.mistral import modeling_mistral

    return replaced(modeling_mistral, {
        "MistralRMSNorm.forward": _rms_norm_in_working_dtype,
        "MistralRotaryEmbedding.forward": _rotary_in_working_dtype,
        "eager_attention_forward": _eager_attention_in_working_dtype})


def patched_when(dtype: str, context):
    """The float64 patch for float64 cases, nothing for float32."""
    return context() if dtype == "float64" else contextlib.nullcontext()


def check_patch_is_exact_in_float32(model, ids, mask, context):
    """The replacements only remove casts: on a float32 model they change no bit."""
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with context():
            patched = model(input_ids=ids, attention_mask=mask).logits
    if not torch.equal(plain, patched):
        raise AssertionError(f"{context.__name__}() changed HF's float32 logits by "
                             f"{(plain - patched).abs().max().item():.3g}")


def decoding_logits(model, ids, prompt: int):
    """HF's cached decoding: the prompt in one call, then one token per call through the
    DynamicCache the model returns; the logits of every position, (B, T, V)."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :prompt], use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for t in range(prompt, ids.shape[1]):
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            logits.append(out.logits)
            cache = out.past_key_values
    return torch.cat(logits, dim=1)


def decoding_case(path, model, ids, prompt, config, seed, dtype, generator_file, conventions):
    """A kv_decoding case: the parameters, ids, the prompt length, and HF's cached logits."""
    logits = decoding_logits(model, ids, prompt)
    arrays = {f"param/{name}": to_numpy(p) for name, p in model.state_dict().items()}
    arrays["input/ids"] = to_numpy(ids)
    arrays["output/logits"] = to_numpy(logits)
    extra = {"prompt_length": prompt, "conventions": {
        "decoding": f"the first {prompt} ids in one call, then one id per call through HF's "
                    "DynamicCache (sliding layers keep the last window - 1 keys); the logits "
                    "of every call, concatenated along T", **(conventions or {})}}
    return save_case(path, meta(generator_file, "kv_decoding", seed, dtype, config, ["ids"],
                                level="model", **extra), arrays)


def hf_cases(out_dir, config_class, model_class, small, cases, decoding, kind, faithful,
             convention, generator_file, prepare=None):
    """Every case of one HF family in both dtypes: model cases (name, seed, config changes,
    right padding) and decoding cases (name, seed, changes); `faithful()` patches HF's float32
    islands for the float64 cases, `prepare(model, dtype)` sets what else a case needs."""
    paths = []
    for dtype in DTYPES:
        conventions = {"float64": convention} if dtype == "float64" else None
        for name, seed, changes, *padded in cases + decoding:
            g = generator(seed)
            hf_config = config_class(**small, **changes)
            model = model_class(hf_config).to(DTYPES[dtype]).eval()
            spread_weights(model, g, dtype)
            if prepare is not None:
                prepare(model, dtype)
            ids = torch.randint(0, hf_config.vocab_size, (2, 9), generator=g)
            path = out_dir / f"{name}_{dtype}.npz"
            config = hf_config_dict(hf_config)
            if not padded:                                      # a decoding case
                with patched_when(dtype, faithful):
                    paths.append(decoding_case(path, model, ids, 3, config, seed, dtype,
                                               generator_file, conventions))
                continue
            mask = None
            if padded[0]:
                mask = torch.ones(2, 9, dtype=torch.long)
                mask[1, 6:] = 0
                ids[1, 6:] = hf_config.pad_token_id
            if dtype == "float32":
                check_patch_is_exact_in_float32(model, ids, mask, faithful)
            with patched_when(dtype, faithful):
                paths.append(lm_case(path, model, ids, mask, config, kind, seed, dtype,
                                     hf_lm_loss, generator_file, conventions))
    return paths


def build(out_dir):
    from transformers import MistralConfig, MistralForCausalLM

    return hf_cases(out_dir, MistralConfig, MistralForCausalLM, SMALL, CASES, DECODING,
                    "hf_mistral", float64_faithful, FLOAT64_CONVENTION, FILE)
