"""Training: the Trainer and its settings (trainer.py), exact checkpoints (checkpoint.py), the
ready-made tasks of `numpy-tf train` (tasks.py), and CBOW's training loop (cbow.py)."""
from .cbow import load_cbow, save_cbow, train_cbow
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .trainer import Trainer, TrainingStopped, TrainSettings
