"""Kernel tests run the Triton kernels on CPU through Triton's interpreter (small shapes)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
