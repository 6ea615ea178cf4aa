"""The `gemref` command (also `python -m gemref`).

Each subcommand prints a readable table and, with `--json PATH`, writes its record. A user
mistake (ValueError) exits 2 with one clear line and no traceback.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import logging
import sys
from pathlib import Path

import yaml

from .bench import bench_names
from .config import (AC_MODES, BACKENDS, BALANCE_POLICIES, PRESETS, SPARSE_SHARDINGS, TrainConfig, get_preset,
                     override)
from .config import PRECISIONS
from .report import atomic_write_text, fmt, format_table, markdown_table, write_json


def parse_pairs(pairs: list[str] | None, flag: str) -> dict:
    """["k=v", ...] -> {k: v}; a value is a Python literal (1e-3, [8, 64], True) where it
    parses as one, else YAML (true, a bare string)."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"{flag} expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = yaml.safe_load(raw)
    return out


def parse_set(pairs: list[str], cfg):
    """`--set key=value` overrides of a config dataclass (unknown keys: ValueError)."""
    return override(cfg, **parse_pairs(pairs, "--set"))


def _preset_arg(p: argparse.ArgumentParser, default: str = "tiny") -> None:
    p.add_argument("--preset", default=default, choices=list(PRESETS), help="model/data preset")


def _cmd_data(args) -> int:
    from .data.shards import generate_dataset
    from .data.shards import dataset_dir

    preset = get_preset(args.preset)
    data = parse_set(args.set, preset.data)
    out = Path(args.out) if args.out else dataset_dir(preset)
    manifest = generate_dataset(preset.model, data, out, progress=not args.quiet)
    rows = [{"split": split, "shards": len(sh), "rows": sum(x["rows"] for x in sh),
             "tokens": sum(x["tokens"] for x in sh),
             "click_rate": sum(x["click_rate"] * x["rows"] for x in sh) / sum(x["rows"] for x in sh)}
            for split, sh in manifest["splits"].items()]
    print(format_table(rows, title=f"dataset {preset.name} -> {out}"))
    return 0


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="synthetic ads-event data")
    which = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    gen = which.add_parser("generate", help="write Parquet shards + manifest for a preset")
    _preset_arg(gen)
    gen.add_argument("--out", help="folder (default: data/generated/<preset>-<hash>)")
    gen.add_argument("--set", action="append", metavar="KEY=VALUE", help="DataConfig override, e.g. seed=3")
    gen.add_argument("--quiet", action="store_true")
    gen.set_defaults(func=_cmd_data, parser=gen)


def add_train_switches(p: argparse.ArgumentParser) -> None:
    """The TrainConfig switches shared by `train`, `flops` and benches."""
    from .attention import kernel_names

    p.add_argument("--steps", type=int, help="optimisation steps (default: the preset's)")
    p.add_argument("--batch-size", type=int, help="samples per step (default: the preset's)")
    p.add_argument("--jagged", action="store_true", help="rung 1: keep histories jagged")
    p.add_argument("--kernel", choices=kernel_names(), help="rung 2: gdpa kernel (jagged layout)")
    p.add_argument("--precision", choices=("auto",) + PRECISIONS,
                   help="rung 7: Linear GEMM precision (auto: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--compile", action="store_true", help="rung 3: torch.compile, block by block")
    p.add_argument("--ac", choices=AC_MODES, help="rung 4: activation checkpointing (auto = AutoAC; "
                   "pt2 = torch's activation_memory_budget, needs --compile)")
    p.add_argument("--ac-budget", type=float, help="auto/pt2: activation memory budget, a fraction "
                   "in (0, 1] of the no-checkpoint activation bytes")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--balance", choices=BALANCE_POLICIES, help="rung 5: split global batches across ranks by cost")
    p.add_argument("--mesh", help="rung 6: RxS mesh, R replica groups x S-way sharding "
                                  "(with --ranks N or torchrun: default 1xN, FSDP over all ranks)")
    p.add_argument("--sparse-sharding", choices=SPARSE_SHARDINGS, help="rung 6: shard the embedding tables")
    p.add_argument("--no-reshard-after-forward", action="store_true",
                   help="FSDP: keep gathered parameters from forward to backward (more memory, less traffic)")
    p.add_argument("--backend", choices=BACKENDS, help="collectives (auto: nccl on cuda, gloo on cpu)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any other TrainConfig field, e.g. lr=0.001 (see gemref/config.py)")


