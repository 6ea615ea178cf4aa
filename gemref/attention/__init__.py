"""Generalized Dot-Product Attention (GDPA) on jagged sequences: one API, several kernels.

Kernels (gdpa(..., kernel=NAME)): "reference" (the padded spec), "sdpa" (softmax through
PyTorch's flash kernels), "flash_attn" (the flash-attn package, CUDA), "triton" (Triton
GDPA, every activation, CUDA or the interpreter), "cpu_jagged" (bucketed, chunked CPU path),
"cpu_fused" (pointwise activations, one fused C++ loop per sequence and head, built on first
use), "cpu_fused_amx" (the same in bf16 with its products on Intel AMX tiles).
"auto" takes the first of AUTO_ORDER that can run the inputs: on CUDA softmax goes to
flash_attn (if installed), else sdpa (fp16/bf16), else triton; pointwise goes to triton. On
CPU softmax goes to sdpa and pointwise to cpu_fused_amx (bf16 on an AMX CPU), else cpu_fused, else cpu_jagged (both run on CPU only, so
the Triton interpreter is never an automatic choice).
The switches (AttentionConfig: --jagged, --kernel) are in config.py, which loads no torch.
"""
from typing import Any

from ..runtime.lazy import lazy_exports

__all__, _export, __dir__ = lazy_exports(__name__, {
    ".api": ("AUTO_ORDER", "KERNELS", "gdpa", "kernel_names", "register_kernel", "resolve_kernel",
             "resolve_model_kernel"),
    ".config": ("KERNEL_NAMES", "AttentionConfig"),
    ".flops": ("AttentionTally", "attention_model_flops", "counting_attention"),
    ".reference": ("ACTIVATIONS", "POINTWISE", "gdpa_padded", "gdpa_reference")})


def __getattr__(name: str) -> Any:
    """A name of the package, imported on first use; reading one of __all__ registers every kernel
    first (api.load_kernels), so KERNELS is whole wherever it is read. A submodule (`from ..
    import bucketing`) is only imported, and config.py alone loads no torch."""
    if name in __all__:
        from .api import load_kernels

        load_kernels()
    return _export(name)
