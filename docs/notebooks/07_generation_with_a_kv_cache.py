# %% [markdown]
# # 7. Generation with a KV cache
#
# A language model generates one token at a time: run the sequence, turn the last position's
# logits into probabilities, pick a token, append it, repeat. Run naively, every step
# recomputes every earlier position. But in a causal model nothing earlier depends on what
# comes later, so each layer's keys and values of the earlier positions never change: keep
# them (the **KV cache**) and each step only has to run its one new position.

# %%
# %matplotlib inline
import numpy as np
from matplotlib.figure import Figure

import numpy_tf as nt
from numpy_tf.study import attention_maps, plot_attention
from numpy_tf.training.tasks import language_model_trainer

tokenizer = nt.ByteTokenizer()
config = nt.GPTConfig(vocab_size=tokenizer.vocab_size, max_context=32, width=32, heads=4,
                      layers=2)
settings = nt.TrainSettings(steps=150, batch_size=16, lr=1e-2, min_lr=1e-3, warmup=15,
                            eval_every=0, log_every=1000)
trainer = language_model_trainer(nt.default_corpus(), config, settings, tokenizer=tokenizer,
                                 dtype=np.float64)
trainer.run(log=lambda line: None)
model = trainer.model
prompt = tokenizer.encode("Anna gave")[None, :]

# %% [markdown]
# ## What the cache holds
# One forward over the prompt returns, for every block, the keys and values of every
# position: arrays (B, H, T, head_dim). A step with one new token and `past_kv` returns
# them one position longer.

# %%
logits, cache = model.forward(prompt)
for block, (k, v) in enumerate(cache.present):
    print(f"block {block}: k {k.shape}, v {v.shape}")
next_id = np.array([[int(logits[0, -1].argmax())]])
step_logits, step_cache = model.forward(next_id, past_kv=cache.present)
print("after one step:", step_cache.present[0][0].shape)

# %% [markdown]
# ## The cached step equals recomputation
# The new position's logits from the cached step are those of a full forward over the longer
# sequence, to rounding (float64 here); so greedy generation gives the same tokens either way.

# %%
full_logits, _ = model.forward(np.concatenate([prompt, next_id], axis=1))
print("max |cached - recomputed| =", np.abs(step_logits[0, -1] - full_logits[0, -1]).max())
assert np.allclose(step_logits[0, -1], full_logits[0, -1], rtol=0, atol=1e-12)

with_cache = nt.generate(model, prompt, 20, rng=np.random.default_rng(0), temperature=0.8)
recomputed = nt.generate(model, prompt, 20, rng=np.random.default_rng(0), temperature=0.8,
                         use_cache=False)
assert np.array_equal(with_cache, recomputed)
print(repr(tokenizer.decode(with_cache[0])))
T0, n = prompt.shape[1], 20
print(f"positions run: {T0 + n - 1} with the cache, "
      f"{sum(range(T0, T0 + n))} recomputing every step")

# %% [markdown]
# ## One step's attention is one row of the full map
# The new token's query attends to every cached key. Its attention probabilities are exactly
# the last row of the map a full forward computes. Below, the full map of block 0, head 0,
# over the generated text, then the rows of the cached steps stacked: the same numbers.

# %%
tokens = with_cache
pieces = [tokenizer.decode([int(t)]) for t in tokens[0]]
_, full_cache = model.forward(tokens)
full = attention_maps(full_cache)
_, past = model.forward(tokens[:, :prompt.shape[1]])
rows = []
for t in range(prompt.shape[1], tokens.shape[1]):
    _, step = model.forward(tokens[:, t:t + 1], past_kv=past.present)
    past = past._replace(present=step.present)
    row = attention_maps(step)[0]                                # (B, H, 1, t + 1)
    assert np.allclose(row[0, :, 0], full[0][0, :, t, :t + 1], atol=1e-12)
    rows.append(np.pad(row[0, :, 0], ((0, 0), (0, tokens.shape[1] - t - 1))))
plot_attention(full, pieces, layers=[0], heads=[0])

# %%
steps = np.stack(rows, axis=1)                                   # (H, new tokens, T)
plot_attention(steps, pieces, heads=[0])           # the queries: the last 20 tokens

# %% [markdown]
# ## Choosing the next token
# Greedy decoding takes the most probable token. Sampling divides the logits by a
# temperature first (below 1 sharpens, above 1 flattens), and may keep only the top k tokens
# or the smallest set whose probability reaches p (top-p).

# %%
last = model.forward(prompt)[0][:, -1]                           # (1, V)
settings = {"temperature 0.5": dict(temperature=0.5), "temperature 1": dict(temperature=1.0),
            "temperature 1.5": dict(temperature=1.5), "top-k 5": dict(top_k=5),
            "top-p 0.9": dict(top_p=0.9)}
best = np.argsort(-last[0])[:12]
figure = Figure(figsize=(10, 3.4), layout="constrained")
axes = figure.add_subplot()
width = 0.8 / len(settings)
for i, (name, options) in enumerate(settings.items()):
    probs = nt.sampling_probabilities(last, **options)[0]
    axes.bar(np.arange(12) + i * width, probs[best], width, label=name)
axes.set_xticks(np.arange(12) + 0.4 - width / 2,
                [repr(tokenizer.decode([int(t)])) for t in best])
axes.set_ylabel("probability")
axes.set_title("the next token after 'Anna gave': the 12 most likely, under each setting")
axes.legend(fontsize=8)
figure
