"""The `gemref` command (also `python -m gemref`).

Each subcommand prints a readable table and, with `--json PATH`, writes its record. A user
mistake (ValueError) exits 2 with one clear line and no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .bench import bench_names


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(bench_names()))
    which = bench.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name in bench_names():
        module = importlib.import_module(f"gemref.bench.{name}")
        p = which.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.configure_parser(p)
        p.set_defaults(func=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemref", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_bench(sub)
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on unknown commands/choices
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        print(f"gemref {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
