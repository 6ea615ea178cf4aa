"""Benchmark commands: `gemref bench NAME ...`, one module per NAME in this package.

Each module defines `configure_parser(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`, prints a table (gemref.report.format_table) and, with
`--json PATH`, writes its record. Timing follows docs/design.md: warm-up, repetitions, medians,
variants side by side in one run. The first line of a module's docstring is its help line.

Listing the benches imports none of them (`gemref --help` stays light): names come from
pkgutil, help lines from each module's source.
"""
import ast
import pkgutil
from pathlib import Path


def bench_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def bench_summary(name: str) -> str:
    """The first docstring line of bench module `name`, read from its source (not imported)."""
    source = (Path(__file__).parent / f"{name}.py").read_text()
    return (ast.get_docstring(ast.parse(source)) or "").strip().splitlines()[0]
