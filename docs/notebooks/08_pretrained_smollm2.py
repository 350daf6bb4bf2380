# %% [markdown]
# # 8. A pretrained model: SmolLM2-135M
#
# Everything so far ran on models small enough to check by finite differences. The same
# layers, loaded with real weights, make a real language model: SmolLM2-135M-Instruct, a
# Llama-family decoder of 30 blocks. numpy_tf reads its weights (fetched once, about 93 MB)
# into its own Llama and runs it in NumPy; the test suite checks its logits and gradients
# against Hugging Face transformers.

# %%
# %matplotlib inline
import numpy as np
from matplotlib.figure import Figure

import numpy_tf as nt
from numpy_tf.interop.pretrained import load_smollm2
from numpy_tf.study import attention_maps, plot_attention

model, tokenizer = load_smollm2(np.float32)
config = model.config
print(f"{model.num_parameters():,} parameters: {config.num_hidden_layers} blocks of width "
      f"{config.hidden_size}, {config.num_attention_heads} query heads sharing "
      f"{config.num_key_value_heads} key/value heads, vocabulary {config.vocab_size:,}")

# %% [markdown]
# ## The same parts, larger
# Each block is the Pre-norm block of notebook 4 with Llama's choices: RMSNorm instead of
# LayerNorm, RoPE on the queries and keys (the halves layout, base 100000) instead of
# position embeddings, grouped-query attention (3 query heads per key/value head), and a
# SwiGLU feed-forward, down(SiLU(gate(x)) · up(x)). The output layer reuses the token
# embedding (tied weights).

# %%
block = model.layers[0]
for name, parameter in block.named_parameters():
    print(f"layers.0.{name:<32} {parameter.data.shape}")
assert model.lm_head.weight is model.embed_tokens.weight                # one Parameter

# %% [markdown]
# ## Generating with the KV cache
# Greedy decoding of a prompt, one new position per step.

# %%
prompt = tokenizer.encode("The capital of France is")[None, :]
tokens = nt.generate(model, prompt, 6, temperature=0)
print(tokenizer.decode(tokens[0]))
assert tokenizer.decode(tokens[0, prompt.shape[1]:]).startswith(" Paris")

# %% [markdown]
# ## The next token's distribution
# The probabilities of the most likely next tokens after the prompt: the model is confident.

# %%
logits, cache = model.forward(prompt)
probs = nt.sampling_probabilities(logits[:, -1])[0]
best = np.argsort(-probs)[:10]
figure = Figure(figsize=(8, 3), layout="constrained")
axes = figure.add_subplot()
axes.bar(range(10), probs[best])
axes.set_xticks(range(10), [repr(tokenizer.decode([int(t)])) for t in best], rotation=30)
axes.set_ylabel("probability")
axes.set_title("after 'The capital of France is'")
figure

# %% [markdown]
# ## Where it looks
# Every block's attention probabilities are in the forward's cache. Many heads put most of
# their weight on the first token (a common pattern in trained models, where the first
# position serves as a place to put attention that is not needed); others look at the
# current token or the one before it.

# %%
_, cache = model.forward(tokens)
maps = attention_maps(cache)
pieces = [tokenizer.decode([int(t)]) for t in tokens[0]]
print(len(maps), "attention maps of shape", maps[0].shape)
plot_attention(maps, pieces, layers=[0, 15, 29], heads=[0, 3, 6])
