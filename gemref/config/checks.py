"""Range and choice checks that every config dataclass runs when it is built.

Each raises a UsageError (a ValueError) naming the field and the value given: a bad value is
refused, never clamped. `name` is what the user writes (a TrainConfig switch keeps its
command-line name: `ac_budget`, not `ActivationCheckpointConfig.budget`).
"""
from __future__ import annotations

from typing import Any

from ..errors import UsageError

MAX_SEED = 2 ** 63 - 1      # seeds reach torch.manual_seed and int64 records: larger ones overflow there


def at_least(cfg: Any, low: int, *names: str) -> None:
    """Each field in `names` is >= `low`."""
    for name in names:
        if getattr(cfg, name) < low:
            raise UsageError(f"{type(cfg).__name__}.{name} must be >= {low}, got {getattr(cfg, name)}")


def positive(cfg: Any, *names: str) -> None:
    """Each field in `names` is > 0."""
    for name in names:
        if not getattr(cfg, name) > 0:
            raise UsageError(f"{type(cfg).__name__}.{name} must be > 0, got {getattr(cfg, name)}")


def check_seed(cfg: Any) -> None:
    """`cfg.seed` is in [0, MAX_SEED]."""
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UsageError(f"{type(cfg).__name__}.seed must be in [0, 2**63 - 1], got {cfg.seed}")


def require(ok: bool, message: str) -> None:
    """A rule of the caller's own (`message` names the fields and values): UsageError unless `ok`.
    Lets a config module keep to these helpers (gemref/model/config.py imports nothing else)."""
    if not ok:
        raise UsageError(message)


def one_of(name: str, value: Any, valid: tuple[str, ...]) -> None:
    """`value` (of the field the user knows as `name`) is one of `valid`."""
    if value not in valid:
        raise UsageError(f"{name}={value!r}; valid: {', '.join(valid)}")
