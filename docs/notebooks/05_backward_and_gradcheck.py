# %% [markdown]
# # 5. Each layer's backward, and its finite-difference check
#
# Every layer in numpy_tf comes as a pair of functions:
#
#     out, cache = layer_forward(inputs...)
#     dinputs... = layer_backward(dout, cache)
#
# The forward keeps in its cache what the backward will need. The backward receives dout, the
# gradient of the loss with respect to `out`, and returns the gradient with respect to each
# input: the chain rule, one layer at a time. Here we derive one backward, then check every
# layer against finite differences of its own forward.

# %%
# %matplotlib inline
import numpy as np

import numpy_tf as nt
from numpy_tf.checking import GradcheckReport
from numpy_tf.study import plot_gradcheck
from numpy_tf.teaching.layer_table import LAYERS, gradcheck_layer, layer

rng = np.random.default_rng(0)

# %% [markdown]
# ## The linear layer by hand
# y = x Wᵀ + b, so ∂y_k/∂x_i = W_ki. With g = dout: dx = g W, dW = gᵀ x, db = Σ g over the
# rows. A numerical derivative of one entry agrees:
# (L(W + h e) − L(W − h e)) / 2h with L = ⟨g, y⟩.

# %%
x, weight, bias = rng.standard_normal((4, 3)), rng.standard_normal((2, 3)), rng.standard_normal(2)
y, cache = nt.linear_forward(x, weight, bias)
g = rng.standard_normal(y.shape)
dx, dweight, dbias = nt.linear_backward(g, cache)
assert np.allclose(dx, g @ weight) and np.allclose(dweight, g.T @ x)

h, plus, minus = 1e-6, weight.copy(), weight.copy()
plus[1, 2] += h
minus[1, 2] -= h
numerical = (np.sum(g * nt.linear_forward(x, plus, bias)[0])
             - np.sum(g * nt.linear_forward(x, minus, bias)[0])) / (2 * h)
print(f"dW[1, 2]: backward {dweight[1, 2]:.10f}, finite differences {numerical:.10f}")

# %% [markdown]
# ## Why the upstream gradient must be random
# With dout all ones, L = Σ out. LayerNorm's output sums to 0 on every row whatever x is, so
# L does not depend on x at all and the correct dx is exactly zero. A backward that returned
# zeros for any dout would pass such a test. A random dout makes every part of the Jacobian
# count.

# %%
x = rng.standard_normal((3, 5))
out, cache = nt.layernorm_forward(x, np.ones(5), np.zeros(5))
dx_ones = nt.layernorm_backward(np.ones_like(out), cache)[0]
dx_random = nt.layernorm_backward(rng.standard_normal(out.shape), cache)[0]
print("max |dx| with dout = 1:", np.abs(dx_ones).max(), " with random dout:",
      np.abs(dx_random).max().round(3))

# %% [markdown]
# ## gradcheck
# `gradcheck(forward, backward, inputs)` does this for every entry of every float input, in
# float64, and reports per tensor the relative error ‖a − n‖ / ‖n‖ between the analytic
# gradient a and the numerical one n. A correct backward lands near 1e-9; a backward off by
# 0.1 % is caught at once.

# %%
inputs = {"x": rng.standard_normal((2, 3, 5)), "weight": rng.standard_normal(5),
          "bias": rng.standard_normal(5)}
print(nt.gradcheck(nt.layernorm_forward, nt.layernorm_backward, inputs))

def slightly_wrong_backward(dout, cache):
    dx, dweight, dbias = nt.layernorm_backward(dout, cache)
    return dx * 1.001, dweight, dbias

plot_gradcheck(nt.gradcheck(nt.layernorm_forward, slightly_wrong_backward, inputs,
                            title="layernorm with dx off by 0.1 %"))

# %% [markdown]
# ## A gradient that is zero by definition
# An embedding's `padding_idx` row is frozen, as in torch: the forward reads it, but its
# gradient is defined to be zero, so it is never trained. Finite differences of the forward
# do see a slope there; the check must hold that row constant and compare the others.

# %%
ids = np.array([[0, 2, 0, 3]])                                   # 0 is the padding id
weight = rng.standard_normal((5, 4))
out, cache = nt.embedding_forward(ids, weight, padding_idx=0)
dweight = nt.embedding_backward(rng.standard_normal(out.shape), cache)
assert not dweight[0].any()

def forward_of_the_trained_rows(ids, rows):                      # row 0 held constant
    return nt.embedding_forward(ids, np.concatenate([weight[:1], rows]), padding_idx=0)

def backward_of_the_trained_rows(dout, cache):
    return nt.embedding_backward(dout, cache)[1:]

report = nt.gradcheck(forward_of_the_trained_rows, backward_of_the_trained_rows,
                      {"ids": ids, "rows": weight[1:]}, title="embedding, rows 1 .. 4")
print(report)
assert report.passed

# %% [markdown]
# ## Every layer, every edge case
# `numpy-tf gradcheck LAYER` runs the same check on each layer's edge cases (masks, repeated
# ids, ignored targets, both RoPE layouts, ...). Here all of them, gathered into one report
# (the padding_idx case was checked just above, with its frozen row held constant). An entry
# passes when |a − n| ≤ rtol |n| + atol max(1, S), S the largest |n|: where n is tiny the
# absolute part decides, so a relative error beyond the dashed line can still pass.

# %%
rows = []
for name in LAYERS:
    for case, edge in enumerate(layer(name).cases):
        if edge.options.get("padding_idx") is not None:
            continue
        report, _ = gradcheck_layer(name, case=case)
        for row in report.rows:
            row.name = f"{name} {case}: {row.name}"
            rows.append(row)
every = GradcheckReport("of every layer's edge cases", "full", rows)
print(len(rows), "tensors checked; all passed:", every.passed)
assert every.passed
worst = sorted(rows, key=lambda row: -row.norm_rel_error)[:12]
plot_gradcheck(GradcheckReport("the 12 worst of them", "full", worst))

# %% [markdown]
# ## A whole model
# `gradcheck_module` checks a Module's backward end to end. For a model, the fast mode
# compares directional derivatives: for a random direction v over all parameters at once,
# ⟨∇L, v⟩ against (L(θ + h v) − L(θ − h v)) / 2h, two forwards per direction.

# %%
model = nt.GPT(nt.GPTConfig.tiny(), rng=0)
ids = rng.integers(0, 20, (2, 8))
report = nt.gradcheck_module(model, ids, fast=True, directions=4, wrt_inputs=False)
print(report)
assert report.passed
