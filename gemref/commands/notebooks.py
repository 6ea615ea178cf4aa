"""`gemref notebooks run|build`: execute the notebooks headless (papermill) with a parameter profile and
grid; `build` also writes the static reading copy (gemref/walkthrough/book.py)."""
from __future__ import annotations

import argparse

from ..options import check_output_dir, output_dir, output_file, split_pairs

NAME = "notebooks"
HELP = "run the notebooks headless (papermill)"
BUDGET_HELP = ("exit 1 if a notebook ran over its profile's CPU budget (default: report it); "
               "for sizing a profile on an idle machine")


def configure(p: argparse.ArgumentParser) -> None:
    which = p.add_subparsers(dest="notebooks_command", metavar="ACTION", required=True)
    r = which.add_parser("run", help="execute notebooks with a parameter profile (and grid)")
    r.add_argument("notebooks", nargs="*", help="notebook names (default: all), e.g. 00_mfu_baseline")
    r.add_argument("--profile", default="ci", help="notebooks/params/<profile>.yaml: ci, cpu, gpu")
    r.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="override a parameter; typed like its default in the notebook, e.g. STEPS=20 or RANKS=[8,64]")
    r.add_argument("--grid", metavar="FILE", help="YAML mapping parameter -> list of values (cartesian product)")
    r.add_argument("--out", metavar="DIR", type=output_dir, help="output folder (default: artifacts/notebooks/<profile>-<date>)")
    r.add_argument("--json", metavar="PATH", type=output_file, help="write the batch's rows (time, metrics) here")
    r.add_argument("--enforce-budget", action="store_true", help=BUDGET_HELP)
    r.set_defaults(func=run)
    b = which.add_parser("build", help="execute the chapters under a profile, write the static reading copy")
    b.add_argument("notebooks", nargs="*", help="chapter names (default: all), e.g. 02_flash_attention")
    b.add_argument("--profile", default="ci", help="notebooks/params/<profile>.yaml: ci, cpu, gpu")
    b.add_argument("--out", metavar="DIR", type=output_dir, help="output folder (default: artifacts/book/<profile>)")
    b.add_argument("--json", metavar="PATH", type=output_file, help="write the chapters' rows (time, metrics) here")
    b.add_argument("--enforce-budget", action="store_true", help=BUDGET_HELP)
    b.set_defaults(func=build)


def run(args: argparse.Namespace) -> int:
    import datetime
    import sys
    from pathlib import Path

    from ..runtime.locks import folder_lock
    from ..walkthrough.batch import NotebookFailure, run_notebooks
    from ..walkthrough.params import load_grid, parse_params, select_notebooks
    from ..runtime.files import write_json
    from ..report import format_table

    params = parse_params(split_pairs(args.param, "--param"), select_notebooks(args.notebooks))
    grid = load_grid(args.grid) if args.grid else None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or check_output_dir(f"artifacts/notebooks/{args.profile}-{stamp}", "--out"))
    try:
        with folder_lock(out, "--out"):
            rows = run_notebooks(args.profile, out, names=args.notebooks, params=params, grid=grid,
                                 enforce_budget=args.enforce_budget)
    except NotebookFailure as e:
        print(f"gemref notebooks: {e}", file=sys.stderr)
        return 1
    long = [{"notebook": r["notebook"], "metric": k, "value": v} for r in rows for k, v in r.items()
            if k != "notebook"]
    print(format_table(long, title=f"notebook metrics ({args.profile}); wide table: {out}/summary.csv"))
    if args.json:
        write_json(args.json, {"kind": "notebooks", "profile": args.profile, "out": str(out), "rows": rows})
    return 0


def build(args: argparse.Namespace) -> int:
    """`gemref notebooks build`: exit 0, or 1 naming the chapter that failed (or, with
    --enforce-budget, ran over its budget)."""
    import sys
    from pathlib import Path

    from ..runtime.files import write_json
    from ..runtime.locks import folder_lock
    from ..walkthrough.batch import read_summary
    from ..walkthrough.book import build_book
    from ..walkthrough.batch import NotebookFailure

    out = Path(args.out or check_output_dir(f"artifacts/book/{args.profile}", "--out"))
    try:
        with folder_lock(out, "--out"):      # one writer per folder (another build, a waterfall)
            build_book(args.profile, out, names=args.notebooks or None, enforce_budget=args.enforce_budget)
    except NotebookFailure as e:
        print(f"gemref notebooks build: {e}", file=sys.stderr)
        return 1
    if args.json:
        write_json(args.json, {"kind": "book", "profile": args.profile, "out": str(out),
                               "rows": read_summary(out / "executed")})
    return 0
