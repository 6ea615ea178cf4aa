"""The fused C++ CPU GDPA kernel family (`kernel="cpu_fused"`, pointwise activations).

    op.py       the torch custom ops, FLOP formula and thread split (registers "cpu_fused")
    build.py    compiling kernel.cpp once per machine into the cache, loading it with ctypes
    kernel.cpp  the loops (no PyTorch headers)
"""
from . import op  # noqa: F401  (registers the kernel)
