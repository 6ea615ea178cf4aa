"""`gemref data generate|check|movielens`: synthetic shards; validate and summarise a dataset folder; MovieLens-100K.

    generate   a preset's synthetic Parquet shards and manifest (gemref/data/shards.py)
    check DIR  validate a dataset folder as a run would, without writing into it, and print
               rows per split, history lengths, label rates and vocab use (gemref/data/check.py)
    movielens  fetch the pinned recbole==1.2.1 wheel (or read --wheel PATH), check the files'
               sha256 and convert MovieLens-100K into a dataset folder (gemref/data/movielens/)
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from ..data.config import DataConfig
from ..train.presets import get_preset
from ..train.override import override
from ..config.values import parse_field
from . import add_preset_arg
from ..options import check_output_dir, output_dir, output_file, positive_int, split_pairs

NAME = "data"
HELP = "datasets: generate synthetic shards, check a dataset folder, convert MovieLens-100K"


def configure(p: argparse.ArgumentParser) -> None:
    which = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    gen = which.add_parser("generate", help="write Parquet shards + manifest for a preset")
    add_preset_arg(gen)
    gen.add_argument("--out", metavar="DIR", type=output_dir,
                     help="folder (default: <data folder>/<preset>-<hash>; data folder: --data, "
                          "$GEMREF_DATA_DIR, else data/generated)")
    gen.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="DataConfig field, typed as declared, e.g. seed=3 or n_train=1000")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.add_argument("--json", metavar="PATH", type=output_file, help="write the dataset's manifest and summary here")
    gen.set_defaults(func=run_generate)
    check = which.add_parser("check", help="validate a dataset folder (never written) and print its summary")
    check.add_argument("folder", metavar="DIR", help="a dataset folder: Parquet shards + manifest.json (data/README.md)")
    check.add_argument("--json", metavar="PATH", type=output_file, help="write the summary here")
    check.set_defaults(func=run_check)
    ml = which.add_parser("movielens", help="fetch and convert MovieLens-100K (research use only; not redistributed)")
    ml.add_argument("--out", metavar="DIR", type=output_dir,
                    help="dataset folder to write (default: <data folder>/movielens-100k-v1-h<max history>)")
    ml.add_argument("--wheel", metavar="PATH",
                    help="the recbole-1.2.1 wheel, or a folder holding ml-100k.inter/.user/.item, instead of "
                         "fetching the wheel with pip")
    ml.add_argument("--max-history", metavar="N", type=positive_int, default=None,
                    help="keep each row's latest N earlier ratings (default 256; the tiny preset holds 64)")
    ml.add_argument("--sample", action="store_true",
                    help="convert gemref's made-up sample in the ML-100K format instead (offline; not MovieLens)")
    ml.add_argument("--index-url", metavar="URL", help="package index pip fetches the wheel from (default: pip's)")
    ml.add_argument("--json", metavar="PATH", type=output_file, help="write the converted folder's summary here")
    ml.set_defaults(func=run_movielens)


def data_config(preset_name: str, pairs: list[str] | None):
    """The preset with its DataConfig overridden by `--set` pairs (UsageError on a bad one)."""
    preset = get_preset(preset_name)
    changes = {k: parse_field(DataConfig, k, v) for k, v in split_pairs(pairs, "--set").items()}
    return replace(preset, data=override(preset.data, **changes))


def run_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data.shards import dataset_dir, generate_dataset
    from ..runtime.files import write_json
    from ..runtime.locks import folder_lock
    from ..report import format_table

    preset = data_config(args.preset, args.set)
    out = Path(args.out) if args.out else Path(check_output_dir(str(dataset_dir(preset.name, preset.model, preset.data)),
                                                                   "data folder"))
    with folder_lock(out, "--out" if args.out else "data folder"):     # one writer per dataset folder
        manifest = generate_dataset(preset.model, preset.data, out, progress=not args.quiet)
    rows = [{"split": split, "shards": len(sh), "rows": sum(s["rows"] for s in sh),
             "tokens": sum(s["tokens"] for s in sh),
             "click_rate": sum(s["click_rate"] * s["rows"] for s in sh) / sum(s["rows"] for s in sh)}
            for split, sh in manifest["splits"].items()]
    print(format_table(rows, title=f"dataset {preset.name} -> {out}"))
    if args.json:
        write_json(args.json, {"kind": "dataset", "folder": str(out), "splits": rows, "manifest": manifest})
        print(f"wrote {args.json}")
    return 0


def print_check(summary: dict) -> None:
    """The tables of a `check_folder` summary."""
    from ..report import format_table

    print(format_table(summary["splits"], title=f"dataset {summary['name']} at {summary['folder']} (manifest sha256 "
                                                f"{summary['manifest_sha256'][:16]}...): rows, history lengths "
                                                "(events), label rates"))
    print(format_table(summary["vocab"], title="vocab use: distinct ids per table, over every split"))
    print(f"labels: click = {summary['labels']['click']}; conversion = {summary['labels']['conversion']}; "
          f"{summary['n_sparse']} sparse and {summary['n_dense']} dense features; histories <= {summary['max_len']} events")
    for key, text in summary["source"].items():
        print(f"{key}: {text}")


def run_check(args: argparse.Namespace) -> int:
    from ..data.check import check_folder
    from ..runtime.files import write_json

    summary = check_folder(args.folder)
    print_check(summary)
    if args.json:
        write_json(args.json, summary)
        print(f"wrote {args.json}")
    return 0


def run_movielens(args: argparse.Namespace) -> int:
    from ..data.check import check_folder
    from ..data.movielens import DEFAULT_MAX_HISTORY, prepare
    from ..errors import UsageError
    from ..runtime.files import write_json

    if args.sample and args.wheel:
        raise UsageError("--sample converts gemref's own sample: it takes no --wheel")
    folder, _ = prepare(args.out, args.wheel, max_history=args.max_history or DEFAULT_MAX_HISTORY,
                        sample=args.sample, index_url=args.index_url)
    summary = check_folder(folder)
    print_check(summary)
    print(f"converted into {folder}; train on it with: gemref train --dataset {folder} --preset small")
    if args.json:
        write_json(args.json, summary)
        print(f"wrote {args.json}")
    return 0
