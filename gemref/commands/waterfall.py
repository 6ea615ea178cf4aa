"""`gemref waterfall`: the ladder of techniques, one rung at a time: table, markdown and figure."""
from __future__ import annotations

import argparse

from ..train.presets import get_preset
from ..options import (add_dataset_arg, add_device_arg, device_of, int_at_least, nonnegative_int, output_dir,
                       output_file, positive_int)
from . import add_preset_arg

NAME = "waterfall"
HELP = "the ladder of techniques, one rung at a time: table + figure"


def configure(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p, default="small")
    add_dataset_arg(p)
    add_device_arg(p)
    p.add_argument("--ranks", type=positive_int, default=1,
                   help="data-parallel ranks (gloo on CPU; CPU: at most 4 per core unless GEMREF_MAX_RANKS=N)")
    p.add_argument("--windows", type=int_at_least(3), default=3, help="timed windows per rung (>= 3), interleaved across rungs")
    p.add_argument("--steps-per-window", type=positive_int, default=4, help="optimisation steps per timed window")
    p.add_argument("--warmup", type=positive_int, default=2, help="warm-up steps per rung once built (not timed)")
    p.add_argument("--window-warmup", type=nonnegative_int, default=1,
                   help="untimed steps of a rung before each of its windows")
    p.add_argument("--max-retries", type=nonnegative_int, default=None,
                   help="contended rounds re-measured over the whole run (default: --windows)")
    p.add_argument("--profile-steps", type=nonnegative_int, default=1,
                   help="profiled steps per rung for the step-time breakdown (0: none)")
    p.add_argument("--with", dest="options", metavar="A,B", default="",
                   help="GEM's later techniques in their rungs: comma-separated, of local (rung 5 balances "
                        "locally), shared (rung 5: every rank plans the global split itself), compressed_ac (rung 4 may store activations as MXFP8), window (windowed "
                        "sequence attention on every rung)")
    p.add_argument("--out", metavar="DIR", type=output_dir, default="artifacts/waterfall", help="folder for records and figures")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the waterfall record here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..train.presets import dataset_preset
    from ..runtime.locks import folder_lock
    from ..waterfall import check_options

    preset = dataset_preset(get_preset(args.preset), args.dataset)
    options = check_options([name.strip() for name in args.options.split(",") if name.strip()])
    device = device_of(args.device).type
    out = Path(args.out)
    with folder_lock(out, "--out"):         # one writer per folder (a notebooks build, another waterfall)
        return _run(args, preset, options, device, out)


def _run(args: argparse.Namespace, preset, options: tuple[str, ...], device: str, out) -> int:
    from ..report import format_table, markdown_table
    from ..runtime.files import atomic_write_text, write_json
    from ..report.figures import save_figure, waterfall_breakdown_figure, waterfall_figure
    from ..waterfall import BREAKDOWN_COLUMNS, TABLE_COLUMNS, breakdown_rows, notes, run_waterfall, table_rows

    record = run_waterfall(preset, device=device, ranks=args.ranks, windows=args.windows,
                           steps_per_window=args.steps_per_window, warmup=args.warmup,
                           window_warmup=args.window_warmup, max_retries=args.max_retries,
                           profile_steps=args.profile_steps, options=options, out_dir=out)
    if not record:          # a torchrun rank other than 0
        return 0
    rows = record["rungs"]
    title = (f"MFU waterfall: {preset.name} preset" + (f" on dataset {args.dataset}" if args.dataset else "")
             + f" on {device}, {args.ranks} rank(s); median of {args.windows} "
             f"interleaved windows x {args.steps_per_window} steps; E2E MFU = local MFU x scaling ratio"
             + (f"; with {', '.join(options)}" if options else ""))
    table, breakdown, footnotes = table_rows(rows), breakdown_rows(rows), notes(record)
    print(format_table(table, TABLE_COLUMNS, title=title))
    print(format_table(breakdown, BREAKDOWN_COLUMNS, title="where each rung's step time goes (seconds per step)"))
    print("\n".join(footnotes))
    atomic_write_text(out / "waterfall.md", f"{title}\n\n{markdown_table(table, TABLE_COLUMNS)}\n\n"
                      f"{markdown_table(breakdown, BREAKDOWN_COLUMNS)}\n\n" + "".join(f"- {n}\n" for n in footnotes))
    written = save_figure(waterfall_figure(rows), out / "waterfall")
    written += save_figure(waterfall_breakdown_figure(rows, ranks=args.ranks), out / "waterfall_breakdown")
    if args.json:
        written.append(write_json(args.json, record))
    print("wrote " + ", ".join(map(str, [out / "waterfall.json", out / "waterfall.md", *written])))
    return 0
