"""The Triton GDPA kernel family (`kernel="triton"`): CUDA, or the Triton interpreter on CPU.

    op.py        the kernel entry point, its availability and FLOP formula (registers "triton")
    fwd.py       forward kernel;  bwd.py  dK/dV and dQ kernels;  act.py  activations
    schedule.py  which program runs which (sequence, tile, head)
    launch.py    guards, tiles, autotuning, launches
    variant.py   the kernel variants (chosen by `variant=`, `use_variant(...)` or GEMREF_GDPA)
"""
from . import op  # noqa: F401  (registers the kernel)
