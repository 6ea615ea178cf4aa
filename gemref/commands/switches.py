"""TrainConfig on the command line: one option per setting and per switch, derived from the dataclasses.

Each name `foo_bar` (a TrainConfig setting such as `lr`, or a section's switch such as
`ac_budget`, gemref/train/config.py) becomes `--foo-bar VALUE`, parsed by the field's declared
type (gemref/config/values.py); a bool becomes `--foo-bar/--no-foo-bar`; a string with valid
values lists them. The help line and the valid values live beside each field, in its section's module;
every option defaults to the preset's value. `--set KEY=VALUE` sets any of them too (the same
typed parsing), so scripts written against either form work.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from ..train.config import TrainConfig, sections, settings, switch_fields
from ..train.override import override
from ..config.values import field_types, parse_as
from ..errors import UsageError
from ..options import output_dir, split_pairs

CHECKPOINT_SWITCHES = ("checkpoint_dir", "checkpoint_every", "resume", "checkpoint_overwrite")   # `train` only


def switch_specs() -> dict[str, tuple[Any, str, tuple[str, ...]]]:
    """{name: (declared type, help, valid values)} of every setting and switch of TrainConfig."""
    types = field_types(TrainConfig)
    specs = {name: (types[name], f.metadata["help"], ()) for name, f in settings().items()}
    for flag, (section, f) in switch_fields().items():
        specs[flag] = (field_types(sections()[section])[f.name], f.metadata["help"], f.metadata["choices"])
    return specs


def _typed(tp) -> Callable[[str], object]:
    def parse(text: str):
        try:
            return parse_as(tp, text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = tp.__name__ if isinstance(tp, type) else str(tp)
    return parse


def add_train_switches(p: argparse.ArgumentParser, *, checkpoints: bool = False) -> None:
    """One option per TrainConfig setting and switch (checkpoint switches only with `checkpoints`), and --set."""
    group = p.add_argument_group("training switches (TrainConfig settings and sections; default: the preset's)")
    for name, (tp, help, choices) in switch_specs().items():
        if name in CHECKPOINT_SWITCHES and not checkpoints:
            continue
        flag = "--" + name.replace("_", "-")
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        elif choices:
            group.add_argument(flag, choices=choices, default=None, help=help)
        else:
            kind = output_dir if name == "checkpoint_dir" else _typed(tp)
            group.add_argument(flag, type=kind, default=None, metavar=name.upper(), help=help)
    group.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="set a TrainConfig setting or switch by name, e.g. lr=0.001 (typed as the field)")


def parse_switch(name: str, text: str) -> Any:
    """The value of setting or switch `name` written as `text` (UsageError: unknown name, bad value)."""
    specs = switch_specs()
    if name not in specs:
        raise UsageError(f"unknown TrainConfig field {name!r}; valid: {', '.join(sorted(specs))}")
    tp, _, choices = specs[name]
    value = parse_as(tp, text, f"TrainConfig.{name}" if name in settings() else name)
    if choices and value not in choices:
        raise UsageError(f"--set {name}={text}: valid: {', '.join(choices)}")
    return value


def train_changes(args: argparse.Namespace) -> dict:
    """{name: value} of every setting and switch given as an option or by --set."""
    changes = {name: getattr(args, name) for name in switch_specs() if getattr(args, name, None) is not None}
    for name, text in split_pairs(args.set, "--set").items():
        if name in changes:
            raise UsageError(f"{name} given both as --{name.replace('_', '-')} and by --set")
        changes[name] = parse_switch(name, text)
    return changes


def train_config_from_args(args: argparse.Namespace, base: TrainConfig) -> TrainConfig:
    """`base` with every setting and switch given on the command line (UsageError on a bad value)."""
    return override(base, **train_changes(args))
