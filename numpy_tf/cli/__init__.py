"""The `numpy-tf` command line. Nothing imports this package."""
from .commands import main
