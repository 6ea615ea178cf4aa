"""The fused C++ CPU GDPA kernel family (pointwise activations).

    op.py       `kernel="cpu_fused"`: the torch custom ops, FLOP formula and thread split
    amx_op.py   `kernel="cpu_fused_amx"`: bf16 on AMX tiles, same scaffolding, its own geometry
    build.py    compiling kernel.cpp and amx.cpp once per machine into the cache, loading them with ctypes
    common.h    vectors, bf16 storage, activations and mask geometry, shared by the two kernels
    kernel.cpp  the float32/float64 (and widened bf16) loops; amx.cpp the AMX loops (no PyTorch headers)
"""
from . import amx_op, op  # noqa: F401  (each registers its kernel)
