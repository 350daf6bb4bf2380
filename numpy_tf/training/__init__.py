"""Training: the Trainer and its settings (trainer.py), exact checkpoints (checkpoint.py), the
ready-made tasks of `numpy-tf train` (tasks.py), a step's batch in parts on threads (split.py),
and CBOW's training loop (cbow.py)."""
from .cbow import load_cbow, save_cbow, train_cbow
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .split import BatchSplit
from .trainer import Trainer, TrainingStopped, TrainSettings