def train_config_from_args(args, base: TrainConfig) -> TrainConfig:
    changes = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.batch_size is not None:
        changes["batch_size"] = args.batch_size
    if args.jagged:
        changes["jagged"] = True
    if args.kernel is not None:
        changes["kernel"] = args.kernel
    if args.precision is not None:
        changes["precision"] = args.precision
    for name in ("balance", "mesh", "sparse_sharding", "backend", "checkpoint_dir", "checkpoint_every"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    if args.no_reshard_after_forward:
        changes["reshard_after_forward"] = False
    if getattr(args, "resume", False):
        changes["resume"] = True
    if args.compile:
        changes["compile"] = True
    if args.ac is not None:
        changes["ac"] = args.ac
    if args.ac_budget is not None:
        changes["ac_budget"] = args.ac_budget
    return parse_set(args.set, override(base, **changes))


RUN_COLUMNS = ("preset", "jagged", "kernel", "precision", "median_step_s", "samples_per_s", "tokens_per_s",
               "model_tflops_per_s", "mfu", "hfu", "peak_memory_mb", "data_share", "ne_click", "auc_click")


def run_row(r: dict) -> dict:
    """One table row of a run record."""
    return {"preset": r["preset"], "jagged": r["switches"]["jagged"], "kernel": r["switches"]["kernel_resolved"],
            "precision": r["dtype"], **{k: r.get(k) for k in RUN_COLUMNS[4:10]},
            "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") is not None else None,
            "data_share": r["data_share"], "ne_click": r["eval"]["ne_click"], "auc_click": r["eval"]["auc_click"]}


def _print_parallel(record: dict) -> None:
    """Rank 0's extra tables for a multi-rank run: per-rank times and bytes, collectives."""
    par, comm = record["parallel"], record["comm"]
    rows = [{**t, "param_bytes": m["params"], "optimizer_bytes": m["optimizer"]}
            for t, m in zip(record["ranks"], record["memory_per_rank"])]
    print(format_table(rows, title=f"per rank: mesh {par['mesh']} on {par['backend']}, balance {par['balance']}, "
                                   f"tables {par['sparse_sharding']} (medians over timed steps)"))
    print(format_table(comm["by_kind"], columns=["kind", "dim", "recorded_count", "recorded_bytes", "analytic_bytes",
                                                 "ratio", "seconds"],
                       title="collectives of one step, all ranks (recorded vs analytic payload bytes)"))
    ov = comm["overlap_per_rank"][0]
    print(f"rank 0: comm {fmt(ov['comm_s'])} s, exposed {fmt(ov['exposed_comm_s'])} s, "
          f"overlapped {fmt(ov['overlapped_share'])}")


def _cmd_train(args) -> int:
    from .run_ranks import launch_train
    from .parallel.launch import torchrun_world
    from .report.figures import run_figure, save_figure
    from .train import run

    preset = get_preset(args.preset)
    train = train_config_from_args(args, preset.train)
    out = Path(args.out) if args.out else None
    json_path = args.json or (out / "run.json" if out else None)
    world = args.ranks if args.ranks is not None else torchrun_world()
    if world is None:
        record = run(preset, train, device=args.device, json_path=json_path, progress=not args.quiet)
    else:
        if args.mesh is None and train.mesh == "1x1":     # default: FSDP over all ranks
            train = override(train, mesh=f"1x{world}")
        record = launch_train(preset, train, ranks=args.ranks, device=args.device, json_path=json_path,
                              progress=not args.quiet)
        if record is None:          # a torchrun rank other than 0: rank 0 reports
            return 0
    print(format_table([run_row(record)], title=f"gemref train ({record['device']['name']}, {record['dtype']})"))
    print(f"peak FLOP/s {fmt(record['peak_flops'])} ({record['mfu_basis']}): {record['peak_source']}")
    if "parallel" in record:
        _print_parallel(record)
    if out:
        written = save_figure(run_figure(record), out / "run")
        print(f"wrote {json_path}, " + ", ".join(map(str, written)))
    elif json_path:
        print(f"wrote {json_path}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a preset, print throughput/MFU/NE, write the run record")
    _preset_arg(p)
    add_train_switches(p)
    p.add_argument("--ranks", type=int, help="spawn this many local ranks (gloo on CPU); torchrun sets its own")
    p.add_argument("--checkpoint-dir", help="distributed checkpoints here")
    p.add_argument("--checkpoint-every", type=int, help="save every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--json", help="write the run record here")
    p.add_argument("--out", help="folder for run.json and run.html")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train, parser=p)


