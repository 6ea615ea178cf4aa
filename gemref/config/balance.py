"""The load-balance section (rung 5): how each global batch is split across ranks."""
from __future__ import annotations

from dataclasses import dataclass

from .section import Section, switch

BALANCE_POLICIES = ("none", "round_robin", "lpt", "kk", "local", "shared")   # gemref/balance/ (none: equal counts)


@dataclass(frozen=True)
class BalanceConfig(Section):
    policy: str = switch("none", "balance", "rung 5: split global batches across ranks by cost", BALANCE_POLICIES)
