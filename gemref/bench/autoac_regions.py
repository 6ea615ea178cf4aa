"""Per-region AutoAC with compressed saved activations: fronts, memory, batch, step time, loss parity.

1. fronts: the --preset model is profiled on one batch (gemref/measure/autoac_regions.py: every block's
   save_matmuls / full / compressed options, bytes measured as in gemref/autoac/profile.py). At
   every budget (a fraction of the no-AC activation bytes) three strategies:
     uniform   one fraction for every region (PyTorch 2's activation_memory_budget style)
     joint     per-region budgets solved together (AutoAC, gemref/autoac/plan.py)
     joint+C   the same with "compressed" as a fourth option per region
   with predicted activation bytes and recompute FLOPs in % of the step's model FLOPs; the
   record holds each strategy's whole Pareto front (bytes, FLOPs, plan).
2. memory: per format, activation bytes of a step with every block compressed (measured)
   against none, and the hooks' own count (bytes of compressed tensors, bytes stored).
3. batch: the largest batch whose activations fit the no-AC bytes of --batch-size, without
   and with compression (`measure.batch_search.find_batch_size` called on the plain model and on
   the model under `activation_compression.compressing`, which compresses the whole forward,
   attention's saved tensors included: right for the pointwise attention of every preset).
4. step time: training steps of the plain model and of every-block-compressed models,
   interleaved on the same batches (gemref/measure/bench.py paired_steps), medians and ratios.
5. parity: --parity-seeds real training runs of --parity-steps steps (the preset's data,
   jagged, kernel auto) with and without compression; eval loss per seed, the paired
   difference, and the uncompressed runs' seed-to-seed range (the band it should stay in).
The measurements are gemref/measure/autoac_regions.py (and autoac_batch.py for the batch).
CPU timings on a shared machine are noisy: read ratios within one run.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict

import torch

from ..activation_compression import FORMATS, CompressionSpec
from ..train.presets import dataset_preset
from ..env import versions
from ..errors import UsageError
from ..measure.autoac_batch import batch_search
from ..measure.autoac_regions import fronts, memory, parity, step_times
from ..measure.bench import make_bench
from ..options import add_dataset_arg, output_file
from ..report import format_table
from ..runtime.files import write_json

DEFAULT_BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=int, help="samples per step (default: the preset's)")
    p.add_argument("--format", default="mxfp8", choices=FORMATS, help="compression of the fronts, batch, parity")
    p.add_argument("--formats", default=",".join(FORMATS), help="formats of the memory and step-time tables")
    p.add_argument("--budgets", default=",".join(str(x) for x in DEFAULT_BUDGETS))
    p.add_argument("--steps-per-variant", type=int, default=6, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-batch", type=int, help="batch search cap (default: 8 x the batch size)")
    p.add_argument("--no-batch-search", action="store_true")
    p.add_argument("--parity-seeds", type=int, default=3, help="training runs per variant (0 skips)")
    p.add_argument("--parity-steps", type=int, default=150)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args) -> int:
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or set(formats) - set(FORMATS):
        raise UsageError(f"--formats {args.formats!r}: valid: {', '.join(FORMATS)}")
    try:
        budgets = tuple(float(x) for x in args.budgets.split(","))
    except ValueError:
        raise UsageError(f"--budgets takes comma-separated fractions, got {args.budgets!r}") from None
    if not budgets or not all(0.0 < f <= 1.0 for f in budgets):
        raise UsageError(f"--budgets are fractions in (0, 1], got {args.budgets}")
    if (args.steps_per_variant < 1 or args.warmup < 0 or args.parity_seeds < 0 or args.parity_steps < 1
            or args.parity_seeds == 1):
        raise UsageError("need --steps-per-variant >= 1, --warmup >= 0, --parity-seeds 0 (skip) or >= 2 (a seed band), "
                         "--parity-steps >= 1")
    log = lambda s: print(s, flush=True)   # noqa: E731
    spec = CompressionSpec(args.format)
    b = make_bench(dataset_preset(args.preset, args.dataset), batch_size=args.batch_size, steps=args.steps_per_variant,
                   warmup=args.warmup, device="cpu")
    log("profiling every region (save_matmuls, full, compressed) ...")
    front = fronts(b, spec, budgets)
    print(format_table(front["rows"], title=f"fronts: {b.preset.name}, batch {b.train.batch_size}, {args.format}, "
                                            f"no-AC activations {front['base_bytes'] / 2**20:.2f} MiB; joint no worse "
                                            f"than uniform at {front['joint_no_worse_at']}"))
    record = {"kind": "bench_autoac_regions", "preset": b.preset.name, "data": asdict(b.preset.data),
              "batch_size": b.train.batch_size,
              "format": args.format, "threads": torch.get_num_threads(), "versions": versions(), "fronts": front}
    record["memory"] = memory(b, formats)
    print(format_table(record["memory"], ("format", "act_mb", "vs_none", "compressed_mb", "stored_mb",
                                          "tensors_compressed", "tensors_kept"),
                       title="activation bytes, every block compressed (measured; the hooks' own count)"))
    if not args.no_batch_search:
        log("searching batch sizes ...")
        record["batch"] = batch_search(b, spec, args.max_batch or 8 * b.train.batch_size)
        print(format_table(record["batch"]["rows"], title=f"largest batch under "
                                                          f"{record['batch']['budget_bytes'] / 2**20:.2f} MiB"))
    record["step_time"] = step_times(b, formats)
    print(format_table(record["step_time"], title=f"step time, interleaved with the plain model "
                                                  f"({args.steps_per_variant} steps after {args.warmup} warm-up)"))
    if args.parity_seeds:
        record["parity"] = parity(b.preset, spec, args.parity_seeds, args.parity_steps, log=log)
        par = record["parity"]
        print(format_table(par["rows"], title=f"eval loss after {args.parity_steps} steps"))
        print(f"mean difference {par['mean_difference']:+.4f}, uncompressed seed band {par['seed_band']:.4f}: "
              f"{'within' if par['within_band'] else 'OUTSIDE'} the band")
    if args.json:
        write_json(args.json, record)
    return 0
