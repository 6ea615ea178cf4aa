"""`gemref waterfall`: the ladder of techniques, one rung at a time: table, markdown and figure."""
from __future__ import annotations

import argparse

from ..config import get_preset
from .args import (add_device_arg, add_preset_arg, check_local_ranks, device_of, int_at_least, output_dir,
                   positive_int)

NAME = "waterfall"
HELP = "the ladder of techniques, one rung at a time: table + figure"


def configure(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p, default="small")
    add_device_arg(p)
    p.add_argument("--ranks", type=positive_int, default=1,
                   help="data-parallel ranks (gloo on CPU; CPU: at most 4 per core unless GEMREF_MAX_RANKS=N)")
    p.add_argument("--repeats", type=int_at_least(3), default=3, help="timed windows per rung (>= 3)")
    p.add_argument("--steps-per-window", type=positive_int, default=4, help="optimisation steps per timed window")
    p.add_argument("--warmup", type=positive_int, default=2, help="warm-up steps per rung (not timed)")
    p.add_argument("--out", metavar="DIR", type=output_dir, default="artifacts/waterfall", help="folder for records and figures")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..report import atomic_write_text, format_table, markdown_table
    from ..report.figures import save_figure, waterfall_figure
    from ..report.rows import WATERFALL_COLUMNS, waterfall_table_rows
    from ..waterfall import run_waterfall

    preset = get_preset(args.preset)
    device = device_of(args.device).type
    if args.ranks > 1:
        check_local_ranks(args.ranks, device)
    out = Path(args.out)
    rows = run_waterfall(preset, device=device, ranks=args.ranks, repeats=args.repeats,
                         steps=args.steps_per_window, warmup=args.warmup, out_dir=out)
    on = json.loads((out / "waterfall.json").read_text())["measured_on"]
    title = (f"MFU waterfall: {preset.name} preset on {device}, {args.ranks} rank(s); "
             f"median of {args.repeats} windows x {args.steps_per_window} steps after {args.warmup} warm-up")
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
