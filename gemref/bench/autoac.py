"""AutoAC against the alternatives under activation-memory budgets: bytes, recompute, step time, MFU.

For each budget (a fraction of the activation bytes of a step with nothing checkpointed),
four strategies side by side on the same batches (jagged histories, the auto attention kernel):
  none  nothing checkpointed: the reference (the same row at every budget)
  full  every block fully checkpointed: the classic recipe (the same row at every budget)
  auto  AutoAC: the plan of least measured recompute time that fits the budget
        (gemref/autoac/plan.py, objective "time")
  memory_budget  torch.compile with torch._functorch.config.activation_memory_budget = the budget
The measurement is gemref/measure/autoac_sweep.py (and autoac_batch.py for --find-batch).
Columns: activation bytes on the first batch (gemref/autoac/profile.py; with --compile on CPU the
checkpointed strategies are measured on their eager twin), their share of the eager no-AC
bytes, whether they fit the budget, recompute FLOPs (FlopCounterMode: backward FLOPs minus
the eager no-AC backward's) in % of the step's model FLOPs, the median of --steps timed
training steps after --warmup, its ratio to none's, MFU, and HFU (= MFU x executed/model
FLOPs of the first batch, recompute counted as executed).

Then the head-to-head at a 50% budget: AutoAC by time, AutoAC by FLOPs and full checkpointing,
their steps interleaved round by round on the same batches, median seconds and the median
per-round ratio to full checkpointing (a plan that is all "full" is labelled as such).

--find-batch: the largest batch that fits a memory budget without and with AutoAC (default:
the memory the no-AC step needs at --batch-size; CPU: activation bytes, CUDA: peak device
memory), then both are timed side by side: what the freed memory bought. The gain is credited
to the plan that ran (full checkpointing when AutoAC's plan is all "full"), and a batch at the
search's cap is reported as the cap, not as what fits.

Timings on a shared machine are noisy: compare ratios within one run and read medians.
"""
from __future__ import annotations

import argparse
import platform
from dataclasses import asdict

import torch

from ..train.presets import PRESETS, dataset_preset
from ..env import versions
from ..errors import UsageError
from ..measure.autoac_batch import GAIN_COLUMNS, batch_gain
from ..measure.autoac_sweep import DEFAULT_BUDGETS, HEAD_COLUMNS, SWEEP_COLUMNS, budget_sweep
from ..measure.bench import make_bench
from ..options import add_dataset_arg, add_device_arg, nonnegative_int, output_file, positive_int
from ..report import format_table
from ..runtime.files import write_json


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=positive_int, help="samples per step (default: the preset's)")
    p.add_argument("--budgets", default=",".join(str(x) for x in DEFAULT_BUDGETS),
                   help="activation budgets, fractions of the no-AC bytes (comma separated)")
    p.add_argument("--steps-per-strategy", type=positive_int, default=3,
                   help="timed steps per strategy and budget (median reported)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed steps before them")
    add_device_arg(p)
    p.add_argument("--compile", action="store_true", help="compile none/full/auto too (AutoAC: none|full)")
    p.add_argument("--no-memory-budget", "--no-pt2", dest="no_memory_budget", action="store_true",
                   help="skip PyTorch 2's activation_memory_budget strategy (memory_budget; --no-pt2: its old name)")
    p.add_argument("--find-batch", action="store_true", help="also: largest batch per strategy under a budget")
    p.add_argument("--memory-budget-mb", type=float, help="--find-batch budget (default: the no-AC step's)")
    p.add_argument("--max-batch", type=positive_int, help="--find-batch search cap (default: 16 x the batch size)")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        budgets = tuple(float(x) for x in args.budgets.split(","))
    except ValueError:
        raise UsageError(f"--budgets takes comma-separated fractions, got {args.budgets!r}") from None
    if not all(0.0 < f <= 1.0 for f in budgets):
        raise UsageError(f"--budgets are fractions in (0, 1], got {args.budgets}")
    if args.memory_budget_mb is not None and not args.memory_budget_mb > 0:
        raise UsageError(f"--memory-budget-mb must be > 0, got {args.memory_budget_mb}")
    b = make_bench(dataset_preset(args.preset, args.dataset), batch_size=args.batch_size,
                   steps=args.steps_per_strategy, warmup=args.warmup, device=args.device, compile=args.compile)
    log = lambda s: print(s, flush=True)   # noqa: E731
    sweep = budget_sweep(b, budgets, memory_budget=not args.no_memory_budget, log=log)
    title = (f"AutoAC bench: {b.preset.name}, batch {b.train.batch_size}, kernel {b.s.kernel}, "
             f"compile={b.train.compilation.enabled}, {b.device.type} ({torch.get_num_threads()} threads), "
             f"no-AC activations {sweep['profile']['base_bytes'] / 2**20:.1f} MiB ({sweep['profile']['method']})")
    print(format_table(sweep["rows"], SWEEP_COLUMNS, title=title))
    if sweep["done_when"]:
        d = sweep["done_when"]
        print(f"at a 50% budget AutoAC recomputes {d['auto_recompute_pct']:.2f}% of model FLOPs, full AC "
              f"{d['full_recompute_pct']:.2f}% (ratio {d['auto_over_full']:.3f}); by FLOPs AutoAC's plan "
              f"{d['flops_plan']} would recompute {d['flops_plan_over_full']:.3f} of full's (target <= 0.5: "
              f"{'met' if d['met'] else 'NOT met'})")
    head = sweep["head_to_head"]
    if head and "rows" in head:
        print(format_table(head["rows"], HEAD_COLUMNS,
                           title=f"at a {head['budget']:.0%} budget, interleaved over {head['rounds']} rounds "
                                 f"(medians; vs_full = median per-round ratio to full checkpointing)"))
    elif head:
        print(f"no head-to-head at a {head['budget']:.0%} budget: {head['impossible']}")
    record = {"kind": "bench_autoac", "preset": b.preset.name, "data": asdict(b.preset.data),
              "batch_size": b.train.batch_size,
              "kernel": b.s.kernel, "compile": b.train.compilation.enabled, "steps": args.steps_per_strategy, "warmup": args.warmup,
              "device": {"type": b.device.type, "threads": torch.get_num_threads(), "machine": platform.machine()},
              "versions": versions(),
              "peak_flops": b.peak, **sweep}
    if args.find_batch:
        budget = int(args.memory_budget_mb * 2**20) if args.memory_budget_mb else None
        gain = batch_gain(b, budget, args.max_batch, log=log)
        print(format_table(gain["rows"], GAIN_COLUMNS,
                           title=f"largest batch under {gain['memory_budget_bytes'] / 2**20:.1f} MiB "
                                 f"({gain['measure']})"))
        who = "full checkpointing (AutoAC's plan at that batch)" if gain["full_checkpointing"] else "AutoAC"
        print(f"{who} fits {'at least ' if gain['capped'] else ''}{gain['batch_ratio']:.2f}x the batch"
              + (f" (the search's cap, {gain['search_cap']}, not a measured limit)" if gain["capped"] else "")
              + f": {gain['samples_per_s_ratio']:.2f}x samples/s"
              + (f", MFU {100 * gain['mfu_gain']:+.2f} points" if gain["mfu_gain"] is not None else ""))
        record["find_batch"] = gain
    if args.json:
        write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0
