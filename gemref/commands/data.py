"""`gemref data generate`: write a preset's synthetic Parquet shards and manifest."""
from __future__ import annotations

import argparse
from dataclasses import replace

from ..config import DataConfig, get_preset, override
from ..config.values import parse_field
from ..options import add_preset_arg, check_output_dir, output_dir, output_file, split_pairs

NAME = "data"
HELP = "synthetic ads-event data"


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


def data_config(preset_name: str, pairs: list[str] | None):
    """The preset with its DataConfig overridden by `--set` pairs (UsageError on a bad one)."""
    preset = get_preset(preset_name)
    changes = {k: parse_field(DataConfig, k, v) for k, v in split_pairs(pairs, "--set").items()}
    return replace(preset, data=override(preset.data, **changes))


def run_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data.shards import dataset_dir, generate_dataset
    from ..files import write_json
    from ..report import format_table

    preset = data_config(args.preset, args.set)
    out = Path(args.out) if args.out else Path(check_output_dir(str(dataset_dir(preset)), "data folder"))
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
