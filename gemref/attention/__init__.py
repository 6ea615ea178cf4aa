"""Generalized Dot-Product Attention (GDPA) on jagged sequences: one API, several kernels."""
from .api import AUTO_ORDER, KERNELS, gdpa, kernel_names, register_kernel, resolve_kernel
from .reference import ACTIVATIONS, POINTWISE, gdpa_padded, gdpa_reference

__all__ = ["gdpa", "gdpa_padded", "gdpa_reference", "kernel_names", "resolve_kernel",
           "register_kernel", "KERNELS", "AUTO_ORDER", "ACTIVATIONS", "POINTWISE"]
