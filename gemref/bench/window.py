"""Sliding-window vs full causal history attention: FLOPs, peak memory, time as the history grows; the window's quality cost.

Attention: for every history length L of --lengths, a batch of --batch sequences of exactly L
events, --heads x --head-dim, causal self-attention through one gdpa kernel (--kernel, default
cpu_jagged) with no window and with --window W, forward+backward over --reps repetitions after
--warmup (gemref/mfu/attention_cost.py `window_sweep`: the columns and how each is measured).

Quality (--quality-seeds N, 0 skips): for each seed 0..N-1, two training runs of
--quality-preset (--quality-steps steps) without and with ModelConfig.window = --quality-window,
NE and AUC of both tasks on the preset's eval batches, and (N >= 2) the full runs' seed band
(gemref/measure/quality.py `quality_cost`). With N = 1 there is no band: one seed per variant.
"""
from __future__ import annotations

import argparse
import os

import torch

from ..attention import ACTIVATIONS, KERNELS
from ..train.presets import PRESETS, dataset_preset
from ..env import versions
from ..errors import UsageError
from ..mfu.attention_cost import window_sweep, window_takeaway
from ..options import add_dataset_arg, int_at_least, nonnegative_int, output_file, positive_int
from ..report import format_table
from ..runtime.files import write_json
from ..measure.quality import quality_cost

ATTENTION_COLUMNS = ("history_len", "variant", "model_gflop", "executed_gflop", "flops_vs_full", "peak_mib",
                     "wall_ms", "cpu_ms", "cpu_over_wall", "speedup")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", nargs="+", type=positive_int, default=None,
                   help="history lengths (default 512 1024 2048 4096; 256 512 1024 with --quick)")
    p.add_argument("--window", type=positive_int, default=256, help="sliding window W (events per query)")
    p.add_argument("--batch", type=positive_int, default=2, help="sequences per batch, each of the history length")
    p.add_argument("--heads", type=positive_int, default=2)
    p.add_argument("--head-dim", type=positive_int, default=32)
    p.add_argument("--activation", default="silu", choices=ACTIVATIONS)
    p.add_argument("--kernel", default="cpu_jagged", help="gdpa kernel (CPU)")
    p.add_argument("--warmup", type=nonnegative_int, default=1)
    p.add_argument("--reps", type=positive_int, default=None, help="timed repetitions per variant (default 5; 2 with --quick)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--quality-seeds", type=nonnegative_int, default=3,
                   help="training runs per variant for eval NE/AUC (0 skips; 1: no seed band)")
    p.add_argument("--quality-preset", default="tiny", choices=list(PRESETS))
    add_dataset_arg(p)
    p.add_argument("--quality-window", type=positive_int, default=8, help="the model's window in the quality runs")
    p.add_argument("--quality-steps", type=int_at_least(1), default=150)
    p.add_argument("--quick", action="store_true", help="CI-sized: lengths 256 512 1024, 2 reps, 1 quality seed of 40 steps")
    p.add_argument("--json", metavar="PATH", type=output_file, default=None, help="write the record here")


def run(args: argparse.Namespace) -> int:
    if args.kernel not in KERNELS:
        raise UsageError(f"--kernel {args.kernel!r}: valid: {', '.join(KERNELS)}")
    quality_preset = dataset_preset(args.quality_preset, args.dataset)
    max_len = quality_preset.model.max_len
    if args.quality_seeds and args.quality_window >= max_len:
        raise UsageError(f"--quality-window {args.quality_window} >= the {args.quality_preset} preset's max_len "
                         f"{max_len}" + (f" on dataset {args.dataset}" if args.dataset else "")
                         + ": that window is full attention")
    if args.quick:
        args.lengths = args.lengths or [256, 512, 1024]
        args.reps = args.reps or 2
        args.quality_seeds, args.quality_steps = min(args.quality_seeds, 1), min(args.quality_steps, 40)
    args.lengths, args.reps = args.lengths or [512, 1024, 2048, 4096], args.reps or 5
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows = window_sweep(args.lengths, args.window, batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                        activation=args.activation, kernel=args.kernel, warmup=args.warmup, reps=args.reps,
                        seed=args.seed)
    threads = torch.get_num_threads()
    print(format_table(rows, list(ATTENTION_COLUMNS),
                       title=f"causal {args.activation} attention, full vs window {args.window} ({args.kernel}, "
                             f"{args.batch} x L events, H={args.heads} D={args.head_dim}, {threads} threads): "
                             f"forward+backward, medians of {args.reps}; speedup = full / window time"))
    if load + threads > (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} + {threads} threads on {os.cpu_count()} cores: "
              "times include waiting for cores (read cpu_over_wall)")
    record = {"bench": "window", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "threads": threads, "cpu_count": os.cpu_count(), "load_avg_1min": load, "versions": versions(),
              "attention": rows, "quality": None}
    if args.quality_seeds:
        quality = quality_cost(quality_preset, args.quality_window, args.quality_seeds, args.quality_steps)
        record["quality"] = quality
        band = "seed band of the full runs" if args.quality_seeds >= 2 else "one seed per variant: no seed band"
        print(format_table(quality["summary"], title=f"quality: {args.quality_preset}, {args.quality_steps} steps, "
                                                     f"window {args.quality_window} vs full, {args.quality_seeds} "
                                                     f"seed(s); {band}"))
    print("\n".join(window_takeaway(rows, record["quality"])))
    if args.json:
        write_json(args.json, record)
    return 0
