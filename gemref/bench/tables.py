"""Sharded tables' optimizer and replica sync interval: comm bytes and exposed time per step, eval loss/NE over seeds.

On R*S one-thread gloo ranks (--mesh, default 2x2), the --preset trained --seeds times per variant:
AdamW tables at the dense lr with summed replica gradients, and row-wise Adagrad and row-wise Adam
(fbgemm's partial row-wise Adam) at --table-lr with the replicas averaged every N steps for N in
--intervals (DMPCollection's sync interval); --optimizers picks a subset; --jagged and --kernel run
attention as `gemref train` does (rungs 1-2: the same arithmetic, many times faster on the small
preset). What each column is:
gemref/measure/table_sync.py `compare_table_sync`.
"""
from __future__ import annotations

import argparse
from ..train.config import switch_fields
from ..train.presets import PRESETS
from ..env import cpu_info, versions
from ..errors import UsageError
from ..measure.table_sync import compare_table_sync
from ..options import int_at_least, output_file, positive_float
from ..parallel.config import TABLE_LR, TABLE_OPTIMIZERS
from ..report import format_table
from ..runtime.files import write_json


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", choices=list(PRESETS))
    p.add_argument("--mesh", default="2x2", help="RxS with R >= 2 (replica groups x shards)")
    p.add_argument("--intervals", default="1,10,100", help="comma-separated table_sync_interval values")
    p.add_argument("--seeds", type=int_at_least(2), default=3, help="runs per variant (a seed band)")
    p.add_argument("--optimizers", default=",".join(TABLE_OPTIMIZERS),
                   help=f"comma-separated table optimizers to compare ({', '.join(TABLE_OPTIMIZERS)})")
    p.add_argument("--table-lr", type=positive_float, default=TABLE_LR, help="the row-wise tables' learning rate (adamw "
                   "tables train at the preset's lr)")
    jagged, kernel = (switch_fields()[name][1] for name in ("jagged", "kernel"))    # gemref train's switches
    p.add_argument("--jagged", action="store_true", help=jagged.metadata["help"])
    p.add_argument("--kernel", default=kernel.default, choices=kernel.metadata["choices"], help=kernel.metadata["help"])
    p.add_argument("--steps-per-run", type=int_at_least(1), default=100, help="training steps of each run")
    p.add_argument("--window", type=int_at_least(1), default=100, help="last steps of a run measured (comm)")
    p.add_argument("--eval-batches", type=int_at_least(1), default=8)
    p.add_argument("--timeout-s", type=positive_float, default=3600.0,
                   help="seconds the whole bench (and any one collective) may take before every rank is stopped")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    try:
        intervals = tuple(int(n) for n in args.intervals.split(",") if n.strip())
    except ValueError:
        raise UsageError(f"--intervals {args.intervals!r}: comma-separated integers, e.g. 1,10,100") from None
    optimizers = tuple(o.strip() for o in args.optimizers.split(",") if o.strip())
    ran = versions()        # the tree the run started from (read now: the tree may change during a long run)
    result = compare_table_sync(args.preset, args.mesh, intervals, seeds=args.seeds, steps=args.steps_per_run,
                                window=args.window, eval_batches=args.eval_batches, optimizers=optimizers,
                                table_lr=args.table_lr, attention={"jagged": args.jagged, "kernel": args.kernel},
                                timeout_s=args.timeout_s)
    print(format_table(result["rows"], title=f"sharded tables: {args.preset}, mesh {args.mesh} on gloo ranks, "
                                             f"{args.seeds} seeds x {args.steps_per_run} steps, comm over the last "
                                             f"{args.window} (rank 0, bytes per step), row-wise at table_lr "
                                             f"{args.table_lr}, attention {'jagged' if args.jagged else 'padded'}/"
                                             f"{args.kernel}; seed band vs {result['reference']}"))
    print(f"cpu: {cpu_info().model_name}; load average {result['load_avg_1min']:.1f} on "
          f"{result['cpu_count']} cores (exposed comm on shared cores includes waiting)")
    if args.json:
        write_json(args.json, {"bench": "tables", "config": {k: v for k, v in vars(args).items() if k != "func"},
                               **result, "versions": ran})
    return 0
