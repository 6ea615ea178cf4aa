"""The precision section (rung 7): the Linear GEMMs' number format and its GEMM path."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

PRECISIONS = ("fp32", "bf16", "float8_rowwise", "float8_tensorwise", "mxfp8")   # gemref/precision/apply.py
PRECISION_KERNELS = ("auto", "native", "emulated")                            # float8/MXFP8 GEMM paths
HIGH_PRECISIONS = ("fp32", "bf16")   # nothing converted, no gate: every device runs their GEMMs


def high_precision_reason(precision: str, device_type: str) -> str:
    """Why an fp32 or bf16 run needs no gate: the words apply_precision's report and
    precision_support (gemref/precision/support.py) both record. Here, not in support.py, so
    that an fp32/bf16 run does not load the low-precision gates."""
    return f"{precision} GEMMs run natively on {device_type}"


@dataclass(frozen=True)
class PrecisionConfig(Section):
    recipe: str = switch("auto", "precision", "rung 7: Linear GEMM precision (auto: fp32 on CPU, bf16 on CUDA)",
                         ("auto",) + PRECISIONS)
    kernel: str = switch("auto", "precision_kernel", "float8/MXFP8 GEMM path", PRECISION_KERNELS)
    min_dim: int | None = switch(None, "precision_min_dim", "Linear layers with min(in, out) below this stay in "
                                 "high precision (none: native float8 converts where torchao's H100 rule says "
                                 "it pays, everything else 64)")

    def check(self) -> None:
        if self.min_dim is not None and self.min_dim < 0:
            raise UsageError(f"precision_min_dim must be >= 0, got {self.min_dim}")
