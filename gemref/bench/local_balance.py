"""Local rebalancing (policy "local") against the global policies: simulated at scale, measured on gloo ranks.

Simulated (every --ranks entry): an epoch of --simulated-steps global batches of
--per-rank-batch x R history lengths from the --preset's skewed profile, priced in model FLOPs
and split by each of --policies (kk up to --kk-max-ranks); the heaviest rank-step's activation
bytes from a model fitted to the preset's measured bytes, unless --no-act-model.
--measure-ranks (default 2,4; 0 skips): R gloo ranks run the --measure-preset's training step
through the real sampler for every policy, interleaved. What each column means:
gemref/measure/local_balance.py.
"""
from __future__ import annotations

import argparse
import os

from ..balance import SAMPLER_POLICIES, SampleCost, check_policy
from ..train.presets import get_preset
from ..env import versions
from ..errors import UsageError
from ..measure.local_balance import SIM_COLUMNS, activation_model, measure, simulate
from ..mfu.flops import sample_cost_coefficients
from ..options import output_file
from ..report import format_table
from ..runtime.files import write_json


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated integers, got {text!r}") from None
    return values


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", default="8,64,256,1024", help="simulated rank counts (comma separated)")
    p.add_argument("--per-rank-batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--simulated-steps", type=int, default=64, help="steps in the simulated epoch")
    p.add_argument("--pool-steps", type=int, default=8, help='"local": steps a sample may move (its pool, k)')
    p.add_argument("--policies", default="round_robin,lpt,kk,local", help="policies (comma separated)")
    p.add_argument("--kk-max-ranks", type=int, default=256, help="run kk only up to this many simulated ranks")
    p.add_argument("--preset", default="small", help="lengths and per-sample FLOPs of this preset")
    p.add_argument("--no-act-model", action="store_true", help="skip the activation-bytes model (peak_act_mb)")
    p.add_argument("--measure-ranks", default="2,4", help="gloo rank counts to measure (0 skips)")
    p.add_argument("--measure-preset", default="tiny")
    p.add_argument("--measure-per-rank-batch", type=int, default=16)
    p.add_argument("--measure-steps", type=int, default=12, help="timed steps per policy")
    p.add_argument("--measure-warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    args.ranks, measure_ranks = _ints(args.ranks), [r for r in _ints(args.measure_ranks) if r]
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.policies:
        raise UsageError(f"--policies is empty: valid: {', '.join(SAMPLER_POLICIES)}")
    for p in args.policies:
        try:
            check_policy(p, SAMPLER_POLICIES)
        except ValueError as e:
            raise UsageError(f"--policies: {e}") from None
    for name in ("per_rank_batch", "simulated_steps", "pool_steps", "measure_per_rank_batch", "measure_steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.ranks or min(args.ranks + measure_ranks + [1]) < 1:
        raise UsageError("--ranks and --measure-ranks take integers >= 1 (--measure-ranks 0 skips)")
    cost = SampleCost(*sample_cost_coefficients(get_preset(args.preset).model))
    memory = None if args.no_act_model else activation_model(args.preset, seed=args.seed)
    sim = simulate(args.preset, args.ranks, args.policies, cost, memory, per_rank_batch=args.per_rank_batch,
                   steps=args.simulated_steps, pool_steps=args.pool_steps, kk_max_ranks=args.kk_max_ranks,
                   seed=args.seed)
    show = [{k: f"{v:.4f}" if isinstance(v, float) and k.startswith(("imb", "of_", "gap")) else v
             for k, v in row.items()} for row in sim]
    print(format_table(show, SIM_COLUMNS, title=f"simulated: {args.preset} lengths and FLOPs, {args.simulated_steps} steps of "
                                                f"{args.per_rank_batch} samples per rank, local pool {args.pool_steps} steps"))
    record = {"bench": "local_balance", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "simulated": sim, "activation_model": None if memory is None else
              [memory.per_sample, memory.per_token, memory.per_token_sq], "cpu_count": os.cpu_count(),
              "versions": versions()}
    measured = []
    for ranks in measure_ranks:
        load = os.getloadavg()[0]
        rows = measure(args.measure_preset, ranks, args.policies, per_rank_batch=args.measure_per_rank_batch,
                       steps=args.measure_steps, warmup=args.measure_warmup, pool_steps=args.pool_steps,
                       seed=args.seed)
        for row in rows:
            row["load_avg_1min"] = load
        measured += rows
        if ranks + load > (os.cpu_count() or 1):
            print(f"note: {ranks} ranks + load average {load:.1f} on {os.cpu_count()} cores: read cpu_imbalance")
    if measured:
        print(format_table(measured, title=f"measured on gloo ranks: {args.measure_preset} GEM step, "
                                           f"{args.measure_per_rank_batch} samples per rank, medians over "
                                           f"{args.measure_steps} steps"))
    record["measured"] = measured
    if args.json:
        write_json(args.json, record)
    return 0
