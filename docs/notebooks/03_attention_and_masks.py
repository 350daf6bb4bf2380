# %% [markdown]
# # 3. Attention and its masks
#
# Attention lets every position gather information from the others. Each query q_i is
# compared with every key k_j, the scores become probabilities with a softmax, and the output
# is the probability-weighted average of the values:
#
#     S = q kᵀ / √d,   P = softmax(S) over the keys,   out = P v
#
# Masks decide which keys a query may see: a blocked score is set to −∞ before the softmax, so
# its probability is exactly 0. In numpy_tf a boolean mask is **True where attention is
# blocked** (the convention of torch.nn.MultiheadAttention).

# %%
# %matplotlib inline
import numpy as np

import numpy_tf as nt
from numpy_tf.study import plot_attention

rng = np.random.default_rng(0)
tokens = ["The", " cat", " sat", " on", " the", " mat"]
B, H, T, d = 1, 2, len(tokens), 4
q, k, v = rng.standard_normal((3, B, H, T, d))                   # (B, H, T, d) each

# %% [markdown]
# ## No mask: every query sees every key
# Each row of P is a probability distribution over the keys: non-negative, summing to 1.

# %%
out, cache = nt.attention_forward(q, k, v)
P = cache.probs                                                  # (B, H, Tq, Tk)
assert np.allclose(P.sum(axis=-1), 1.0)
scores = q @ k.swapaxes(-1, -2) / np.sqrt(d)
by_hand = np.exp(scores - scores.max(-1, keepdims=True))
assert np.allclose(P, by_hand / by_hand.sum(-1, keepdims=True)) and np.allclose(out, P @ v)
plot_attention([P], tokens)

# %% [markdown]
# ## The causal mask: no looking ahead
# A language model predicts token t + 1 from tokens 0 .. t, so query i must not see keys
# j > i. The causal mask blocks the upper triangle; the first token can only attend to itself.

# %%
out, cache = nt.attention_forward(q, k, v, is_causal=True)
assert np.all(np.triu(cache.probs[0, 0], 1) == 0.0)
assert np.allclose(cache.probs[0, :, 0, 0], 1.0)
print(nt.causal_mask(4, 4).astype(int))                          # 1 = blocked
plot_attention([cache.probs], tokens)

# %% [markdown]
# ## Key padding: sequences of different lengths in one batch
# Short sequences are padded to a common length. `key_padding_mask` (B, Tk) is True at the
# padding, and no query attends to it. Here the second sequence has two padded positions.

# %%
q2, k2, v2 = rng.standard_normal((3, 2, H, T, d))
padding = np.zeros((2, T), dtype=bool)
padding[1, 4:] = True
out, cache = nt.attention_forward(q2, k2, v2, key_padding_mask=padding, is_causal=True)
assert np.all(cache.probs[1, :, :, 4:] == 0.0)
plot_attention([cache.probs], tokens[:4] + ["<pad>", "<pad>"], batch=1)

# %% [markdown]
# ## A row with nothing to see
# If every key of a query is blocked, the softmax of a row of −∞ would be 0/0. numpy_tf (like
# torch's fused attention) returns a zero output for that row, and zero gradients, never NaN.

# %%
blocked = np.zeros((T, T), dtype=bool)
blocked[2] = True                                                # query 2 sees nothing
out, cache = nt.attention_forward(q, k, v, attn_mask=blocked)
assert np.all(out[:, :, 2] == 0.0) and np.isfinite(out).all()
dq, dk, dv = nt.attention_backward(rng.standard_normal(out.shape), cache)
assert np.all(dq[:, :, 2] == 0.0) and np.isfinite(dk).all()

# %% [markdown]
# ## A float mask is added to the scores
# Instead of blocking, a float mask shifts scores. A bias that falls with the distance
# |i − j| (as ALiBi does) makes every query prefer its neighbours.

# %%
distance = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :]).astype(float)
out, cache = nt.attention_forward(q, k, v, attn_mask=-1.5 * distance)
plot_attention([cache.probs], tokens)

# %% [markdown]
# ## Many heads, and fewer key/value heads
# A multi-head layer projects x to H queries and G key/value heads; with G < H
# (grouped-query attention) each key/value head serves H / G query heads, which shrinks the
# KV cache. Its backward is checked by finite differences like every other layer.

# %%
layer = nt.MultiHeadAttention(width=8, num_heads=4, num_kv_heads=2, rng=0)
x = rng.standard_normal((1, T, 8))
report = nt.gradcheck_module(layer, x, forward_kwargs={"is_causal": True})
print(report)
assert report.passed