def _cmd_flops(args) -> int:
    from .mfu.verify import flops_report

    preset = get_preset(args.preset)
    train = train_config_from_args(args, preset.train)
    report = flops_report(preset, train, device=args.device, verify=args.verify)
    print(format_table(report["components"], title=f"FLOPs of one training step ({preset.name}, "
                       f"batch {train.batch_size}, jagged={train.jagged}, kernel={report['kernel']})"))
    for line in report["summary"]:
        print(line)
    if args.json:
        write_json(args.json, report)
    return 0 if report.get("verified", True) else 1


def _add_flops(sub) -> None:
    p = sub.add_parser("flops", help="analytic FLOPs per component; --verify against FlopCounterMode")
    _preset_arg(p)
    add_train_switches(p)
    p.add_argument("--verify", action="store_true",
                   help="count one real training step with FlopCounterMode; exit 1 if off by > 2%%")
    p.add_argument("--json", help="write the report here")
    p.set_defaults(func=_cmd_flops, parser=p)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(bench_names()))
    which = bench.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name in bench_names():
        module = importlib.import_module(f"gemref.bench.{name}")
        p = which.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.configure_parser(p)
        p.set_defaults(func=module.run, parser=p)


WATERFALL_COLUMNS = ("rung", "tokens_per_s", "spread", "model_tflops_per_s", "mfu", "peak_memory_mb",
                     "vs_previous", "vs_baseline")


