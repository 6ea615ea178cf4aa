"""One Linear layer's GEMMs per precision, side by side: forward+backward time and SQNR against fp32.

For a shape MxKxN (M tokens, K in-features, N out-features) and each precision, one bias-free
nn.Linear, with the same weights, converted by `apply.apply_precision` runs forward+backward (3
GEMMs, 6*M*K*N FLOPs) `reps` times after `warmup`; a row holds the median time (ms), TFLOP/s,
the speed-up vs fp32 and bf16 (t_ref / t) and the SQNR (dB) of output, input grad and weight
grad against the fp32 layer (`sqnr.compare_linear`). Emulated paths (no float8/MXFP8 hardware)
reproduce the numerics only: their ratios read "emulated" and make no speed claim.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ..errors import UsageError
from .apply import apply_precision
from .sqnr import compare_linear


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_linear(model: nn.Module, x: torch.Tensor, grad: torch.Tensor, autocast, warmup: int,
                reps: int) -> float:
    """Median seconds of one forward+backward of `model` on x."""
    times = []
    for i in range(warmup + reps):
        for p in model.parameters():
            p.grad = None
        _sync(x.device)
        start = time.perf_counter()
        with autocast:
            y = model(x)
        y.backward(grad.to(y.dtype))
        _sync(x.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare_shape(m: int, k: int, n: int, precisions: list[str], device: torch.device, kernel: str,
                  warmup: int, reps: int, seed: int) -> list[dict]:
    """One row per precision for the MxKxN layer (module doc); a precision the shape cannot run
    is a UsageError naming why."""
    torch.manual_seed(seed)
    base = nn.Linear(k, n, bias=False, device=device)
    x = torch.randn(m, k, device=device)
    grad = torch.randn(m, n, device=device)
    rows = []
    for precision in precisions:
        model = nn.Sequential(nn.Linear(k, n, bias=False, device=device))
        model.load_state_dict({"0.weight": base.weight.detach()})
        report = apply_precision(model, precision, device=device, kernel=kernel, min_dim=0)
        if report.skipped:
            raise UsageError(f"{m}x{k}x{n} cannot run {precision}: {report.skipped[0].reason}")
        seconds = time_linear(model, x, grad, report.autocast(), warmup, reps)
        q = compare_linear(base, precision, x, grad_output=grad, kernel=kernel)
        rows.append({"shape": f"{m}x{k}x{n}", "precision": precision, "kernel": report.kernel,
                     "ms": seconds * 1e3, "tflops": 6 * m * k * n / seconds / 1e12,
                     "out_sqnr_db": q.output_db, "dgrad_sqnr_db": q.input_grad_db,
                     "wgrad_sqnr_db": q.weight_grad_db, "kernel_reason": report.reason})
    for ref in ("fp32", "bf16"):
        t_ref = next((r["ms"] for r in rows if r["precision"] == ref), None)
        for r in rows:
            r[f"vs_{ref}"] = ("emulated" if r["kernel"] == "emulated" else
                              None if t_ref is None else t_ref / r["ms"])
    return rows
