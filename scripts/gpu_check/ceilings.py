"""GPU check, section "ceilings": what the hardware gives, before any gemref kernel.

bf16 GEMM of 8192^3 (2 * 8192^3 FLOPs per call; cuBLAS) in TFLOP/s, and a device-to-device
copy of 1 GiB (read + write = 2 GiB moved per call) in GB/s, both as do_bench medians; the
GPU's name, capability, memory and SM count; torch's TF32 policy (common.tf32_policy); which
low-precision recipes run here and natively, with the failing gate in words
(gemref/precision/support.py); and whether the optional packages the wheels bring (torchao,
plotly) import, with their versions. --dry-run: 256^3 and 16 MiB on CPU.
"""
from __future__ import annotations

import importlib

from .common import Result, bench_ms, device, error_text, parse_args, tf32_policy


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch

    dev = device(args.dry_run)
    result = Result(args.result, device=str(dev), torch=torch.__version__)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        result.data.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                           memory_gib=round(props.total_memory / 2 ** 30, 1), sms=props.multi_processor_count,
                           cuda=torch.version.cuda)
    try:
        import triton
        result.data["triton"] = triton.__version__
    except ImportError as e:
        result.data["triton"] = error_text(e)
    result.data["tf32"] = tf32_policy()
    from gemref.precision.support import precision_support
    result.data["precision_support"] = {p: vars(precision_support(p, dev)) for p in
                                        ("float8_rowwise", "float8_tensorwise", "mxfp8")}
    for name in ("torchao", "plotly"):
        try:
            result.data[name] = getattr(importlib.import_module(name), "__version__", "imported")
        except Exception as e:   # noqa: BLE001  (a wheel that is missing or broken: say which)
            result.data[name] = f"not importable: {error_text(e)}"
    result.save()

    n = 256 if args.dry_run else 8192
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    ms = bench_ms(lambda: a @ b, dev)
    result.data["gemm_bf16"] = {"n": n, "ms": ms, "tflops": 2 * n ** 3 / (ms * 1e-3) / 1e12}
    result.save()
    a = b = None   # free the GEMM operands before the copy

    nbytes = (16 if args.dry_run else 1024) << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), dev)
    result.data["copy_d2d"] = {"bytes": nbytes, "ms": ms, "gb_per_s": 2 * nbytes / (ms * 1e-3) / 1e9}
    result.save()


if __name__ == "__main__":
    main()
