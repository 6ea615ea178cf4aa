"""`gemref bench NAME`: the benchmark modules of gemref/bench/, each imported only when it runs."""
from __future__ import annotations

import argparse
import importlib

from ..bench import bench_names, bench_summary

NAME = "bench"
HELP = "benchmarks: " + ", ".join(bench_names())


def _configure_bench(name: str, p: argparse.ArgumentParser) -> None:
    module = importlib.import_module(f"gemref.bench.{name}")
    module.configure_parser(p)
    p.set_defaults(func=module.run)


def configure(p: argparse.ArgumentParser) -> None:
    which = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name in bench_names():
        # `configure` runs when this bench is the one chosen (gemref/cli.py's LazyParser)
        which.add_parser(name, help=bench_summary(name), description=bench_summary(name),
                         configure=lambda parser, name=name: _configure_bench(name, parser))
