"""The GPU check's time budget: ONE device call holds the whole check.

The lent device machine runs a command for at most 10 minutes and lends 15 minutes in all, its
start-up (a few minutes) included. So the whole check gets one overall budget (default
DEFAULT_BUDGET_S = 300 s, 5 minutes, the wheel install included; `--budget S` or
GEMREF_GPU_BUDGET_S=S set another), and its sections run in priority order (__main__.SECTIONS).
Before each, `Budget.plan` compares the time left with the section's estimate: a section that
cannot fit its estimate is skipped with that reason, in the summary, and the next (cheaper)
one may still fit; one that fits runs within min(its own cap, the time left). The clock is a
parameter so that tests run this logic on a fake clock.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

from .children import Section

BUDGET_ENV = "GEMREF_GPU_BUDGET_S"
DEFAULT_BUDGET_S = 300.0      # 5 minutes a call: the sections' estimates (285 s) fit, and a skipped or
                              # failed section reruns alone (--sections NAME) within the device's 15 minutes
DRY_BUDGET_S = 300.0          # the CPU dry run's safety net: it took 104 s on a shared 2-core Xeon


def total_budget(flag_s: float | None, dry_run: bool, environ: Mapping[str, str]) -> tuple[float, str]:
    """(seconds, where they came from): --budget, else $GEMREF_GPU_BUDGET_S, else the default.
    ValueError (the driver's one-line usage error) for a value that is not a positive number."""
    if flag_s is not None:
        value, source = flag_s, "--budget"
    elif environ.get(BUDGET_ENV, "").strip():
        text = environ[BUDGET_ENV].strip()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{BUDGET_ENV}={text!r}: expected seconds, e.g. {BUDGET_ENV}=300") from None
        source = BUDGET_ENV
    else:
        return (DRY_BUDGET_S, "default (dry run)") if dry_run else (DEFAULT_BUDGET_S, "default")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{source} {value:g}: the check's budget must be a positive number of seconds")
    return value, source


class Budget:
    """Seconds left until the check's deadline, on `clock` (time.monotonic; a fake in tests).
    `spent_s`: what went before the clock started (scripts/gpu_check.sh's wheel install)."""

    def __init__(self, total_s: float, spent_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.total_s, self.clock = total_s, clock
        self.deadline = clock() + total_s - spent_s

    def left_s(self) -> float:
        return self.deadline - self.clock()

    def plan(self, section: Section, dry_run: bool) -> tuple[float | None, str | None]:
        """(seconds to give it, None), min(its cap, the time left); or (None, the skip reason)
        when the time left cannot fit the section's estimate."""
        estimate = section.dry_estimate_s if dry_run else section.estimate_s
        cap = section.dry_budget_s if dry_run else section.budget_s
        left = self.left_s()
        if left < estimate:
            return None, (f"skipped: out of time ({max(left, 0):.0f} s left of the {self.total_s:.0f} s budget, "
                          f"it needs ~{estimate} s; rerun it alone with --sections {section.name})")
        return min(cap, left), None
