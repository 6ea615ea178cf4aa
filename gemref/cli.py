"""The `gemref` command (also `python -m gemref`).

Each subcommand prints a readable table and, with `--json PATH`, writes its record. A user
mistake (ValueError) exits 2 with one clear line and no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from .bench import bench_names
from .config import AC_MODES, PRESETS, TrainConfig, get_preset, override
from .report import format_table, fmt, write_json


def parse_set(pairs: list[str], cfg):
    """`--set key=value` overrides of a config dataclass; values parsed as Python literals."""
    import ast

    changes = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            changes[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            changes[key] = raw
    return override(cfg, **changes)


def _preset_arg(p: argparse.ArgumentParser, default: str = "tiny") -> None:
    p.add_argument("--preset", default=default, choices=list(PRESETS), help="model/data preset")


def _cmd_data(args) -> int:
    from .data.shards import generate_dataset
    from .train import dataset_dir

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
    p.add_argument("--compile", action="store_true", help="rung 3: torch.compile, block by block")
    p.add_argument("--ac", choices=AC_MODES, help="rung 4: activation checkpointing (auto = AutoAC; "
                   "pt2 = torch's activation_memory_budget, needs --compile)")
    p.add_argument("--ac-budget", type=float, help="auto/pt2: activation memory budget, a fraction "
                   "in (0, 1] of the no-checkpoint activation bytes")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
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
    if args.compile:
        changes["compile"] = True
    if args.ac is not None:
        changes["ac"] = args.ac
    if args.ac_budget is not None:
        changes["ac_budget"] = args.ac_budget
    return parse_set(args.set, override(base, **changes))


RUN_COLUMNS = ("preset", "jagged", "kernel", "median_step_s", "samples_per_s", "tokens_per_s",
               "model_tflops_per_s", "mfu", "hfu", "peak_memory_mb", "data_share", "ne_click", "auc_click")


def run_row(r: dict) -> dict:
    """One table row of a run record."""
    return {"preset": r["preset"], "jagged": r["switches"]["jagged"], "kernel": r["switches"]["kernel_resolved"],
            **{k: r.get(k) for k in RUN_COLUMNS[3:9]},
            "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") is not None else None,
            "data_share": r["data_share"], "ne_click": r["eval"]["ne_click"], "auc_click": r["eval"]["auc_click"]}


def _cmd_train(args) -> int:
    from .plots import run_figure
    from .train import run

    preset = get_preset(args.preset)
    train = train_config_from_args(args, preset.train)
    out = Path(args.out) if args.out else None
    json_path = args.json or (out / "run.json" if out else None)
    record = run(preset, train, device=args.device, json_path=json_path, progress=not args.quiet)
    print(format_table([run_row(record)], title=f"gemref train ({record['device']['name']}, {record['dtype']})"))
    print(f"peak FLOP/s {fmt(record['peak_flops'])}: {record['peak_source']}")
    if out:
        run_figure(record).write_html(out / "run.html", include_plotlyjs="cdn")
        print(f"wrote {json_path} and {out / 'run.html'}")
    elif json_path:
        print(f"wrote {json_path}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a preset, print throughput/MFU/NE, write the run record")
    _preset_arg(p)
    add_train_switches(p)
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


def _cmd_notebooks(args) -> int:
    import datetime

    import yaml

    from .notebooks import NotebookFailure, run_notebooks

    params = {}
    for pair in args.param or []:
        if "=" not in pair:
            raise ValueError(f"--param expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        params[key] = yaml.safe_load(raw)
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
    print(format_table(rows, title=f"notebook metrics ({args.profile}) -> {out}/summary.csv"))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemref", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_data(sub)
    _add_train(sub)
    _add_flops(sub)
    _add_bench(sub)
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
