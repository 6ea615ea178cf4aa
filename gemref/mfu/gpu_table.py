"""Dense peak FLOP/s of NVIDIA data-centre GPUs, looked up by the exact device name.

Keys are the strings `torch.cuda.get_device_name()` returns (the CUDA device-properties
name, the same string `nvidia-smi --query-gpu=name` prints). Matching is exact: a name that
is not in the table has no peak (`gpu_peak(...).flops is None`, shown as "N/A"), never the
figure of a GPU whose name happens to contain a similar substring ("NVIDIA H100 NVL" is not
an "H100" SXM: 835 dense bf16 TFLOP/s, not 989).

Figures are dense (no 2:4 sparsity) tensor-core FLOP/s per GPU; fp32 is the non-tensor
(CUDA-core) rate. NVIDIA's datasheets print most tensor-core rows with sparsity ("*"); those
are halved here and each row names its datasheet. fp8 is present for Hopper and Blackwell,
mxfp8 for Blackwell only (Hopper has no MX block-scaled tensor cores).
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8")
T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One datasheet column: dense FLOP/s per dtype (None: the GPU has no such tensor core)."""

    fp32: float
    tf32: float
    bf16: float
    fp8: float | None
    mxfp8: float | None
    source: str

    def flops(self, dtype: str) -> float | None:
        return self.bf16 if dtype == "fp16" else getattr(self, dtype)


_H100_SXM = GpuSpec(66.9 * T, 494.7 * T, 989.4 * T, 1978.9 * T, None,
                    "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (sparse figures halved)")
_H100_PCIE = GpuSpec(51 * T, 378 * T, 756 * T, 1513 * T, None,
                     "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column (sparse figures halved)")
_H100_NVL = GpuSpec(60 * T, 835 / 2 * T, 1671 / 2 * T, 3341 / 2 * T, None,
                    "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column (sparse figures halved)")
_H200_SXM = GpuSpec(67 * T, 989 / 2 * T, 1979 / 2 * T, 3958 / 2 * T, None,
                    "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (sparse figures halved)")
_H200_NVL = GpuSpec(60 * T, 835 / 2 * T, 1671 / 2 * T, 3341 / 2 * T, None,
                    "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column (sparse figures halved)")
_GH200 = GpuSpec(67 * T, 989 / 2 * T, 1979 / 2 * T, 3958 / 2 * T, None,
                 "NVIDIA GH200 Grace Hopper Superchip datasheet, GPU (sparse figures halved)")
_B200 = GpuSpec(75 * T, 2.2 / 2 * 1e15, 4.5 / 2 * 1e15, 9 / 2 * 1e15, 9 / 2 * 1e15,
                "NVIDIA HGX B200 datasheet, per GPU (sparse figures halved; MXFP8 at the FP8 rate)")
_GB200 = GpuSpec(80 * T, 2.5 / 2 * 1e15, 5 / 2 * 1e15, 10 / 2 * 1e15, 10 / 2 * 1e15,
                 "NVIDIA GB200 NVL72 datasheet, per Blackwell GPU (sparse figures halved; MXFP8 at "
                 "the FP8 rate)")
_A100 = GpuSpec(19.5 * T, 156 * T, 312 * T, None, None,
                "NVIDIA A100 Tensor Core GPU datasheet (dense; all A100 40GB/80GB SXM/PCIe alike)")

GPU_TABLE: dict[str, GpuSpec] = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _H100_NVL,
    "NVIDIA H200": _H200_SXM,
    "NVIDIA H200 NVL": _H200_NVL,
    "NVIDIA GH200 480GB": _GH200,          # 96 GB HBM3 GPU; "480GB" is the Grace LPDDR5X
    "NVIDIA GH200 144G HBM3e": _GH200,
    "NVIDIA GH200 120GB": _GH200,
    "NVIDIA B200": _B200,
    "NVIDIA GB200": _GB200,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
}

# The short GPU names gemref's hardware profiles use (gemref/simulate/cost_model.py), each
# bound to exactly one device name above. Also exact: "H100" means the SXM part.
PROFILE_GPUS: dict[str, str] = {
    "H100": "NVIDIA H100 80GB HBM3", "H100 NVL": "NVIDIA H100 NVL", "H200": "NVIDIA H200",
    "H200 NVL": "NVIDIA H200 NVL", "GH200": "NVIDIA GH200 480GB", "B200": "NVIDIA B200",
    "GB200": "NVIDIA GB200",
}


def lookup(name: str) -> tuple[str, GpuSpec] | None:
    """(device name, spec) for an exact device name or hardware-profile name; None if absent."""
    device = PROFILE_GPUS.get(name, name)
    spec = GPU_TABLE.get(device)
    return (device, spec) if spec is not None else None


def gpu_peak_flops(name: str, dtype: str) -> tuple[float | None, str]:
    """(dense FLOP/s or None, where it comes from / why there is none)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; valid: {', '.join(DTYPES)}")
    found = lookup(name)
    if found is None:
        return None, (f"{name!r} is not in the GPU table (exact names only): MFU N/A; give its dense peak as "
                      "GEMREF_PEAK_TFLOPS=DTYPE=TFLOPS (or --peak-tflops)")
    device, spec = found
    flops = spec.flops(dtype)
    if flops is None:
        return None, f"{device} has no {dtype} tensor cores ({spec.source}): MFU N/A"
    alias = f" (profile name {name!r})" if device != name else ""
    return flops, f"{device}{alias}, dense {dtype}: {spec.source}"
