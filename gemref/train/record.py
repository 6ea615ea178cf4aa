"""A TrainConfig as a record stores it, and back: the run record's config version.

Records (gemref/report/records.py, the waterfall's) store `dataclasses.asdict(train)`:
version 2 nests each section under its name ({"attention": {"jagged": ..., "kernel": ...},
...}). Version 1 (records written before the sections; they carry no version) stored every
switch flat under its switch name ({"jagged": ..., "ac_budget": ...}); such records still load,
their names routed as `override` routes them, a switch they lack taking its default (it did
not exist yet). Version 3 added the parallel section's `table_optimizer` and
`table_sync_interval` (gemref/parallel/rowwise.py); a version-2 record lacks exactly those, which
take their defaults (the AdamW tables every version-2 run trained). Version 4 added `table_lr`: a
version-2 or 3 record lacks it; row-wise tables then trained at the dense lr, which it takes (adamw
tables: the default). A record is a file someone handed in: every value is checked as the
dataclasses check it, and in a record of version 2 or later an unknown key, any other missing
key, or a version newer than this code, is a UsageError, never a silent default.

Values a later gemref renamed (`RENAMED`) load under their new name, in any version: ac
"pt2" is "memory_budget" (torchtitan's name for PyTorch 2's activation_memory_budget).
"""
from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any

from ..errors import UsageError
from .config import TrainConfig, sections, with_switches

RECORD_VERSION = 4                # the "record_version" of every record gemref writes
READABLE_VERSIONS = (1, 2, 3, 4)  # 1: flat switches, no "record_version" key
ADDED_IN = {3: {"parallelism": ("table_optimizer", "table_sync_interval")},   # version: {section: new fields}
            4: {"parallelism": ("table_lr",)}}
# (section, field, switch name) -> {old value: new value}
RENAMED = {("activation_checkpoint", "mode", "ac"): {"pt2": "memory_budget"}}


def _renamed(section: str | None, name: str, value: Any) -> Any:
    for (sec, field_name, flag), values in RENAMED.items():
        if (name == flag if section is None else (section, name) == (sec, field_name)) and isinstance(value, str):
            return values.get(value, value)
    return value


def train_as_record(train: TrainConfig) -> dict[str, Any]:
    """The JSON-able dict a record stores (sections nested)."""
    return asdict(train)


def record_version(record: dict) -> int:
    """A record's version: its "record_version" (1 where it has none); a version this code does
    not read is a UsageError."""
    version = record.get("record_version", 1)
    if version not in READABLE_VERSIONS:
        raise UsageError(f"record_version {version!r}: this gemref reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))} (a newer gemref wrote it?)")
    return version


def train_from_record(stored: Any, version: int) -> TrainConfig:
    """The TrainConfig a record of `version` stored (`record["config"]["train"]`)."""
    if not isinstance(stored, dict):
        raise UsageError(f"record config.train must be an object, got {type(stored).__name__}")
    if version == 1:
        return with_switches(TrainConfig(), **{k: _renamed(None, k, v) for k, v in stored.items()})
    _no_unknown_keys("record config.train", stored, TrainConfig)
    values = {}
    for name, value in stored.items():
        if name in sections():
            if not isinstance(value, dict):
                raise UsageError(f"record config.train.{name} must be an object, got {type(value).__name__}")
            _no_unknown_keys(f"record config.train.{name}", value, sections()[name])
            newer = {f for v, added in ADDED_IN.items() if version < v for f in added.get(name, ())}
            _no_missing_keys(f"record config.train.{name}", value, sections()[name], newer)
            value = sections()[name](**{k: _renamed(name, k, v) for k, v in value.items()})
        values[name] = value
    _no_missing_keys("record config.train", stored, TrainConfig)
    train = TrainConfig(**values)
    if version < 4 and train.parallelism.table_optimizer != "adamw":   # before table_lr: row-wise tables ran at lr
        train = replace(train, parallelism=replace(train.parallelism, table_lr=train.lr))
    return train


def _no_unknown_keys(where: str, stored: dict, cls: type) -> None:
    if unknown := sorted(set(stored) - {f.name for f in fields(cls)}):
        raise UsageError(f"{where} has unknown field(s) {unknown}")


def _no_missing_keys(where: str, stored: dict, cls: type, newer=frozenset()) -> None:
    """`newer`: fields added after the record's version, which it may lack (they take their defaults)."""
    if missing := sorted({f.name for f in fields(cls)} - set(stored) - set(newer)):
        raise UsageError(f"{where} lacks field(s) {missing}")
