"""The subcommands of `gemref`, one module each (gemref/cli.py lists them in COMMANDS).

A command module defines
    NAME: str                        the subcommand, `gemref NAME ...`
    HELP: str                        its line in `gemref --help`
    configure(parser) -> None        adds its options and sets `func` (run(args) -> exit status)
                                     with parser.set_defaults; nested actions set their own
and imports nothing heavy at module level: `gemref --help` imports every command module, but
only the command being run is configured (gemref/cli.py's LazyParser), and work-doing
modules are imported inside the functions that run.

Conventions every command follows (docs/design.md, "CLI conventions"):
    --device auto|cpu|cuda   default auto (cuda when available)
    --steps N                optimisation steps of one training run; counts of anything else are
                             named for it: --steps-per-window, --steps-per-strategy, ...
    --json PATH / --out DIR  checked before any work starts (gemref/options.py)
    user mistakes            UsageError (gemref/errors.py): one line on stderr, exit 2
    --preset NAME            `add_preset_arg` below (the other shared arguments: gemref/options.py,
                             which sits in the bottom layer and so cannot see the presets)
"""
from __future__ import annotations

import argparse

from ..train.presets import PRESETS


def add_preset_arg(p: argparse.ArgumentParser, default: str = "tiny", help: str = "model/data preset") -> None:
    """--preset NAME, one of PRESETS (gemref/train/presets.py)."""
    p.add_argument("--preset", default=default, choices=list(PRESETS), help=help)

