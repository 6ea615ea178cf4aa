"""Native vs TorchRec embedding tables: step time and table bytes per rank, interleaved on gloo ranks.

R one-thread gloo ranks (mesh Rx1: the dense layers replicated by DDP in both variants) build
the --preset model twice: `native` (nn.Embedding tables, replicated, AdamW) and `torchrec`
(sharded by DMP with --sharding, fused exact Adagrad), and train them in interleaved windows
(--windows of --steps-per-window steps each, after one warm-up window). The measurement and its
columns: gemref/measure/table_engines.py `compare_engines`.
"""
from __future__ import annotations

import argparse
import os

from ..train.presets import get_preset
from ..env import versions
from ..errors import UsageError
from ..measure.table_engines import compare_engines
from ..options import output_file
from ..report import format_table
from ..runtime.files import write_json


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny")
    p.add_argument("--ranks", type=int, default=2, help="gloo ranks (one thread each)")
    p.add_argument("--per-rank-batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--windows", type=int, default=5, help="timed windows per variant (after one warm-up window)")
    p.add_argument("--steps-per-window", type=int, default=4)
    p.add_argument("--sharding", default="auto", help="TorchRec sharding: auto (the planner) or one type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    from ..parallel.config import TORCHREC_SHARDINGS
    from ..interop.lib import torchrec

    for name in ("ranks", "per_rank_batch", "windows", "steps_per_window"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sharding not in TORCHREC_SHARDINGS:
        raise UsageError(f"--sharding {args.sharding!r}; valid: {', '.join(TORCHREC_SHARDINGS)}")
    get_preset(args.preset)
    torchrec()                   # a missing TorchRec is one line here, before any rank starts
    load = os.getloadavg()[0]
    result = compare_engines(args.preset, args.ranks, args.sharding, per_rank_batch=args.per_rank_batch,
                             windows=args.windows, steps_per_window=args.steps_per_window, seed=args.seed)
    rows, plan = result["rows"], result["plan"]
    print(format_table(rows, title=f"native vs TorchRec tables: {args.preset}, {args.ranks} gloo ranks, "
                                   f"{args.per_rank_batch} samples per rank, medians of {args.windows} windows x "
                                   f"{args.steps_per_window} steps (A B / B A)"))
    print(format_table([{"table": t, **v} for t, v in plan.items()], title=f"TorchRec plan ({args.sharding})"))
    if args.ranks + load > (os.cpu_count() or 1):
        print(f"note: {args.ranks} ranks + load average {load:.1f} on {os.cpu_count()} cores: times include sharing")
    if args.json:
        write_json(args.json, {"bench": "embeddings", "config": {k: v for k, v in vars(args).items() if k != "func"},
                               "rows": rows, "plan": plan, "load_avg_1min": load, "cpu_count": os.cpu_count(),
                               "versions": versions()})
    return 0
