"""`override`: a config dataclass with some fields changed, by name, checked."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from ..errors import UsageError
from .config import TrainConfig, with_switches


def override(cfg: Any, **changes: Any) -> Any:
    """`dataclasses.replace` that rejects unknown field names with a UsageError listing the valid
    ones. A TrainConfig takes its switches by their flat names (`override(train, ac="auto",
    ac_budget=0.5)`), as the command line does (gemref/train/config.py `with_switches`)."""
    if isinstance(cfg, TrainConfig):
        return with_switches(cfg, **changes)
    valid = {f.name for f in fields(cfg)}
    unknown = sorted(set(changes) - valid)
    if unknown:
        raise UsageError(f"unknown {type(cfg).__name__} field(s) {unknown}; valid: {', '.join(sorted(valid))}")
    return replace(cfg, **changes)