def waterfall_table_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["status"] != "ran":
            out.append({"rung": r["rung"], "tokens_per_s": "n/a here (see below)"})
            continue
        out.append({**{k: r.get(k) for k in WATERFALL_COLUMNS},
                    "spread": f"{fmt(r['tokens_per_s_min'])}..{fmt(r['tokens_per_s_max'])}",
                    "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                    "vs_previous": f"{r['vs_previous']:.2f}x", "vs_baseline": f"{r['vs_baseline']:.2f}x"})
    return out


def _cmd_waterfall(args) -> int:
    from .report.figures import save_figure, waterfall_figure
    from .waterfall import run_waterfall

    preset = get_preset(args.preset)
    out = Path(args.out)
    rows = run_waterfall(preset, device=args.device, ranks=args.ranks, repeats=args.repeats,
                         steps=args.steps, warmup=args.warmup, out_dir=out)
    on = json.loads((out / "waterfall.json").read_text())["measured_on"]
    title = (f"MFU waterfall: {preset.name} preset on {args.device}, {args.ranks} rank(s); "
             f"median of {args.repeats} windows x {args.steps} steps after {args.warmup} warm-up")
    notes = [f"{r['rung']}: {r['status']}" for r in rows if r["status"] != "ran"]
    ran = [r for r in rows if r["status"] == "ran"]
    notes += [f"peak: {ran[0]['peak_source']}"] if ran else []
    notes.append(f"measured {on['date_utc']} UTC on {on['device']} ({on['cpu_count']} CPUs, "
                 f"{on['threads_per_rank']} thread(s) per rank), torch {on['torch']}, gemref {on['gemref']} "
                 f"({(on['git_sha'] or 'no git')[:10]})")
    table = waterfall_table_rows(rows)
    print(format_table(table, WATERFALL_COLUMNS, title=title))
    print("\n".join(notes))
    atomic_write_text(out / "waterfall.md", f"{title}\n\n{markdown_table(table, WATERFALL_COLUMNS)}\n\n"
                      + "".join(f"- {n}\n" for n in notes))
    written = save_figure(waterfall_figure(rows), out / "waterfall")
    print("wrote " + ", ".join(map(str, [out / "waterfall.json", out / "waterfall.md", *written])))
    return 0


def _add_waterfall(sub) -> None:
    p = sub.add_parser("waterfall", help="the ladder of techniques, one rung at a time: table + figure")
    _preset_arg(p, default="small")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--ranks", type=int, default=1, help="data-parallel ranks (gloo on CPU)")
    p.add_argument("--repeats", type=int, default=3, help="timed windows per rung (>= 3)")
    p.add_argument("--steps", type=int, default=4, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per rung (not timed)")
    p.add_argument("--out", default="artifacts/waterfall", help="folder for records and figures")
    p.set_defaults(func=_cmd_waterfall, parser=p)


def _cmd_notebooks(args) -> int:
    import datetime

    from .notebooks import NotebookFailure, run_notebooks

    params = parse_pairs(args.param, "--param")
    grid = yaml.safe_load(Path(args.grid).read_text()) if args.grid else None
    if grid is not None and not isinstance(grid, dict):
        raise ValueError(f"{args.grid}: a grid is a mapping of parameter -> list of values")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("artifacts") / "notebooks" / f"{args.profile}-{stamp}"
    try:
        rows = run_notebooks(args.profile, out, names=args.notebooks, params=params, grid=grid)
    except NotebookFailure as e:
        print(f"gemref notebooks: {e}", file=sys.stderr)
        return 1
    long = [{"notebook": r["notebook"], "metric": k, "value": v} for r in rows for k, v in r.items()
            if k != "notebook"]
    print(format_table(long, title=f"notebook metrics ({args.profile}); wide table: {out}/summary.csv"))
    return 0


def _add_notebooks(sub) -> None:
    p = sub.add_parser("notebooks", help="run the notebooks headless (papermill)")
    which = p.add_subparsers(dest="notebooks_command", metavar="ACTION", required=True)
    r = which.add_parser("run", help="execute notebooks with a parameter profile (and grid)")
    r.add_argument("notebooks", nargs="*", help="notebook names (default: all), e.g. 00_mfu_baseline")
    r.add_argument("--profile", default="ci", help="notebooks/params/<profile>.yaml: ci, cpu, gpu")
    r.add_argument("--param", action="append", metavar="KEY=VALUE", help="override a parameter")
    r.add_argument("--grid", help="YAML mapping parameter -> list of values (cartesian product)")
    r.add_argument("--out", help="output folder (default: artifacts/notebooks/<profile>-<date>)")
    r.set_defaults(func=_cmd_notebooks, parser=r)
    from .book import build_command, configure_build_parser   # `gemref notebooks build`: the reading copy
    configure_build_parser(b := which.add_parser("build", help="execute the chapters, write the static reading copy"))
    b.set_defaults(func=build_command, parser=b)


def _cmd_simulate(args) -> int:
    from dataclasses import asdict

    from .simulate.projection import GPU_COUNTS, Options, project
    from .simulate.summary import (at, findings, gem_band, load_waterfall, measured_mfu, mfu_pivot,
                                   parse_mfu_assumption, rung_deltas, table_rows)

    if args.validate:
        from .simulate.validate import validate

        rows = validate(args.validate_preset, args.ranks, steps=args.steps, batch_size=args.batch_size,
                        calibration_ranks=args.calibration_ranks)
        print(format_table(rows, columns=["ranks", "cores", "measured_s", "predicted_s", "error", "compute_1proc_s",
                                          "host_work_s", "time_sharing", "time_sharing_formula", "imbalance",
                                          "comm_s", "without_host_work_error"],
                           title=f"scale projection vs measured gloo runs ({args.validate_preset} preset, jagged + "
                                 "fast kernel + kk + FSDP 1xR with row-sharded tables; median step seconds)"))
        if args.json:
            write_json(args.json, {"kind": "simulate_validate", "rows": rows})
        return 0
    preset = get_preset(args.preset)
    mfu = measured_mfu(load_waterfall(args.from_waterfall)) if args.from_waterfall else {}
    mfu.update(parse_mfu_assumption(args.mfu_assumption))
    options = Options(hardware=args.hardware, batch_per_gpu=args.batch_per_gpu, batches=args.batches,
                      table_sync_every=args.table_sync_every, sm_share=args.sm_share,
                      bandwidth_scale=args.bandwidth_scale)
    gpus = args.gpus or list(GPU_COUNTS)
    rows = project(preset, gpus, options=options, mfu=mfu)
    top = max(gpus)
    print(format_table(mfu_pivot(rows), title=f"projected MFU: {preset.name} preset on {args.hardware} (weak scaling)"))
    print(format_table(table_rows(at(rows, top)), title=f"one step at {top} GPUs (seconds per rank)"))
    for line in findings(rows):
        print(line)
    if args.json:
        write_json(args.json, {"kind": "simulate", "preset": preset.name, "options": asdict(options),
                               "rows": rows, "gem_band": gem_band(rows, top), "deltas": rung_deltas(rows, top),
                               "findings": findings(rows)})
        print(f"wrote {args.json}")
    return 0


def _add_simulate(sub) -> None:
    from .simulate.cost_model import HARDWARE

    p = sub.add_parser("simulate", help="project step time and MFU of every rung to thousands of GPUs")
    _preset_arg(p, default="large")
    p.add_argument("--hardware", default="h100_ib_ndr", choices=list(HARDWARE), help="cluster profile (cost_model.py)")
    p.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default 8 16 ... 4096)")
    p.add_argument("--from-waterfall", metavar="PATH", help="single-rank waterfall.json (or its folder): measured "
                                                             "per-rung MFU instead of the assumed values")
    p.add_argument("--mfu-assumption", nargs="+", metavar="[RUNG=]MFU",
                   help="single-GPU MFU in (0, 1]: one value for every rung, or RUNG=VALUE (wins over the waterfall)")
    p.add_argument("--batch-per-gpu", type=int, help="samples per GPU and step (default: the preset's batch size)")
    p.add_argument("--batches", type=int, default=3, help="global batches drawn per GPU count for the imbalance")
    p.add_argument("--table-sync-every", type=int, default=1, help="all-reduce the table replicas every K steps")
    p.add_argument("--sm-share", type=float, default=0.0, help="SM share overlapped collectives take (NCCL ~0.1)")
    p.add_argument("--bandwidth-scale", type=float, default=1.0, help="multiply every link's bandwidth")
    p.add_argument("--json", help="write the projection here")
    v = p.add_argument_group("validation on this machine (--validate)")
    v.add_argument("--validate", action="store_true", help="predict measured gloo runs on this CPU instead")
    v.add_argument("--validate-preset", default="tiny", choices=list(PRESETS))
    v.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="gloo rank counts to validate")
    v.add_argument("--steps", type=int, default=10, help="timed steps per run (after 4 warm-up)")
    v.add_argument("--batch-size", type=int, default=64, help="global batch of the validation runs")
    v.add_argument("--calibration-ranks", type=int, help="calibrate gloo once on this many processes "
                                                         "(default: in each run's launch, on its ranks)")
    p.set_defaults(func=_cmd_simulate, parser=p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemref", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_data(sub)
    _add_train(sub)
    _add_flops(sub)
    from .mfu.peak_cli import configure_peak_parser, peak_command   # `gemref peak`
    configure_peak_parser(p := sub.add_parser("peak", help="the peak FLOP/s MFU divides by, its source and method"))
    p.set_defaults(func=peak_command, parser=p)
    _add_bench(sub)
    _add_waterfall(sub)
    _add_simulate(sub)
    _add_notebooks(sub)
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # argparse exits 2 on unknown commands/choices
    command_parser = vars(args).pop("parser", parser)
    if extra:  # report unknown switches with the subcommand's usage, which lists the valid ones
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        print(f"gemref {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
