"""`python -m numpy_tf ...` is the `numpy-tf` command."""
import sys

from .cli import main

sys.exit(main())
