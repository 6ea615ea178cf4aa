"""Attention kernels side by side: time, TFLOP/s, peak memory, speed-up vs reference.

For every max length, length profile, activation and kernel: forward and forward+backward
median wall time (warm-up, then repetitions; CUDA timed with events after a sync),
achieved TFLOP/s on the REAL-length model FLOPs (forward: attention_model_flops; forward+
backward: 3x that, docs/design.md), the kernel's executed/model FLOP ratio (padding, masked
tiles), peak memory of one forward+backward (a separate, untimed pass) and the speed-up over
the reference kernel measured in the same run on the same batch.

Length profiles (deterministic from --seed), each with one sequence at the max length:
  fixed    every sequence at the max length;
  uniform  the others uniform in [1, max];
  skewed   the others max * u^4 (u uniform): mostly short histories, as in ads logs.
A batch holds about --tokens rows (default max(2 * max_len, 1024)). The reference is skipped
(with the reason) when its padded score tensors would pass REFERENCE_BYTES_CAP.

Repetitions run round-robin over the kernels so load bursts on a shared machine hit all of
them alike. On an oversubscribed CPU pass --threads (e.g. 1): the many-op kernels suffer
most from OpenMP threads waiting on descheduled peers (gemref/attention/cpu_jagged/op.py).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Callable

import torch

from ..attention import ACTIVATIONS, KERNELS, attention_model_flops, gdpa
from ..options import add_device_arg, device_of, output_file
from ..data.jagged import lengths_to_offsets
from ..errors import UsageError
from ..mfu.memory import track_peak_memory
from ..report import format_table
from ..runtime.files import write_json
from ..mfu.timing import interleaved

PROFILES = ("fixed", "uniform", "skewed")
CPU_LENGTHS = (128, 512, 2048, 4096)
CUDA_LENGTHS = (128, 512, 1024, 2048, 4096, 8192)
REFERENCE_BYTES_CAP = 3 << 30  # skip the reference when its score tensors would exceed this


def make_lengths(profile: str, max_len: int, tokens: int, seed: int) -> list[int]:
    """Sequence lengths of one batch: the first at max_len, about `tokens` rows in all."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [max_len]
    while sum(lengths) < tokens:
        u = float(torch.rand((), generator=gen))
        if profile == "fixed":
            lengths.append(max_len)
        elif profile == "uniform":
            lengths.append(1 + int(u * max_len) if u < 1 else max_len)
        elif profile == "skewed":
            lengths.append(max(1, math.ceil(max_len * u ** 4)))
        else:
            raise ValueError(f"unknown length profile {profile!r}; valid: {', '.join(PROFILES)}")
    return lengths


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare_kernels(lengths: list[int], kernels: list[str], activation: str, *, heads: int = 2,
                    head_dim: int = 32, causal: bool = False, window: int | None = None,
                    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    warmup: int = 1, reps: int = 3, seed: int = 0) -> tuple[list[dict], list[tuple]]:
    """Time every kernel that can run this jagged batch (interleaved), then one untimed memory
    pass each. Returns (one row per kernel, [(kernel, reason)] for those that cannot run here).
    Speed-ups are over "reference" when it is first in `kernels` and runs."""
    device = torch.device(device)
    offsets = lengths_to_offsets(torch.tensor(lengths)).to(device)
    T = int(offsets[-1])
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(T, heads, head_dim, generator=gen).to(device, dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    runnable, skipped = [], []
    for kernel in kernels:
        reason = KERNELS[kernel].unavailable(q, activation, causal, window)
        ref_bytes = 4 * len(lengths) * heads * max(lengths) ** 2 * q.element_size()
        if kernel == "reference" and ref_bytes > REFERENCE_BYTES_CAP:
            reason = f"at L={max(lengths)} its padded scores would take ~{ref_bytes / 2 ** 30:.1f} GiB"
        (runnable.append(kernel) if reason is None else skipped.append((kernel, reason)))
    opts = dict(activation=activation, causal=causal, window=window, max_len=max(lengths))

    def forward(kernel):
        return lambda: gdpa(q, k, v, offsets, kernel=kernel, **opts)

    def forward_backward(kernel):
        return lambda: torch.autograd.grad(gdpa(q, k, v, offsets, kernel=kernel, **opts), (q, k, v), grad)

    fns = {(kernel, "fwd"): forward(kernel) for kernel in runnable}
    fns.update({(kernel, "fwdbwd"): forward_backward(kernel) for kernel in runnable})
    seconds = {name: statistics.median(t) for name, t in
               interleaved({name: (lambda k, fn=fn: _seconds(fn, device)) for name, fn in fns.items()}, reps,
                           warmup=warmup).items()}
    model = attention_model_flops(lengths, lengths, heads, head_dim, causal, window)
    lengths_t = torch.tensor(lengths, device=device)
    rows = []
    for kernel in runnable:
        with track_peak_memory(device) as peak:
            forward_backward(kernel)()
        executed = sum(KERNELS[kernel].executed_flops(lengths_t, lengths_t, heads, head_dim, causal, window))
        fwd_s, fwdbwd_s = seconds[(kernel, "fwd")], seconds[(kernel, "fwdbwd")]
        rows.append({"kernel": kernel, "fwd_ms": fwd_s * 1e3, "fwdbwd_ms": fwdbwd_s * 1e3,
                     "fwd_tflops": model / fwd_s / 1e12, "fwdbwd_tflops": 3 * model / fwdbwd_s / 1e12,
                     "exec_over_model": executed / (3 * model) if model else None,
                     "peak_mib": peak.bytes / 2 ** 20, "memory_method": peak.method})
    if runnable and runnable[0] == "reference":
        for row in rows:
            row["speedup_fwd"] = rows[0]["fwd_ms"] / row["fwd_ms"]
            row["speedup_fwdbwd"] = rows[0]["fwdbwd_ms"] / row["fwdbwd_ms"]
    return rows, skipped


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_device_arg(parser)
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="kernels to compare (default: every kernel that can run here; reference is always added)")
    parser.add_argument("--activations", nargs="+", default=["softmax", "silu"], choices=ACTIVATIONS)
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help="max sequence lengths (default: 128..4096 on CPU, 128..8192 on CUDA)")
    parser.add_argument("--skews", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None, help="rows per batch (default max(2*max_len, 1024))")
    parser.add_argument("--causal", action="store_true", help="causal self-attention")
    parser.add_argument("--window", type=int, default=None, help="sliding window size")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 3; 2 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="CI-sized: lengths 128 512, skewed only, 2 reps")
    parser.add_argument("--json", metavar="PATH", type=output_file, default=None, help="write the record to this path")


