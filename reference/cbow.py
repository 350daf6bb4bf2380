"""Fixtures for CBOW: nn.Embedding, the mean over the context axis, nn.Linear to the vocabulary,
and the mean cross-entropy against the centre words. The contexts repeat ids within a row and
across rows, so the accumulation of the embedding gradient is exercised.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common import DTYPES, generator, meta, randomize, save_case, to_numpy

FILE = "cbow.py"


class CBOW(nn.Module):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, dim)
        self.output = nn.Linear(dim, vocab_size)

    def forward(self, contexts):
        return self.output(self.embeddings(contexts).mean(dim=1))


def build(out_dir):
    paths = []
    config = {"vocab_size": 9, "dim": 5}
    seed = 110
    for dtype in DTYPES:
        g = generator(seed)
        model = randomize(CBOW(**config).to(DTYPES[dtype]), g, dtype)
        contexts = torch.randint(0, config["vocab_size"], (6, 4), generator=g)
        contexts[0] = torch.tensor([3, 3, 1, 3])          # one word three times in a context
        contexts[1] = torch.tensor([2, 2, 2, 2])          # a context of a single word
        centres = torch.randint(0, config["vocab_size"], (6,), generator=g)
        logits = model(contexts)
        loss = F.cross_entropy(logits, centres)
        loss.backward()
        arrays = {f"param/{name}": to_numpy(p) for name, p in model.state_dict().items()}
        arrays.update({"input/contexts": to_numpy(contexts), "input/centres": to_numpy(centres),
                       "output/logits": to_numpy(logits), "loss": to_numpy(loss)})
        for name, parameter in model.named_parameters():
            arrays[f"grad/{name}"] = to_numpy(parameter.grad)
        case_meta = meta(FILE, "cbow", seed, dtype, config, ["contexts", "centres"],
                         conventions={"cbow": "logits = Linear(mean over the context axis of "
                                                  "Embedding(contexts)); loss = mean "
                                                  "cross-entropy against the centres"})
        paths.append(save_case(out_dir / f"cbow_{dtype}.npz", case_meta, arrays))
    return paths
