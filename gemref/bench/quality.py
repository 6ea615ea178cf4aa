"""Quality on a real dataset: eval NE and AUC over seeds per rung and technique, beside id-only baselines.

On `--dataset DIR` (e.g. MovieLens-100K from `gemref data movielens`), with the --preset's
architecture, `--seeds` training runs of `--steps-per-run` steps per variant of --variants
(fast, the fp32 reference; baseline, rung 0, the slowest by far; mxfp8; window; compressed),
each evaluated on the WHOLE eval split, beside the train base rate, the candidate's like-rate
and a logistic regression on user and candidate ids: gemref/measure/quality.py
`variant_quality` says what each variant is and how the seed band judges it.
"""
from __future__ import annotations

import argparse

from ..train.presets import PRESETS, dataset_preset
from ..errors import UsageError
from ..options import add_dataset_arg, add_device_arg, device_of, int_at_least, output_dir, output_file, positive_int
from ..report import format_table, markdown_table
from ..runtime.files import atomic_write_text, write_json
from ..measure.quality import VARIANTS, table_rows, title, variant_quality


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="the architecture (data from --dataset)")
    add_dataset_arg(p)
    add_device_arg(p)
    p.add_argument("--seeds", type=int_at_least(2), default=3, help="training runs per variant (>= 2: a seed band)")
    p.add_argument("--steps-per-run", type=positive_int, default=2000, help="training steps of each run")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="write quality.json and quality.md here")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    if args.dataset is None:
        raise UsageError("--dataset DIR is required: the folder to measure on (e.g. from gemref data movielens)")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "fast" not in variants:
        raise UsageError(f"--variants {args.variants!r}: " + (f"unknown {unknown}; " if unknown else "")
                         + f"choose from {', '.join(VARIANTS)}, fast included (the reference)")
    preset = dataset_preset(args.preset, args.dataset)
    device = device_of(args.device).type
    result = variant_quality(preset, variants, args.seeds, args.steps_per_run, device=device, log=lambda s: print(s, flush=True))
    rows = table_rows(result)
    print(format_table(rows, title=title(result)))
    if args.out:
        from pathlib import Path

        write_json(Path(args.out) / "quality.json", result)
        atomic_write_text(Path(args.out) / "quality.md", f"{title(result)}\n\n{markdown_table(rows)}\n")
    if args.json:
        write_json(args.json, result)
    return 0