def run(args: argparse.Namespace) -> int:
    device = device_of(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.quick:
        args.lengths, args.skews = args.lengths or [128, 512], ["skewed"]
    args.reps = args.reps or (2 if args.quick else 3)
    for name in ("heads", "head_dim", "reps", "tokens", "window"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0 or (args.lengths and min(args.lengths) < 1):
        raise UsageError("--warmup must be >= 0 and every --lengths entry >= 1")
    lengths_sweep = args.lengths or (CUDA_LENGTHS if device.type == "cuda" else CPU_LENGTHS)
    kernels = args.kernels or [k for k in KERNELS if k != "reference"]
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise UsageError(f"unknown kernels {unknown}; valid: {', '.join(KERNELS)}")
    kernels = ["reference"] + [k for k in kernels if k != "reference"]
    rows, skipped = [], set()
    for max_len in lengths_sweep:
        for profile in args.skews:
            lengths = make_lengths(profile, max_len, args.tokens or max(2 * max_len, 1024), args.seed)
            for activation in args.activations:
                measured, cannot = compare_kernels(
                    lengths, kernels, activation, heads=args.heads, head_dim=args.head_dim, causal=args.causal,
                    window=args.window, device=device, dtype=dtype, warmup=args.warmup, reps=args.reps,
                    seed=args.seed)
                skipped.update((kernel, activation, reason) for kernel, reason in cannot)
                print(f"  L={max_len} {profile} {activation}: {', '.join(r['kernel'] for r in measured)}", flush=True)
                rows += [{"max_len": max_len, "profile": profile, "batch": len(lengths), "tokens": sum(lengths),
                          "activation": activation, **row} for row in measured]
    columns = ["max_len", "profile", "batch", "activation", "kernel", "fwd_ms", "fwdbwd_ms",
               "fwd_tflops", "fwdbwd_tflops", "exec_over_model", "peak_mib", "speedup_fwd", "speedup_fwdbwd"]
    mask = "causal" if args.causal else "full"
    if args.window:
        mask += f", window {args.window}"
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    print(format_table(rows, columns, title=f"attention on {device.type} ({dtype}{threads}), H={args.heads} "
                       f"D={args.head_dim}, {mask}; speed-ups over reference, TFLOP/s on real-length model FLOPs"))
    for kernel, activation, reason in sorted(skipped):
        print(f"skipped {kernel} ({activation}): {reason}")
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "func"}
        write_json(args.json, {"bench": "attention", "device": device.type, "dtype": str(dtype),
                               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "torch": torch.__version__, "threads": torch.get_num_threads(),
                               "config": config, "rows": rows,
                               "skipped": [{"kernel": k, "activation": a, "reason": r}
                                           for k, a, r in sorted(skipped)]})
    return 0
