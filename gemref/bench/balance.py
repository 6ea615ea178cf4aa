"""Load balancing across data-parallel ranks: imbalance and straggler wait per partition policy.

Projected (default): draw global batches of history lengths from a length profile, price
each sample with a SampleCost (model FLOPs of one training sample of the --preset model,
from gemref/mfu/flops.py, unless --cost gives coefficients), partition every
batch with each policy and report, per policy, the medians over batches of
  imbalance = max / mean per-rank cost   (1.0 = perfect)
  idle      = sum_r (max - cost_r) / (R * max), the share of rank-time spent waiting for
              the straggler at the gradient all-reduce
  plan_ms   = time of the partitioner itself (it runs on every rank, every step)
  lower_bound = max(dearest sample, mean) / mean: no partition of that batch can do better
(gemref/measure/balance_compare.py `compare`, the one comparison, computes them).

--measure: R one-thread gloo ranks run the real GEM training step on each global batch split
by round_robin and by kk in turn, the gradient all-reduce timed apart; the split prices samples
with model FLOPs as the training switch does, or with seconds fitted to this machine's measured
step times (--calibrate). Per rank: compute and all-reduce wait; per step: step time, imbalance
of compute wall and CPU time, idle share (gemref/measure/balance_policies.py says how; with
more ranks than free cores, read cpu_imbalance).
"""
from __future__ import annotations

import argparse
import os
import platform

from ..balance import SampleCost
from ..data.config import LENGTH_PROFILES
from ..train.presets import PRESETS, get_preset
from ..data.synthetic import draw_lengths
from ..env import versions
from ..errors import UsageError
from ..measure.balance_policies import (WARMUP_STEPS, calibrate_gem, calibration_record, measure_policies,
                                        projected_rows)
from ..mfu.flops import sample_cost_coefficients
from ..options import check_local_ranks, nonnegative_int, output_file, positive_float, positive_int
from ..report import format_table
from ..runtime.files import write_json


def configure_parser(p: argparse.ArgumentParser) -> None:
    small = get_preset("small")
    p.add_argument("--ranks", type=positive_int, default=8,
                   help="data-parallel ranks R (with --measure: gloo processes; at most 4 per core unless "
                        "GEMREF_MAX_RANKS=N)")
    p.add_argument("--batch", type=positive_int, default=512, help="global batch size (samples)")
    p.add_argument("--profile", choices=LENGTH_PROFILES, default="skewed")
    p.add_argument("--max-len", type=positive_int, default=small.model.max_len)
    p.add_argument("--median", type=positive_int, default=small.data.median_len,
                   help="median (skewed) / every (fixed) length")
    p.add_argument("--sigma", type=positive_float, default=small.data.len_sigma,
                   help="log-normal sigma of the skewed profile")
    p.add_argument("--batches", type=positive_int, default=20, help="global batches to evaluate (medians over them)")
    p.add_argument("--preset", default="small", choices=list(PRESETS),
                   help="model whose per-sample FLOPs price the samples")
    p.add_argument("--cost", type=float, nargs=3, metavar=("C0", "C1", "C2"),
                   help="override: cost per sample, per event, per event^2 (default: the preset's FLOPs)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--measure", action="store_true",
                   help="also run R gloo ranks on CPU: the --preset GEM training step, round_robin vs kk")
    p.add_argument("--steps-per-policy", type=positive_int, default=10,
                   help="--measure: measured steps per policy (after 2 warm-up)")
    p.add_argument("--calibrate", action="store_true",
                   help="--measure: split by seconds fitted to this machine's GEM step times, not by FLOPs")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def _draw(args, n: int, seed: int):
    """n history lengths from the --profile (its --max-len, --median, --sigma)."""
    return draw_lengths(args.profile, n, args.max_len, args.median, args.sigma, seed)


def _show(rows: list[dict]) -> list[dict]:
    """Ratios near 1 need 4 decimals to be told apart (format_table keeps 3 significant digits)."""
    keys = ("imbalance", "imbalance_worst", "idle", "speedup", "lower_bound", "cpu_imbalance")
    return [{k: f"{v:.4f}" if k in keys else v for k, v in row.items()} for row in rows]


def _measure(args, cost: SampleCost) -> tuple[dict | None, list[dict], list[dict]]:
    fit = calibrate_gem(args.preset, args.max_len, _draw(args, 4096, args.seed + 10_000), seed=args.seed) \
        if args.calibrate else None
    steps = [_draw(args, args.batch, args.seed + s) for s in range(WARMUP_STEPS + args.steps_per_policy)]
    per_rank, summary = measure_policies(args.preset, args.max_len, steps, fit.cost if fit else cost, args.ranks)
    return (calibration_record(fit) if fit else None), per_rank, summary


def run(args: argparse.Namespace) -> int:
    if args.batch < args.ranks:
        raise UsageError(f"--batch {args.batch} is smaller than --ranks {args.ranks}: every rank needs a sample")
    if args.median > args.max_len:
        raise UsageError(f"--median {args.median} exceeds --max-len {args.max_len}")
    if args.measure:
        check_local_ranks(args.ranks, "cpu")
    coefficients = args.cost or sample_cost_coefficients(get_preset(args.preset).model)
    cost = SampleCost(*coefficients)
    rows = projected_rows([_draw(args, args.batch, args.seed + b) for b in range(args.batches)], cost, args.ranks)
    print(format_table(_show(rows), title=f"projected: {args.ranks} ranks, global batch {args.batch}, {args.profile} "
                                   f"lengths (median {args.median}, max {args.max_len}), {args.batches} batches"))
    record = {"bench": "balance", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "cost_coefficients": list(coefficients), "projected": rows, "cpu_count": os.cpu_count(),
              "platform": platform.platform(), "versions": versions()}
    if args.measure:
        load_1min = os.getloadavg()[0]
        fit, per_rank, summary = _measure(args, cost)
        if fit:
            print(f"\ncalibrated GEM step cost (s): per_sample {fit['per_sample_s']:.3g}, per_token "
                  f"{fit['per_token_s']:.3g}, per_token^2 {fit['per_token_sq_s']:.3g}, per_step {fit['per_step_s']:.3g} "
                  f"(rel RMS error {fit['rel_rms_error']:.1%}, R^2 {fit['r2']:.3f})")
        else:
            print(f"\nsplit by model FLOPs per sample of the {args.preset} preset (as `gemref train --balance kk`)")
        if args.ranks + load_1min > (os.cpu_count() or 1):
            print(f"note: {args.ranks} ranks + load average {load_1min:.1f} on {os.cpu_count()} CPU cores: "
                  "wall times include time-sharing; read cpu_imbalance")
        print(format_table(per_rank, title=f"measured per rank: {args.preset} GEM step, max_len {args.max_len} "
                                           "(medians over steps)"))
        print(format_table(_show(summary), title="measured per step (medians over steps)"))
        record.update(calibration=fit, measured_per_rank=per_rank, measured=summary, load_avg_1min=load_1min)
    if args.json:
        write_json(args.json, record)
    return 0
