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
"""
from . import cpu_fused, cpu_jagged, flash_attn, sdpa, triton  # noqa: F401  (each registers its kernel)
from .api import AUTO_ORDER, KERNELS, gdpa, kernel_names, register_kernel, resolve_kernel, resolve_model_kernel
from .flops import AttentionTally, attention_model_flops, counting_attention
from .reference import ACTIVATIONS, POINTWISE, gdpa_padded, gdpa_reference

AUTO_ORDER[:] = ["flash_attn", "sdpa", "cpu_fused_amx", "cpu_fused", "cpu_jagged", "triton", "reference"]

__all__ = ["gdpa", "gdpa_padded", "gdpa_reference", "kernel_names", "resolve_kernel",
           "register_kernel", "resolve_model_kernel", "attention_model_flops", "counting_attention",
           "AttentionTally", "KERNELS", "AUTO_ORDER", "ACTIVATIONS",
           "POINTWISE"]
