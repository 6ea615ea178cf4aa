"""Whole training steps in fp32 and bf16, interleaved: tokens/s, the speed-up with its interval, the loss against the fp32 seed band.

The run is the best single-process rung of the ladder (jagged, the fastest attention kernel
here, AutoAC; --compile adds the compile rung, whose plan this bench does not re-plan) in each
--precisions entry, the first the reference, built and stepped by
gemref/measure/precision_step.py: same seeds, same initial weights, the same batches, steps of
the precisions interleaved. The table gives each precision's median step, tokens/s, its
speed-up over the reference (median of paired-step ratios, p10..p90) and its mean eval loss
against the reference's seed band (gemref/report/seed_band.py, k standard errors). A CPU's
bf16 runs on its matrix engine where it has one (AMX; `gemref peak --dtype bf16` shows the
GEMM rates). Threads: --threads (default 1, the peak probe's).

--d-model W [W ...] runs the comparison at each model width (the preset's architecture with
d_model = W, its heads kept, so head dim = W / heads): what bf16 gives depends on how much of
a step its GEMMs are, and at the small preset's width (64) a GEMM is too small a call for the
matrix engine to pay for the per-call and per-op costs around it.
"""
from __future__ import annotations

import argparse
import logging

import torch

from ..precision.config import PRECISIONS
from ..train.presets import PRESETS, dataset_preset
from ..train.override import override
from ..env import cpu_info, versions
from ..runtime.files import write_json
from ..mfu.cpu_probe import CONTENDED_BELOW   # process CPU / (wall x threads) below it: the run waited for cores
from ..options import add_dataset_arg, add_device_arg, int_at_least, nonnegative_int, output_file, positive_int
from ..measure.precision_step import compare_step_precisions, preset_at_width, speedup_text
from ..report import format_table
from ..report.seed_band import K_SE

COLUMNS = ("precision", "median_step_s", "tokens_per_s", "speedup", "speedup_p10", "speedup_p90", "eval_loss_mean",
           "eval_loss_sd", "loss_difference", "loss_tolerance", "within_band", "cpu_over_wall")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    add_device_arg(p)
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                   default=["fp32", "bf16"], help="the first is the reference")
    p.add_argument("--batch-size", type=positive_int, help="samples per step (default: the preset's)")
    p.add_argument("--d-model", type=positive_int, nargs="+", metavar="W",
                   help="model widths to compare at (default: the preset's); heads kept, head dim = W / heads")
    p.add_argument("--ac", choices=("none", "auto"), default="auto", help="activation checkpointing (rung 4)")
    p.add_argument("--compile", action="store_true", help="also the compile rung (every region)")
    p.add_argument("--seeds", type=int_at_least(2), default=3, help="seeds 0..N-1: the loss band's runs")
    p.add_argument("--steps-per-seed", type=positive_int, default=12, help="timed steps per seed and precision")
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first")
    p.add_argument("--eval-batches", type=positive_int, default=4, help="eval batches per run (the loss)")
    p.add_argument("--k", type=float, default=K_SE, help="the band's width in standard errors")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    logging.getLogger("gemref.precision.apply").setLevel(logging.ERROR)
    base = dataset_preset(args.preset, args.dataset)
    widths = args.d_model or [base.model.d_model]
    presets = [preset_at_width(base, w) for w in widths]           # every width checked before any run
    info = cpu_info()
    cpu = f"{info.model_name} (family {info.family} model {info.model})"
    records = []
    for preset in presets:
        train = override(preset.train, jagged=True, kernel="auto", ac=args.ac, compile=args.compile, eval_every=0,
                         batch_size=args.batch_size or preset.train.batch_size)
        result = compare_step_precisions(preset, train, tuple(args.precisions), seeds=list(range(args.seeds)),
                                         steps=args.steps_per_seed, warmup=args.warmup,
                                         eval_batches=args.eval_batches, device=args.device, k=args.k)
        where = (f"{preset.name} (d_model {preset.model.d_model}, head dim {preset.model.head_dim}), jagged, kernel "
                 f"auto, ac {args.ac}{', compiled' if args.compile else ''}, batch {train.batch_size}, {args.seeds} "
                 f"seeds x {args.steps_per_seed} steps; {cpu} ({torch.get_num_threads()} thread(s))")
        print(format_table(result.rows, COLUMNS, title=f"training steps per precision, interleaved: {where}"))
        for row in result.rows[1:]:
            print(f"{row['precision']} over {result.reference}: {speedup_text(row)} step speed-up (median of paired "
                  f"steps, p10..p90); eval loss {'within' if row['within_band'] else 'OUTSIDE'} the "
                  f"{result.reference} seed band ({row['loss_difference']:+.4f} vs +-{row['loss_tolerance']:.4f})")
        if any(r["cpu_over_wall"] < CONTENDED_BELOW * torch.get_num_threads() for r in result.rows):
            print("note: process CPU / wall below 90% of the threads: the machine was contended, times are not final")
        records.append({"d_model": preset.model.d_model, "head_dim": preset.model.head_dim,
                        "batch_size": train.batch_size, **result.as_record()})
    if args.json:
        write_json(args.json, {"bench": "precision_step", "preset": base.name, "ac": args.ac, "compile": args.compile,
                               "steps": args.steps_per_seed, "warmup": args.warmup, "cpu": cpu,
                               "threads": torch.get_num_threads(), "versions": versions(), "widths": records})
        print(f"wrote {args.json}")
    return 0
