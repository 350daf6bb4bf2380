# %% [markdown]
# # 1. Tokens and embeddings
#
# A Transformer never sees text. It sees integers, the **token ids**, and its first layer turns
# each id into a vector of C numbers by looking up one row of a table, the **embedding**.
# This notebook follows a sentence from characters to those vectors, and checks the lookup's
# backward by finite differences.

# %%
# %matplotlib inline
import numpy as np
from matplotlib.figure import Figure

import numpy_tf as nt

# %% [markdown]
# ## Bytes as tokens
# The simplest tokenizer uses the UTF-8 bytes of the text: 256 ids, plus a few special tokens.
# Every text can be encoded, and decoding gives the text back exactly.

# %%
byte_tokenizer = nt.ByteTokenizer()
sentence = "Anna gave Tomas one apple."
ids = byte_tokenizer.encode(sentence)
print(byte_tokenizer.vocab_size, "ids;", len(ids), "tokens:", ids)
assert byte_tokenizer.decode(ids) == sentence

# %% [markdown]
# ## Byte-pair encoding
# One byte per token makes sequences long. Byte-pair encoding (BPE) starts from the bytes and
# repeatedly merges the most frequent adjacent pair of ids into a new id. Trained on a text,
# frequent words become single tokens, and the same sentence needs far fewer of them.

# %%
corpus = nt.default_corpus()
bpe = nt.BPETokenizer.train(corpus, 400)
bpe_ids = bpe.encode(sentence)
print(bpe.vocab_size, "ids;", len(bpe_ids), "tokens:",
      [bpe.decode([int(i)]) for i in bpe_ids])
assert bpe.decode(bpe_ids) == sentence and len(bpe_ids) < len(ids)

# %% [markdown]
# ## The embedding is a table lookup
# An embedding of V tokens in C dimensions is a (V, C) table W. Token id i becomes row W[i].
# Looking a row up is the same as multiplying a one-hot vector by W, only cheaper.

# %%
rng = np.random.default_rng(0)
V, C = bpe.vocab_size, 8
weight = rng.standard_normal((V, C))
x, cache = nt.embedding_forward(bpe_ids[None], weight)          # (1, T, C)
one_hot = np.eye(V)[bpe_ids]                                     # (T, V)
assert np.allclose(x[0], one_hot @ weight)
print(x.shape)

# %% [markdown]
# ## Its backward adds into the rows that were used
# Since out[t] = W[ids[t]], the loss gradient with respect to W is zero for every row that was
# not looked up, and a row used twice receives the sum of both positions' gradients. The
# backward must *add* (`np.add.at`), not assign: with `dW[ids] = g` a repeated id would keep
# only its last gradient.

# %%
repeated = np.array([[3, 7, 3, 3, 1]])                           # id 3 three times
dout = rng.standard_normal((1, 5, C))
_, cache = nt.embedding_forward(repeated, weight)
dweight = nt.embedding_backward(dout, cache)
assert np.allclose(dweight[3], dout[0, 0] + dout[0, 2] + dout[0, 3])
assert np.count_nonzero(np.abs(dweight).sum(axis=1)) == 3        # rows 1, 3 and 7 only

figure = Figure(figsize=(7, 2.6), layout="constrained")
axes = figure.add_subplot()
image = axes.imshow(np.abs(dweight[:10]).T, cmap="magma", aspect="auto")
axes.set_xlabel("row of W (token id)")
axes.set_ylabel("feature")
axes.set_title("|dL/dW|: only ids 1, 3, 7 receive gradient; id 3 collects three positions")
figure.colorbar(image, ax=axes)
figure

# %% [markdown]
# ## Checked by finite differences
# `gradcheck` perturbs every entry of W by ±h, reruns the forward, and compares
# (L(W + h) − L(W − h)) / 2h with what the backward returned (L = ⟨dout, out⟩ for a random
# dout). Integer inputs such as the ids are passed through unchanged.

# %%
report = nt.gradcheck(nt.embedding_forward, nt.embedding_backward,
                      {"ids": repeated, "weight": weight[:10]})
print(report)
assert report.passed
