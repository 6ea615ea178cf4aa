"""Peak FLOP/s of the device: a sourced table for GPUs, a measured GEMM probe for CPUs.

An unknown GPU has no peak (MFU = None, shown as "N/A"): never borrow another GPU's figure.
A CPU's peak is measured: the best fp32 GEMM throughput this machine reaches with torch's
threads, probed once and cached (labelled "measured").
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..report import write_json


@dataclass(frozen=True)
class Peak:
    flops: float | None   # FLOP/s; None when unknown
    source: str           # where the figure comes from ("measured ..." on CPU)
    dtype: str


# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, in FLOP/s.
# Keys: (substring of torch.cuda.get_device_name(), dtype). First match wins, so the more
# specific names come first.
_H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense"
_H100_PCIE = "NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM), dense"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, dense"
_B200 = "NVIDIA DGX B200 / HGX B200 datasheet, per GPU, dense"
GPU_PEAKS: list[tuple[str, str, float, str]] = [
    ("H100 PCIe", "bf16", 756e12, _H100_PCIE), ("H100 PCIe", "fp16", 756e12, _H100_PCIE),
    ("H100 PCIe", "fp8", 1513e12, _H100_PCIE), ("H100 PCIe", "tf32", 378e12, _H100_PCIE),
    ("H100 PCIe", "fp32", 51e12, _H100_PCIE),
    ("H100", "bf16", 989.4e12, _H100_SXM), ("H100", "fp16", 989.4e12, _H100_SXM),
    ("H100", "fp8", 1978.9e12, _H100_SXM), ("H100", "tf32", 494.7e12, _H100_SXM),
    ("H100", "fp32", 66.9e12, _H100_SXM),
    ("H200", "bf16", 989.4e12, _H200), ("H200", "fp16", 989.4e12, _H200),
    ("H200", "fp8", 1978.9e12, _H200), ("H200", "tf32", 494.7e12, _H200),
    ("H200", "fp32", 66.9e12, _H200),
    ("A100", "bf16", 312e12, _A100), ("A100", "fp16", 312e12, _A100),
    ("A100", "tf32", 156e12, _A100), ("A100", "fp32", 19.5e12, _A100),
    ("B200", "bf16", 2250e12, _B200), ("B200", "fp16", 2250e12, _B200),
    ("B200", "fp8", 4500e12, _B200), ("B200", "mxfp8", 4500e12, _B200),
    ("B200", "tf32", 1100e12, _B200), ("B200", "fp32", 75e12, _B200),
]


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model()


def gpu_peak(name: str, dtype: str) -> Peak:
    for pattern, dt, flops, source in GPU_PEAKS:
        if pattern in name and dt == dtype:
            return Peak(flops, source, dtype)
    return Peak(None, f"unknown device {name!r} / {dtype}: no peak in the table", dtype)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path() -> Path:
    root = os.environ.get("GEMREF_CACHE_DIR") or Path.home() / ".cache" / "gemref"
    return Path(root) / "cpu_peak.json"


def probe_cpu_gemm(sizes: tuple[int, ...] = (512, 1024, 2048), repeats: int = 5) -> float:
    """Best fp32 GEMM FLOP/s over a few square sizes (after one warm-up each)."""
    best = 0.0
    g = torch.Generator().manual_seed(0)    # not the global RNG: a probe must not move a run's RNG state
    for n in sizes:
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        torch.mm(a, b)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


_PROBED: dict[str, Peak] = {}   # this process's peak per key: every run in a process uses one figure


def cpu_peak(refresh: bool = False) -> Peak:
    """This CPU's fp32 peak: the best GEMM FLOP/s measured so far for (CPU model, threads,
    torch version).

    Probed once per process (`refresh` probes again); the cache file keeps the best figure
    ever measured, so a probe taken while the machine was busy never lowers the peak and a
    quieter later probe raises it. A peak that is too low would inflate MFU.
    """
    key = f"{_cpu_model()} | threads={torch.get_num_threads()} | torch={torch.__version__}"
    if key in _PROBED and not refresh:
        return _PROBED[key]
    path = _cache_path()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        cache = {}
    best = max(probe_cpu_gemm(), cache.get(key, {}).get("flops", 0.0))
    if best > cache.get(key, {}).get("flops", 0.0):
        cache[key] = asdict(Peak(best, f"measured: best fp32 GEMM on {key}", "fp32"))
        write_json(path, cache)
    _PROBED[key] = Peak(**cache[key])
    return _PROBED[key]


def peak_flops(device: torch.device | str, dtype: str) -> Peak:
    """The peak FLOP/s an MFU is measured against, with its source.

    dtype: "fp32", "bf16", "fp16", "tf32", "fp8", "mxfp8". float8/MXFP8 runs report MFU
    against the bf16 peak (labelled by the caller); pass "fp8"/"mxfp8" for fp8 utilisation.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return gpu_peak(device_name(device), dtype)
    if device.type == "cpu":
        peak = cpu_peak()
        if dtype != "fp32":
            return Peak(peak.flops, peak.source + f" (fp32 probe used for {dtype})", dtype)
        return peak
    return Peak(None, f"no peak for device type {device.type!r}", dtype)
