"""Eager vs torch.compile (regional) side by side: step time, compile time, recompiles, MFU.

Two models with the same weights train on the same jagged batches, alternating step by step
and swapping who goes first, so drift in a shared machine's load hits both alike. The
compiled model compiles during its first step: that time is reported as compile time, never
as step time. After --warmup steps each, --steps timed steps: median step time (p10..p90),
vs_eager (the median over batches of compiled/eager step time on the same batch: batches
differ in rows and longest history, so their times spread more than the variants differ),
MFU of each, graphs compiled, and recompiles after warm-up.

First, the region plan (gemref/compile/plan.py plan_gemref_regions; attention runs the same kernel
either way, so this is what compile changes): forward+backward time of each region kind of
layer 0 and of the loss, eager vs compiled, medians of --region-reps interleaved calls on the
first batch; the kinds compiled faster by more than the plan's margin are kept. The steps then
compare three variants: eager, every region compiled, and only the plan's regions compiled
(what the waterfall's compile rung runs). Before both, the fixed cost of one compiled call
(gemref/compile/plan.py call_overhead: a trivial region compiled vs eager, forward+backward).
"""
from __future__ import annotations

import argparse
import platform
from dataclasses import asdict

import torch

from ..options import add_dataset_arg, add_device_arg, int_at_least, output_file, positive_int
from ..train.presets import PRESETS, dataset_preset
from ..compile.plan import call_overhead
from ..report import format_table
from ..runtime.files import write_json
from ..env import versions
from ..measure.bench import make_bench
from ..measure.compile_steps import STEP_COLUMNS, compare_steps, region_plan

def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=positive_int, help="samples per step (default: the preset's)")
    p.add_argument("--steps-per-variant", type=positive_int, default=8,
                   help="timed steps of eager and of compiled (median reported)")
    p.add_argument("--warmup", type=int_at_least(1), default=2,
                   help="untimed steps first (>= 1: the first compiled step compiles)")
    p.add_argument("--region-reps", type=positive_int, default=5, help="calls per region timing")
    add_device_arg(p)
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    b = make_bench(dataset_preset(args.preset, args.dataset), batch_size=args.batch_size,
                   steps=args.steps_per_variant, warmup=args.warmup, device=args.device)
    overhead = call_overhead()
    plan = region_plan(b, args.region_reps)
    steps = compare_steps(b, plan.kept)
    steps.pop("models")
    regions = plan.rows
    where = f"{b.preset.name}, jagged, kernel {b.s.kernel}, batch {b.train.batch_size}, {b.device.type} " \
            f"({torch.get_num_threads()} threads)"
    print(format_table(steps["rows"], STEP_COLUMNS, title=f"eager vs compiled training steps: {where}"))
    print(format_table(regions, title=f"the region plan: each region alone, forward + backward (layer 0), kept if "
                                      f"compiled is > {plan.margin:.0%} faster"))
    print(f"compiled/eager step time {steps['ratio']:.3f}, the plan's regions only "
          + (f"{steps['planned_ratio']:.3f} ({plan.regions_text()})" if plan.kept else "n/a (no region won)")
          + f"; compile {steps['compile']['compile_s']:.1f} s once; "
          f"recompiles after warm-up: {steps['rows'][1]['recompiles_after_warmup']}; a compiled call's fixed cost "
          f"(a trivial region, forward+backward) {1e3 * overhead['overhead_s']:.3f} ms")
    if args.json:
        write_json(args.json, {"kind": "bench_compile", "preset": b.preset.name,
                               "data": asdict(b.preset.data), "batch_size": b.train.batch_size,
                               "kernel": b.s.kernel, "steps": args.steps_per_variant, "warmup": args.warmup,
                               "device": {"type": b.device.type, "threads": torch.get_num_threads(),
                                          "machine": platform.machine()},
                               "versions": versions(),
                               **steps, "regions": regions, "plan": list(plan.kept), "plan_margin": plan.margin,
                               "call_overhead": overhead})
        print(f"wrote {args.json}")
    return 0
