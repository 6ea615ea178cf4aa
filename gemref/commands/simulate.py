"""`gemref simulate project` (step time and MFU of every rung at thousands of GPUs) and
`gemref simulate validate` (the same formula against measured gloo runs on this machine) and
`gemref simulate published` (the collective and step models against published GPU measurements)."""
from __future__ import annotations

import argparse

from ..train.presets import PRESETS, get_preset
from ..parallel.config import TABLE_OPTIMIZERS
from ..errors import user_input
from . import add_preset_arg
from ..options import check_local_ranks, int_at_least, nonnegative_int, output_file, positive_float, positive_int, share

NAME = "simulate"
HELP = ("project step time and MFU of every rung to thousands of GPUs (project), or check the projection against "
        "measured runs (validate) and published measurements (published)")


def configure(p: argparse.ArgumentParser) -> None:
    which = p.add_subparsers(dest="simulate_command", metavar="ACTION", required=True)
    proj = which.add_parser("project", help="projected MFU and step time per rung and GPU count (weak scaling)")
    _configure_project(proj)
    val = which.add_parser("validate", help="predict measured gloo runs on this CPU and compare")
    _configure_validate(val)
    pub = which.add_parser("published", help="the collective and step models against published measurements "
                                             "(nccl-tests bus bandwidths, torchtitan's 8 -> 128 GPU FSDP scaling)")
    pub.add_argument("--json", metavar="PATH", type=output_file, help="write both tables here")
    pub.set_defaults(func=run_published)


def _configure_project(p: argparse.ArgumentParser) -> None:
    from ..simulate.cost_model import HARDWARE

    add_preset_arg(p, default="large")
    p.add_argument("--hardware", default="h100_ib_ndr", choices=list(HARDWARE), help="cluster profile (cost_model.py)")
    p.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default 8 16 ... 4096)")
    p.add_argument("--from-waterfall", metavar="PATH", help="single-rank waterfall.json (or its folder): measured "
                                                             "per-rung MFU instead of the assumed values")
    p.add_argument("--mfu-assumption", nargs="+", metavar="[RUNG=]MFU",
                   help="single-GPU MFU in (0, 1]: one value for every rung, or RUNG=VALUE (wins over the waterfall)")
    p.add_argument("--batch-per-gpu", type=positive_int, help="samples per GPU and step (default: the preset's batch)")
    p.add_argument("--batches", type=positive_int, default=3, help="global batches drawn per GPU count for the imbalance")
    p.add_argument("--table-optimizer", choices=TABLE_OPTIMIZERS, default="adamw",
                   help="the tables' optimizer: adamw (summed gradient all-reduce every step), rowwise_adagrad or "
                        "rowwise_adam (replica weights and row state averaged every --table-sync-every steps)")
    p.add_argument("--table-sync-every", type=positive_int, default=1,
                   help="with a row-wise --table-optimizer: sync the table replicas every K steps")
    p.add_argument("--transport", choices=("nccl", "ncclx_smfree"), default="nccl",
                   help="collective transport: nccl (~24 SMs per collective) or ncclx_smfree (1 SM for data-moving collectives)")
    p.add_argument("--collective-sms", type=nonnegative_int, default=None,
                   help="SMs every collective occupies (default: the transport's own count)")
    p.add_argument("--sm-share", type=share, default=None,
                   help="override: the share of overlapped compute lost to collectives, in [0, 1]")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0, help="multiply every link's bandwidth")
    p.add_argument("--schedule", choices=("nccl", "hierarchical", "flat"), default="nccl",
                   help="collectives of groups spanning nodes: as stock NCCL runs them, in two explicit levels, or "
                        "flat on the network (collectives.py)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the projection here")
    p.set_defaults(func=run_project)


