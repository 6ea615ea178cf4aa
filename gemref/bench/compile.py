"""Eager vs torch.compile (regional) side by side: step time, compile time, recompiles, MFU.

Two models with the same weights train on the same jagged batches, alternating step by step
and swapping who goes first, so drift in a shared machine's load hits both alike. The
compiled model compiles during its first step: that time is reported as compile time, never
as step time. After --warmup steps each, --steps timed steps: median step time (p10..p90),
vs_eager (the median over batches of compiled/eager step time on the same batch: batches
differ in rows and longest history, so their times spread more than the variants differ),
MFU of each, graphs compiled, and recompiles after warm-up.

Then the dense regions alone (attention runs the same kernel in both, so this is what
compile changes): forward+backward time of each region kind of layer 0, eager vs compiled,
medians of --region-reps calls on the first batch's shapes.
"""
from __future__ import annotations

import argparse
import platform
import statistics
from dataclasses import asdict

import torch

from ..options import add_dataset_arg, add_device_arg, int_at_least, output_file, positive_int
from ..config import PRESETS
from ..data.folder import dataset_preset
from ..compile import REGION_KINDS, compile_stats, region_inputs, run_region
from ..mfu.meter import percentile
from ..mfu.timing import interleaved, stopwatch
from ..report import format_table
from ..files import write_json
from ..env import versions
from ..train import forward_loss
from .autoac import Bench, Trainer, make_bench, run_mfu, strategy_model

STEP_COLUMNS = ("variant", "median_step_s", "p10_step_s", "p90_step_s", "vs_eager", "mfu", "compile_s", "graphs",
                "recompiles_after_warmup")


def compare_steps(b: Bench) -> dict:
    """Interleaved training steps of an eager and a compiled model on the same batches
    (gemref/mfu/timing.py interleaved, alternating who goes first)."""
    models = {"eager": strategy_model(b, "none", compiled=False), "compiled": strategy_model(b, "none", compiled=True)}
    trainers = {name: Trainer(b, model) for name, model in models.items()}
    stats = compile_stats(models["compiled"])
    after_warmup = []

    def step(name: str, k: int):
        if k == b.warmup and not after_warmup:          # the first timed round: compilation is behind us
            after_warmup.append((stats.graphs, stats.recompiles))
        return trainers[name].step(b.batches[k])

    records = interleaved({name: (lambda k, name=name: step(name, k)) for name in trainers},
                          len(b.batches) - b.warmup, warmup=b.warmup, alternate=True)
    seconds = {name: [r.step_s for r in rs] for name, rs in records.items()}
    after_warmup = after_warmup[0]
    rows = []
    for name, s in seconds.items():
        rows.append({"variant": name, "median_step_s": statistics.median(s), "p10_step_s": percentile(s, 0.1),
                     "p90_step_s": percentile(s, 0.9), "mfu": run_mfu(b, records[name]), "steps_s": s})
    paired = statistics.median(c / e for c, e in zip(seconds["compiled"], seconds["eager"]))
    rows[0]["vs_eager"], rows[1]["vs_eager"] = 1.0, paired
    rows[1].update(compile_s=stats.compile_seconds, graphs=stats.graphs,
                   recompiles_after_warmup=stats.recompiles - after_warmup[1],
                   graphs_after_warmup=stats.graphs - after_warmup[0])
    return {"rows": rows, "ratio": paired,
            "compile": stats.as_record(), "models": models}


def compare_regions(b: Bench, models: dict, reps: int = 5) -> list[dict]:
    """Forward+backward seconds of each region kind (layer 0), eager vs compiled, interleaved."""
    eager = models["eager"]
    inputs = region_inputs(eager, lambda: forward_loss(eager, b.batches[0], b.autocast))
    rows = []
    for name, (block_name, method) in REGION_KINDS.items():
        def timed(variant: str, name=name, block_name=block_name, method=method) -> float:
            fn = getattr(getattr(models[variant].layers[0], block_name), method)
            with stopwatch(b.device) as elapsed:
                run_region(fn, inputs[name])
            return elapsed[0]

        samples = interleaved({v: (lambda k, v=v: timed(v)) for v in ("eager", "compiled")}, reps, warmup=1)
        timing = {v: statistics.median(t) for v, t in samples.items()}
        stats = compile_stats(models["compiled"])
        rows.append({"region": name, "eager_ms": 1e3 * timing["eager"], "compiled_ms": 1e3 * timing["compiled"],
                     "speedup": timing["eager"] / timing["compiled"],
                     "compile_s": stats.region_seconds.get(name) if stats else None})
    return rows


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
    steps = compare_steps(b)
    regions = compare_regions(b, steps.pop("models"), args.region_reps)
    where = f"{b.preset.name}, jagged, kernel {b.s.kernel}, batch {b.train.batch_size}, {b.device.type} " \
            f"({torch.get_num_threads()} threads)"
    print(format_table(steps["rows"], STEP_COLUMNS, title=f"eager vs compiled training steps: {where}"))
    print(format_table(regions, title="dense regions alone (forward + backward, layer 0)"))
    print(f"compiled/eager step time {steps['ratio']:.3f}; compile {steps['compile']['compile_s']:.1f} s once; "
          f"recompiles after warm-up: {steps['rows'][1]['recompiles_after_warmup']}")
    if args.json:
        write_json(args.json, {"kind": "bench_compile", "preset": b.preset.name,
                               "data": asdict(b.preset.data), "batch_size": b.train.batch_size,
                               "kernel": b.s.kernel, "steps": args.steps_per_variant, "warmup": args.warmup,
                               "device": {"type": b.device.type, "threads": torch.get_num_threads(),
                                          "machine": platform.machine()},
                               "versions": versions(),
                               **steps, "regions": regions})
        print(f"wrote {args.json}")
    return 0
