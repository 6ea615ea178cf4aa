"""Attention kernels side by side: time, TFLOP/s, peak memory, speed-up vs reference.

For every max length (--lengths), length profile (--skews), activation and kernel, one row of
gemref/mfu/attention_cost.py `compare_kernels`: forward and forward+backward median wall time,
TFLOP/s on the real-length model FLOPs, executed/model FLOPs, peak memory, and the speed-up
over the reference measured in the same run on the same batch. The batches' lengths are
gemref/data/lengths.py `make_lengths` (fixed, uniform, skewed; deterministic from --seed),
each about --tokens rows (default max(2 * max_len, 1024)). On an oversubscribed CPU pass
--threads (e.g. 1).
"""
from __future__ import annotations

import argparse

import torch

from ..attention import ACTIVATIONS, KERNELS
from ..data.lengths import LENGTH_PROFILES, make_lengths
from ..errors import UsageError
from ..mfu.attention_cost import compare_kernels
from ..options import add_device_arg, device_of, output_file
from ..report import format_table
from ..runtime.files import write_json

CPU_LENGTHS = (128, 512, 2048, 4096)
CUDA_LENGTHS = (128, 512, 1024, 2048, 4096, 8192)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_device_arg(parser)
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="kernels to compare (default: every kernel that can run here; reference is always added)")
    parser.add_argument("--activations", nargs="+", default=["softmax", "silu"], choices=ACTIVATIONS)
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help="max sequence lengths (default: 128..4096 on CPU, 128..8192 on CUDA)")
    parser.add_argument("--skews", nargs="+", default=list(LENGTH_PROFILES), choices=LENGTH_PROFILES)
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
