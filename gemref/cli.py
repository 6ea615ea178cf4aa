"""The `gemref` command (also `python -m gemref`).

Each subcommand prints a readable table and, with `--json PATH`, writes its record. A user
mistake (a bad flag, value or path: argparse's errors and gemref.errors.UsageError) prints one
line on stderr and exits 2; any other error is a bug and keeps its traceback (exit 1). SIGINT
(Ctrl-C) or SIGTERM stops a command cleanly: its children are killed (the launcher's ranks,
the notebooks' kernels), temporary files removed, folder locks released, and it prints one
line and exits 130 (SIGINT) or 143 (SIGTERM) (gemref/runtime/interrupt.py).

Subcommands live in gemref/commands/ (one module each; see its docstring for the contract).
Registering one is one line in COMMANDS. Only the subcommand being run is configured, so
`gemref --help` imports no benchmark, torch or data code.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from typing import Callable

from .options import data_dir, peak_tflops
from .errors import UsageError
from .runtime.interrupt import Interrupted, signals_raise

COMMANDS = (
    "gemref.commands.data",
    "gemref.commands.train",
    "gemref.commands.flops",
    "gemref.commands.peak",
    "gemref.commands.bench",
    "gemref.commands.waterfall",
    "gemref.commands.simulate",
    "gemref.commands.notebooks",
)
PEAK_HELP = ("one device's dense peak TFLOP/s per dtype, e.g. bf16=989,fp32=67, for a GPU the datasheet table "
             "lacks (or to override it); MFUs then divide by it, labelled as given by the user (sets "
             "$GEMREF_PEAK_TFLOPS, which spawned ranks and notebook kernels read)")
DATA_HELP = ("folder of the generated datasets (overrides $GEMREF_DATA_DIR; default: data/generated in a "
             "source checkout, else ~/.cache/gemref/data); also passed to spawned ranks and notebook kernels")


class LazyParser(argparse.ArgumentParser):
    """An ArgumentParser that (1) adds its options only when it parses, via `configure`, so a
    subcommand's imports happen only when that subcommand runs, and (2) reports an error in
    one line, with close matches for a mistyped option."""

    def __init__(self, *args, configure: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)    # --steps must never silently mean --steps-per-window
        super().__init__(*args, **kwargs)
        self._configure = configure

    def configured(self) -> "LazyParser":
        """This parser with its options added (configure runs once)."""
        if self._configure is not None:
            configure, self._configure = self._configure, None
            configure(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.configured().set_defaults(command_parser=self)
        return super().parse_known_args(args, namespace)

    def unknown(self, extra: list[str]) -> None:
        options = [o for a in self._actions for o in a.option_strings]
        hints = []
        for flag in (x.split("=")[0] for x in extra if x.startswith("--")):
            longer = [o for o in options if o.startswith(flag)]    # --steps -> --steps-per-window
            hints += longer or difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
        self.error(f"unrecognized arguments: {' '.join(extra)}"
                   + (f" (did you mean {', '.join(hints)}?)" if hints else f" (see {self.prog} --help)"))

    def error(self, message: str):
        for action in self._actions:      # a missing subcommand: say which there are
            if isinstance(action, argparse._SubParsersAction) and message.endswith(f"required: {action.metavar}"):
                message += f" (choose from {', '.join(action.choices)})"
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> LazyParser:
    parser = LazyParser(prog="gemref", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--data", metavar="DIR", type=data_dir, default=argparse.SUPPRESS, help=DATA_HELP)
    parser.add_argument("--peak-tflops", metavar="DTYPE=TFLOPS", type=peak_tflops, default=argparse.SUPPRESS,
                        help=PEAK_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=LazyParser)
    for path in COMMANDS:
        module = importlib.import_module(path)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP, configure=module.configure)
        p.add_argument("--data", metavar="DIR", type=data_dir, default=argparse.SUPPRESS,
                       help="folder of the generated datasets (overrides $GEMREF_DATA_DIR; see gemref --help)")
        p.add_argument("--peak-tflops", metavar="DTYPE=TFLOPS", type=peak_tflops, default=argparse.SUPPRESS,
                       help=PEAK_HELP)
    return parser


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        command_parser = vars(args).pop("command_parser", parser)
        if extra:
            command_parser.unknown(extra)
    except SystemExit as e:          # argparse: --help (0) or a usage error (2, one line printed)
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    saved = {name: os.environ.get(name) for name in ("GEMREF_DATA_DIR", "GEMREF_PEAK_TFLOPS")}
    if getattr(args, "data", None):      # the env vars reach spawned ranks and notebook kernels
        os.environ["GEMREF_DATA_DIR"] = os.path.abspath(args.data)
    if getattr(args, "peak_tflops", None):
        os.environ["GEMREF_PEAK_TFLOPS"] = args.peak_tflops
    try:
        with signals_raise():
            from .env import check_environment   # every knob, before any command's work (imports torch)

            check_environment()
            return int(args.func(args) or 0)
    except UsageError as e:
        print(f"{command_parser.prog}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"{command_parser.prog}: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


if __name__ == "__main__":
    sys.exit(main())
