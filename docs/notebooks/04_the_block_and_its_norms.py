# %% [markdown]
# # 4. The block and its norms
#
# A Transformer is a stack of identical **blocks**. A Pre-LN decoder block (GPT-2, and the
# 7,232-parameter GPT of `GPTConfig.tiny()`) reads
#
#     u = x + Attention(LayerNorm₁(x))
#     y = u + FeedForward(LayerNorm₂(u))
#
# Each sublayer writes into a **residual stream** that runs through the whole stack; the
# norms keep what each sublayer reads at a fixed scale.

# %%
# %matplotlib inline
import numpy as np
from matplotlib.figure import Figure

import numpy_tf as nt
from numpy_tf.core import record_activations
from numpy_tf.study import plot_activations

rng = np.random.default_rng(0)

# %% [markdown]
# ## LayerNorm and RMSNorm
# LayerNorm subtracts each row's mean and divides by its standard deviation (the biased one,
# √(var + ε)), then scales and shifts by learned γ and β. RMSNorm (Llama) skips the mean and
# divides by the root mean square. Below, rows of very different scale and offset all come
# out of LayerNorm at mean 0 and standard deviation 1 (one point), and out of RMSNorm with
# RMS 1, that is on the circle mean² + std² = 1.

# %%
C = 16
scale, shift = rng.uniform(0.2, 5.0, (200, 1)), rng.uniform(-3.0, 3.0, (200, 1))
x = rng.standard_normal((200, C)) * scale + shift                # (rows, C)
ln, _ = nt.layernorm_forward(x, np.ones(C), np.zeros(C))
rms, _ = nt.rmsnorm_forward(x, np.ones(C), eps=1e-6)            # Llama's eps
by_hand = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
assert np.allclose(ln, by_hand)
assert np.allclose(rms, x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + 1e-6))

figure = Figure(figsize=(10, 3.4), layout="constrained")
panels = figure.subplots(1, 3, sharex=True, sharey=True)
for axes, (name, rows) in zip(panels, [("input rows", x), ("LayerNorm", ln), ("RMSNorm", rms)]):
    axes.scatter(rows.mean(-1), rows.std(-1), s=8, alpha=0.6)
    axes.set_title(name)
    axes.set_xlabel("row mean")
    axes.grid(alpha=0.3)
panels[0].set_ylabel("row standard deviation")
figure

# %% [markdown]
# ## One block, line by line
# We run the first block of the tiny GPT, then recompute its output from its sublayers with
# the two equations above: they agree to the last bit.

# %%
model = nt.GPT(nt.GPTConfig.tiny(), rng=0)
block = model.blocks[0]
x = rng.standard_normal((2, 8, 16))                              # (B, T, C)
y, _ = block.forward(x)
h1, _ = block.norm1.forward(x)
a, _ = block.attention.forward(h1, is_causal=True)
u = x + a
h2, _ = block.norm2.forward(u)
f, _ = block.feedforward.forward(h2)
assert np.array_equal(y, u + f)
print("block parameters:", block.num_parameters(), " model:", model.num_parameters())

# %% [markdown]
# ## The feed-forward's activation
# The feed-forward is Linear → GELU → Linear, four times wider in the middle. GELU, x Φ(x),
# is a smooth ReLU; SiLU, x σ(x), is Llama's (inside SwiGLU). Their derivatives, drawn from
# each layer's own backward, are what the backward multiplies the gradient by.

# %%
plot_activations()

# %% [markdown]
# ## The residual stream
# `record_activations` keeps every module's output during a forward pass. At initialisation
# the embeddings are small (standard deviation 0.02) and so is the stream; every norm hands
# its sublayer rows of size √C = 4 whatever the stream's scale, and each sublayer's output
# is added back into the stream.

# %%
ids = rng.integers(0, 20, (2, 8))
with record_activations(model) as recorder:
    model.forward(ids)
names = [name for name in recorder.activations if name.count(".") <= 2]
sizes = [np.linalg.norm(recorder.activations[name], axis=-1).mean() for name in names]
figure = Figure(figsize=(9, 3.4), layout="constrained")
axes = figure.add_subplot()
axes.bar(range(len(names)), sizes, color=["tab:orange" if "norm" in name else "tab:blue"
                                          for name in names])
axes.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
axes.set_yscale("log")
axes.set_ylabel("mean ‖row‖")
axes.set_title("each module's output in forward order (norms in orange; blocks.i is the "
               "stream after block i)")
figure

# %% [markdown]
# ## The block's backward
# Read in reverse: y = u + f sends dy to both u and the feed-forward; u = x + a sends du to
# both x and the attention. Each residual connection adds a gradient path. The whole block
# is checked by finite differences, every parameter and the input.

# %%
report = nt.gradcheck_module(block, x, forward_kwargs={})
print(report)
assert report.passed
