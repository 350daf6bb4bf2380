"""Benchmarks of numpy_tf against torch CPU eager (not part of the installed package)."""
