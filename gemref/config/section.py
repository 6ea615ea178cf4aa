"""What every section of TrainConfig shares: fields that are command-line switches.

A section is one technique's settings, defined beside its code (gemref/attention/config.py,
gemref/compile/config.py, ...; TrainConfig in gemref/train/config.py has one field per section): a frozen
dataclass whose fields are made with `switch`, which records the field's command-line name
(its flag: `ac_budget` for ActivationCheckpointConfig.budget), its help line and, for a
string, its valid values. `gemref train --ac-budget 0.5`, `--set ac_budget=0.5` and
`override(train, ac_budget=0.5)` all use that name (gemref/train/config.py routes it), so the
command line stayed flat when the config grew sections. A section checks its own fields when
built (type, valid values, then `check` for its own rules); rules that span sections live in
TrainConfig.
"""
from __future__ import annotations

from dataclasses import Field, field, fields
from typing import Any

from .checks import one_of
from .values import check_field_types


def switch(default: Any, flag: str, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A section field: its default, its command-line name, help line and valid values (strings)."""
    return field(default=default, metadata={"flag": flag, "help": help, "choices": choices})


def flag_of(f: Field) -> str:
    return f.metadata["flag"]


class Section:
    """Base of TrainConfig's sections: type and choice checks by flag name, then `check`."""

    def __post_init__(self) -> None:
        flags = {f.name: flag_of(f) for f in fields(self)}   # type: ignore[arg-type]
        check_field_types(self, flags.__getitem__)
        for f in fields(self):   # type: ignore[arg-type]
            if f.metadata["choices"]:
                one_of(flags[f.name], getattr(self, f.name), f.metadata["choices"])
        self.check()

    def check(self) -> None:
        """The section's own rules beyond types and choices (UsageError naming the flags)."""
