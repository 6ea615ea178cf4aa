"""Benchmark commands: `gemref bench NAME ...`, one module per NAME in this package.

Each module defines `configure_parser(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`, prints a table (gemref.report.format_table) and, with
`--json PATH`, writes its record. Timing follows docs/design.md: warm-up, repetitions, medians,
variants side by side in one run.
"""
import pkgutil


def bench_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
