# %% [markdown]
# # 2. Positions
#
# Attention compares every token with every other one, and nothing in that comparison depends
# on where the tokens stand: shuffle the sequence and each output is shuffled the same way.
# Order has to be put in. There are three common ways: add a **learned** vector per position,
# add a fixed **sinusoidal** one, or **rotate** the queries and keys by an angle that grows
# with the position (RoPE).

# %%
# %matplotlib inline
import numpy as np

import numpy_tf as nt
from numpy_tf.study import plot_rope, plot_sinusoidal

rng = np.random.default_rng(0)

# %% [markdown]
# ## Learned positions
# A (max_context, C) table P, trained like the embeddings: token t gets x[t] + P[offset + t].
# There is no row beyond max_context − 1, so a longer input is refused, not silently wrapped.

# %%
max_context, C = 8, 6
table = rng.standard_normal((max_context, C))
x = rng.standard_normal((2, 5, C))                               # (B, T, C)
out, cache = nt.learned_positions_forward(x, table, offset=2)    # positions 2 .. 6
assert np.allclose(out - x, table[2:7])
try:
    nt.learned_positions_forward(x, table, offset=4)             # would need position 8
except ValueError as error:
    print("refused:", str(error)[:90], "...")

# %% [markdown]
# Its backward: every batch row used position t once, so dP[t] is the sum of dout[:, t] over
# the batch; rows not used get zero.

# %%
dout = rng.standard_normal(out.shape)
dx, dtable = nt.learned_positions_backward(dout, cache)
assert np.allclose(dx, dout) and np.allclose(dtable[2:7], dout.sum(axis=0))
assert not dtable[:2].any() and not dtable[7:].any()

# %% [markdown]
# ## Sinusoidal positions
# PE(t, 2i) = sin(t ω_i) and PE(t, 2i + 1) = cos(t ω_i), with ω_i = 10000^(−2i/C): each pair
# of features is a clock turning at its own speed, the first ones fast, the last ones slowly.
# The table has no parameters and extends to any length.

# %%
plot_sinusoidal(64, 32)

# %% [markdown]
# Because each pair is a (sin, cos) of the same angle, PE(t + k) is a fixed rotation of PE(t)
# for every t. So the dot product PE(t) · PE(t + k) depends only on the offset k, never on t:
# the similarity matrix below is constant along each diagonal.

# %%
pe = nt.sinusoidal_table(64, 32)
similarity = pe @ pe.T                                           # (T, T)
for k in (1, 5, 20):
    diagonal = np.diagonal(similarity, k)
    assert np.allclose(diagonal, diagonal[0])
    print(f"offset {k:>2}: PE(t) . PE(t + {k}) = {diagonal[0]:.4f} for every t")

from matplotlib.figure import Figure

figure = Figure(figsize=(4.5, 4), layout="constrained")
axes = figure.add_subplot()
image = axes.imshow(similarity, cmap="RdBu_r")
axes.set_xlabel("position t'")
axes.set_ylabel("position t")
axes.set_title("PE(t) · PE(t'): a function of t' − t")
figure.colorbar(image, ax=axes)
figure

# %% [markdown]
# ## Rotary positions (RoPE)
# RoPE adds nothing to the embeddings. Inside attention it rotates each pair (a_i, b_i) of a
# query or key at position p by the angle p ω_i. Which features form a pair is a convention:
# *interleaved* (x_2i, x_2i+1) or *halves* (x_i, x_i+D/2). The picture shows one vector at
# positions 0 .. 23 in both layouts: the first pair spins, the last hardly moves.

# %%
plot_rope(head_dim=8, positions=24)

# %% [markdown]
# Why rotations: R_m^T R_n = R_(n−m), so ⟨R_m q, R_n k⟩ = ⟨q, R_(n−m) k⟩. The score between a
# query at m and a key at n depends on their distance n − m only. We check it with
# `rope_forward`: shifting both positions by 10 leaves the score unchanged.

# %%
q, k = rng.standard_normal((2, 1, 1, 1, 8))                      # (B, H, T, D) each
def rotated(x, position, interleaved):
    return nt.rope_forward(x, np.array([position]), interleaved=interleaved)[0]

for interleaved in (True, False):
    near = np.sum(rotated(q, 3, interleaved) * rotated(k, 7, interleaved))
    far = np.sum(rotated(q, 13, interleaved) * rotated(k, 17, interleaved))
    assert np.isclose(near, far)
    print(f"interleaved={interleaved}: score at (3, 7) {near:.6f}, at (13, 17) {far:.6f}")

# %% [markdown]
# RoPE is linear in x and each rotation is orthogonal, so its backward is the inverse
# rotation (by −p ω_i). The finite-difference check agrees.

# %%
x = rng.standard_normal((1, 2, 5, 8))
report = nt.gradcheck(lambda x: nt.rope_forward(x, np.arange(5), interleaved=False),
                      nt.rope_backward, {"x": x}, title="rope (halves)")
print(report)
assert report.passed