def _configure_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model/data preset of the measured runs")
    p.add_argument("--ranks", type=int_at_least(2), nargs="+", default=[2, 4], help="gloo rank counts to validate")
    p.add_argument("--steps-per-run", type=int_at_least(3), default=10, help="timed steps of each run (after its warm-up)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="global batch of the validation runs")
    p.add_argument("--calibration-ranks", type=int_at_least(2), help="calibrate gloo once on this many processes "
                                                                     "(default: in each run's launch, on its ranks)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the rows here")
    p.set_defaults(func=run_validate)


def run_project(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..report import format_table
    from ..runtime.files import write_json
    from ..simulate.projection import GPU_COUNTS, Options, check_gpus, project
    from ..simulate.summary import (at, collective_rows, findings, gem_band, load_waterfall, measured_mfu, mfu_pivot,
                                    parse_mfu_assumption, rung_deltas, table_rows, tables_assumed)

    preset = get_preset(args.preset)
    with user_input():     # these parse and check what the user gave; ValueError there is theirs
        gpus = check_gpus(args.gpus) if args.gpus is not None else list(GPU_COUNTS)
        mfu = measured_mfu(load_waterfall(args.from_waterfall)) if args.from_waterfall else {}
        mfu.update(parse_mfu_assumption(args.mfu_assumption))
    options = Options(hardware=args.hardware, batch_per_gpu=args.batch_per_gpu, batches=args.batches,
                      table_optimizer=args.table_optimizer, table_sync_every=args.table_sync_every,
                      transport=args.transport,
                      collective_sms=args.collective_sms, sm_share=args.sm_share,
                      bandwidth_scale=args.bandwidth_scale, schedule=args.schedule)
    rows = project(preset, gpus, options=options, mfu=mfu)
    top = max(gpus)
    tables = tables_assumed(rows[0])
    print(format_table(mfu_pivot(rows), title=f"projected MFU: {preset.name} preset on {args.hardware} (weak scaling; "
                                              f"{tables})"))
    print(format_table(table_rows(at(rows, top)), title=f"one step at {top} GPUs (seconds per rank; {tables})"))
    for r in (at(rows, top)[0], at(rows, top)[-1]):
        print(format_table(collective_rows(r), title=f"{r['rung']} at {top} GPUs: collectives per step and rank "
                                                     "(latency and bandwidth seconds)"))
    for line in findings(rows):
        print(line)
    if args.json:
        write_json(args.json, {"kind": "simulate", "preset": preset.name, "options": asdict(options),
                               "rows": rows, "gem_band": gem_band(rows, top), "deltas": rung_deltas(rows, top),
                               "findings": findings(rows)})
        print(f"wrote {args.json}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from ..report import format_table
    from ..runtime.files import write_json
    from ..simulate.validate import validate

    for ranks in args.ranks:
        check_local_ranks(ranks, "cpu")
    if args.calibration_ranks:
        check_local_ranks(args.calibration_ranks, "cpu", "--calibration-ranks")
    rows = validate(args.preset, args.ranks, steps=args.steps_per_run, batch_size=args.batch_size,
                    calibration_ranks=args.calibration_ranks)
    print(format_table(rows, columns=["ranks", "cores", "measured_s", "predicted_s", "error", "compute_1proc_s",
                                      "host_work_s", "time_sharing", "time_sharing_formula", "imbalance",
                                      "comm_s", "without_host_work_error"],
                       title=f"scale projection vs measured gloo runs ({args.preset} preset, jagged + fast kernel "
                             "+ kk + FSDP 1xR with row-sharded tables; median step seconds)"))
    if args.json:
        write_json(args.json, {"kind": "simulate_validate", "rows": rows})
    return 0


def run_published(args: argparse.Namespace) -> int:
    from ..report import format_table
    from ..runtime.files import write_json
    from ..simulate.cost_model import published_comparison
    from ..simulate.published_scaling import SOURCE, torchtitan_scaling

    buses, scaling = published_comparison(), torchtitan_scaling()
    print(format_table(buses, columns=["kind", "ranks", "nodes", "hardware", "algorithm", "published_gb_s", "model_gb_s",
                                       "error", "hierarchical_gb_s", "hierarchical_error"],
                       title="bus bandwidth at 16 GiB, published (nccl-tests' definition) vs the collective model"))
    print(format_table(scaling, columns=["technique", "gpus_small", "gpus_large", "published_tps_small",
                                         "published_tps_large", "published_ratio", "model_ratio", "error",
                                         "exposed_small_s", "exposed_large_s", "sm_slowdown_small_s",
                                         "sm_slowdown_large_s"],
                       title=f"TPS per GPU, large / small GPU count, published vs the step model ({SOURCE})"))
    if args.json:
        write_json(args.json, {"kind": "simulate_published", "bus_bandwidth": buses, "fsdp_scaling": scaling})
        print(f"wrote {args.json}")
    return 0
