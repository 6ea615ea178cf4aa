"""The load-balance section (rung 5): how each global batch is split across ranks (gemref/balance/)."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

# none: round_robin's equal counts (DistributedSampler's split); lpt, kk: split each global batch
# by cost (every rank plans the same split from the lengths it holds); local: no exchange at all.
BALANCE_POLICIES = ("none", "lpt", "kk", "local")
# Names that were other names of one of these policies: refused, naming the one to use.
RENAMED = {"shared": "lpt", "round_robin": "none"}


@dataclass(frozen=True)
class BalanceConfig(Section):
    policy: str = switch("none", "balance", "rung 5: split global batches across ranks by cost", BALANCE_POLICIES)

    def __post_init__(self) -> None:
        if self.policy in RENAMED:
            raise UsageError(f"balance={self.policy!r} is policy {RENAMED[self.policy]!r} under another name: "
                             f"use balance={RENAMED[self.policy]!r}; valid: {', '.join(BALANCE_POLICIES)}")
        super().__post_init__()
