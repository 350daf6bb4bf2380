# %% [markdown]
# # 6. Training
#
# Training repeats one step: draw a batch of token windows, run the forward to the
# cross-entropy loss, run the backward to every parameter's gradient, clip the gradients'
# global norm, and let AdamW move each parameter. Here a small GPT learns the short stories
# that ship with numpy_tf, one byte per token, in a few seconds.

# %%
# %matplotlib inline
import tempfile
from pathlib import Path

import numpy as np

import numpy_tf as nt
from numpy_tf.study import plot_loss, plot_norms
from numpy_tf.training.tasks import language_model_trainer

text = nt.default_corpus()
print(len(text), "characters;", repr(text[:120]))

# %% [markdown]
# ## The model and the data
# 2 blocks of width 32 with 4 heads, a context of 16 bytes. The last 10 % of the text is held
# out before any window is cut, so the held-out loss measures text the model never trained on.

# %%
tokenizer = nt.ByteTokenizer()
config = nt.GPTConfig(vocab_size=tokenizer.vocab_size, max_context=16, width=32, heads=4,
                      layers=2)
settings = nt.TrainSettings(steps=300, batch_size=16, lr=1e-2, min_lr=1e-3, warmup=20,
                            eval_every=25, log_every=100)
folder = Path(tempfile.mkdtemp())
trainer = language_model_trainer(text, config, settings, tokenizer=tokenizer,
                                 checkpoint_path=folder / "checkpoint.npz", dtype=np.float32)
print(f"{trainer.model.num_parameters():,} parameters; before training the loss should be "
      f"near ln(vocabulary) = {np.log(tokenizer.vocab_size):.2f}")

# %%
trainer.run()
trainer.write_history(folder / "history.csv")

# %% [markdown]
# ## The loss curve
# The loss starts at ln V (every byte equally likely) and falls fast as the model learns which
# bytes are common, then slowly as it learns words. The held-out loss follows the training
# loss: a model this small does not yet memorise its text.

# %%
plot_loss(folder / "history.csv")

# %% [markdown]
# ## Where the learning happens
# The history keeps, for each block and the other parameter groups, the gradient's norm
# (before clipping) and the size of the update AdamW applied. The updates shrink as the
# learning rate follows its cosine schedule down to min_lr.

# %%
plot_norms(folder / "history.csv")

# %% [markdown]
# ## What it learned
# Sampling the trained model (temperature 0.8) gives the corpus's most common words and its
# spacing, in no sensible order yet: that is as far as 300 steps of a 42,000-parameter model
# go. (`numpy-tf train` trains a larger one for longer.)

# %%
prompt = tokenizer.encode("Anna ")[None, :]
sample = nt.generate(trainer.model, prompt, 120, rng=np.random.default_rng(0),
                     temperature=0.8, slide=True)
print(tokenizer.decode(sample[0]))

# %% [markdown]
# ## A checkpoint resumes exactly
# The run saved a checkpoint at its end: the parameters, AdamW's moments, the step and the
# random generator's state. Ten more steps from the loaded file give, bit for bit, what ten
# more steps of the trainer still in memory give.

# %%
resumed = nt.Trainer.resume(nt.load_checkpoint(folder / "checkpoint.npz"), nt.TargetLoss,
                            trainer.sample_batch, eval_batches=trainer.eval_batches)
trainer.checkpoint_path = None                                   # keep the file as it is
trainer.run(310, log=lambda line: None)
resumed.run(310, log=lambda line: None)
assert all(np.array_equal(a, b) for a, b in zip(trainer.model.state_dict().values(),
                                                 resumed.model.state_dict().values()))
print("both at step", resumed.step, "with identical parameters")
