"""`gemref train`: train a preset (on its synthetic data, or on --dataset DIR) with the chosen switches, print
throughput/MFU/NE, write the run record (its config names the dataset folder, manifest digest and labels)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ..model.config import ModelConfig
from ..train.config import TrainConfig
from ..train.presets import get_preset
from ..train.override import override
from ..errors import UsageError
from ..config.values import parse_field
from ..options import (add_dataset_arg, add_device_arg, argtype, check_local_ranks, check_workers, device_of,
                       output_dir, output_file, positive_int)
from . import add_preset_arg
from .switches import add_train_switches, train_changes, train_config_from_args

if TYPE_CHECKING:                 # the record's types import torch: only for type checkers
    from ..report.records import RunRecord

NAME = "train"
HELP = "train a preset, print throughput/MFU/NE, write the run record"


def configure(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    add_dataset_arg(p)
    add_device_arg(p)
    p.add_argument("--ranks", type=positive_int,
                   help="spawn this many local ranks (gloo on CPU, one per GPU on CUDA; torchrun sets its own). "
                        "CPU: at most 4 per core unless GEMREF_MAX_RANKS=N allows N")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the run record here")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="folder for run.json and run.html")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--attention-window", metavar="W", type=argtype(lambda t: parse_field(ModelConfig, "window", t), "window"),
                   help="ModelConfig.window: each history event attends only its last W events (itself included); "
                        "none = full causal (the preset's default). Cross attention always sees the whole history")
    add_train_switches(p, checkpoints=True)
    p.set_defaults(func=run)


def plan_ranks(train: TrainConfig, ranks: int | None, torchrun: int | None, device_type: str,
               mesh_given: bool) -> TrainConfig:
    """The config with its mesh (default with ranks: 1xN, FSDP over all of them), and the
    switches that need ranks refused in one process. The launch's own checks (mesh against
    ranks, backend, transport) are gemref/parallel/launch.py's preflight; the rank count
    against the machine (the same check the preflight makes) comes first, so that a count this
    machine cannot run is named before anything derived from it."""
    if train.embedding_tables.torchrec_2d and device_type != "cuda":   # before any rank starts: DMPCollection asserts CUDA
        from ..interop.sharders import two_d_refusal
        raise UsageError(two_d_refusal(device_type))
    mesh = train.parallelism.shape
    world = ranks if ranks is not None else torchrun
    if world is None:
        if mesh.world > 1:
            raise UsageError(f"--mesh {train.parallelism.mesh} needs {mesh.world} ranks: add --ranks {mesh.world} "
                             "(or launch with torchrun)")
        for flag, value, what in (("--balance", train.balancing.policy, "splits each global batch across ranks"),
                                  ("--sparse-sharding", train.parallelism.sparse_sharding, "shards the embedding tables "
                                                                               "across ranks")):
            if value != "none":      # one process: nothing to split, the switch would do nothing
                raise UsageError(f"{flag} {value} {what}: add --ranks N (or launch with torchrun)")
        return train
    if ranks is not None:
        check_local_ranks(ranks, device_type)
    given = f"--ranks {ranks}" if ranks is not None else f"torchrun started {world} ranks"
    if train.batch_size < world:
        raise UsageError(f"--batch-size {train.batch_size} is the global batch: {given} needs at least one "
                         "sample per rank and step")
    if not mesh_given and mesh.world == 1:          # default: FSDP over all ranks
        return override(train, mesh=f"1x{world}")
    return train


def _print_parallel(record: RunRecord) -> None:
    """Rank 0's extra tables for a multi-rank run: per-rank times and bytes, collectives."""
    from ..report import fmt, format_table

    par, comm = record["parallel"], record["comm"]
    rows = [{**t, "param_bytes": m["params"], "optimizer_bytes": m["optimizer"]}
            for t, m in zip(record["ranks"], record["memory_per_rank"])]
    engine = record.get("embeddings")
    tables = "torchrec" if engine else par["sparse_sharding"]
    print(format_table(rows, title=f"per rank: mesh {par['mesh']} on {par['backend']}, balance {par['balance']}, "
                                   f"tables {tables} (medians over timed steps)"))
    if engine:
        plan = [{"table": name, **entry} for name, entry in engine["plan"].items()]
        print(format_table(plan, title=f"TorchRec plan ({engine['sharding']}), tables trained by fused "
                                       f"{engine['optimizer']} lr {engine['lr']:g}"))
    print(format_table(comm["by_kind"], columns=["kind", "dim", "recorded_count", "recorded_bytes", "analytic_bytes",
                                                 "ratio", "seconds"],
                       title="collectives of one step, all ranks (recorded vs analytic payload bytes)"))
    ov = comm["overlap_per_rank"][0]
    print(f"rank 0: comm {fmt(ov['comm_s'])} s, exposed {fmt(ov['exposed_comm_s'])} s, "
          f"overlapped {fmt(ov['overlapped_share'])}")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from contextlib import nullcontext

    from ..train.presets import dataset_preset
    from ..parallel.launch import torchrun_world
    from ..runtime.locks import folder_lock
    from ..report import fmt, format_table
    from ..report.figures import run_figure, save_figure
    from ..report.rows import run_row
    from ..step import NonFiniteError
    from ..measure.run import launch_runs

    base = get_preset(args.preset)
    if args.attention_window is not None:
        base = replace(base, model=override(base.model, window=args.attention_window))
    device = device_of(args.device)
    train = plan_ranks(train_config_from_args(args, base.train), args.ranks, torchrun_world(), device.type,
                       mesh_given="mesh" in train_changes(args))
    if train.num_workers is not None:
        check_workers(train.num_workers)
    preset = dataset_preset(base, args.dataset, train)   # the preset's checks of the config against its data
    out = Path(args.out) if args.out else None
    json_path = args.json or (out / "run.json" if out else None)
    ckpt_lock = folder_lock(train.checkpoint.folder, "--checkpoint-dir") if train.checkpoint.folder else nullcontext()
    try:
        with ckpt_lock:           # one run writes a checkpoint folder at a time
            records = launch_runs(preset, [train], ranks=args.ranks, device=args.device, json_path=json_path,
                                  progress=not args.quiet)
    except NonFiniteError as e:       # the run's outcome (lr, data), not a bug in gemref: one line, exit 1
        print(f"gemref train: error: {e}", file=sys.stderr)
        return 1
    if records is None:               # a torchrun rank other than 0: rank 0 reports
        return 0
    record = records[0]
    print(format_table([run_row(record)], title=f"gemref train ({record['device']['name']}, {record['dtype']})"))
    print(f"peak FLOP/s {fmt(record['peak_flops'])} ({record['mfu_basis']}): {record['peak_source']}")
    data = record["config"]["data"]
    if "manifest_sha256" in data:       # a dataset folder (--dataset): what the click/conversion columns mean
        print(f"data: {data['name']} at {data['folder']} (manifest sha256 {data['manifest_sha256'][:16]}...); "
              f"ne/auc_click: {data['click_label']}; ne/auc_conversion: {data['conversion_label']}")
    if "parallel" in record:
        _print_parallel(record)
    if out:
        written = save_figure(run_figure(record), out / "run")
        print(f"wrote {json_path}, " + ", ".join(map(str, written)))
    elif json_path:
        print(f"wrote {json_path}")
    return 0
