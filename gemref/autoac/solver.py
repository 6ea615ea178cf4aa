"""AutoAC's solver: one option per block, the least recompute whose activation bytes fit a
budget (a multiple-choice knapsack, solved exactly; the idea: gemref/autoac/__init__.py).

Cost of a plan = the sum over its blocks of the chosen option's cost, by `objective`:
"time" (default) the measured recompute seconds, "flops" the recomputed FLOPs; ties go to the
other measure, then to the plan that frees (so recomputes) fewer bytes. Comparing these
tuples lexicographically is compatible with adding them, which is what makes the pruning
below exact.

The dynamic programme keeps, after each block, the Pareto set of partial plans (bytes freed,
capped at what the budget needs; cost), dropping a partial plan when another frees at least
as much at no more cost: a dominated partial plan can never complete into a better plan.
Bytes are large integers (10^6..10^10), so no table over bytes (which would need rounding).
The set stays small because blocks of one kind repeat with near-equal figures. Options that
free nothing are never chosen.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from .apply import LETTERS

OBJECTIVES = ("time", "flops")


@dataclass(frozen=True)
class BlockProfile:
    """One block's figures on the profiled step (bytes, FLOPs, seconds)."""

    name: str                        # the block's module path (fqn)
    saved_bytes: int                 # bytes it saves for backward, storages deduplicated
    forward_flops: int               # FLOPs of its forward (FlopCounterMode)
    freed_bytes: dict[str, int] = field(default_factory=dict)          # option -> bytes freed
    recompute_flops: dict[str, int] = field(default_factory=dict)      # option -> FLOPs recomputed
    recompute_seconds: dict[str, float] = field(default_factory=dict)  # option -> seconds (median)


@dataclass(frozen=True)
class ActivationProfile:
    base_bytes: int                  # activation bytes of a step with nothing checkpointed
    blocks: tuple[BlockProfile, ...]
    options: tuple[str, ...]         # options measured (besides "none")
    method: str                      # how bytes were measured (gemref/autoac/profile.py)
    step_flops: int                  # FLOPs of the profiled step, forward + backward, no recompute

    @property
    def min_bytes(self) -> int:
        """The least activation memory any plan reaches."""
        return self.base_bytes - sum(max([0] + list(b.freed_bytes.values())) for b in self.blocks)


@dataclass(frozen=True)
class Plan:
    choices: dict[str, str]          # block fqn -> option (blocks left out: "none")
    blocks: tuple[str, ...]          # every profiled block, in forward order
    budget_bytes: int | None
    predicted_bytes: int             # base_bytes - freed
    recompute_flops: int             # on the profiled step (HFU counts them)
    recompute_seconds: float         # on the profiled step
    objective: str = "time"

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.choices.values()))

    def summary(self) -> str:
        """One letter per block (LETTERS: - none, S save_matmuls, F full, C compressed), grouped
        by the last non-numeric part of the block's name: GEMRef's "layers.{i}.{kind}" give
        "sequence:SF interaction:-- cross:F-" (per kind, layer by layer)."""
        return " ".join(f"{key}:" + "".join(LETTERS[self.choices.get(n, "none")] for n in names)
                        for key, names in groups(self.blocks).items())

    def is_full_checkpointing(self) -> bool:
        return bool(self.blocks) and all(self.choices.get(n) == "full" for n in self.blocks)

    def as_record(self) -> dict:
        return {"choices": dict(self.choices), "counts": self.counts(), "summary": self.summary(),
                "budget_bytes": self.budget_bytes, "predicted_bytes": self.predicted_bytes,
                "recompute_flops": self.recompute_flops, "recompute_seconds": self.recompute_seconds,
                "objective": self.objective}


def groups(blocks) -> dict[str, list[str]]:
    """Block names grouped by their last non-numeric part ("layers.3.cross" -> "cross"; a name
    with none, e.g. "stack.0", by its first part), in order of first appearance."""
    out: dict[str, list[str]] = {}
    for name in blocks:
        parts = [p for p in name.split(".") if not p.isdigit()] or [name]
        out.setdefault(parts[-1], []).append(name)
    return out


def parse_plan(text: str, blocks) -> dict[str, str]:
    """Plan.summary() text -> {block fqn: option} of the blocks it wraps, for the blocks in
    forward order (`blocks`); ValueError naming what is wrong."""
    letters = {v: k for k, v in LETTERS.items()}
    expected = groups(blocks)
    parts = dict(part.split(":", 1) for part in text.split() if ":" in part)
    if sorted(parts) != sorted(expected) or len(text.split()) != len(expected):
        raise ValueError(f"plan {text!r}: expected one 'group:letters' per block group "
                         f"({', '.join(expected)}), e.g. {' '.join(k + ':' + '-' * len(v) for k, v in expected.items())!r}")
    choices = {}
    for key, row in parts.items():
        if len(row) != len(expected[key]) or any(c not in letters for c in row):
            raise ValueError(f"plan {text!r}: {key} needs {len(expected[key])} letters of "
                             f"{''.join(letters)} (one per block), got {row!r}")
        choices.update({n: letters[c] for n, c in zip(expected[key], row) if letters[c] != "none"})
    return choices


def plan_of(profile: ActivationProfile, choices: Mapping[str, str], budget_bytes: int | None = None,
            objective: str = "time") -> Plan:
    """The Plan (predicted bytes, recompute FLOPs and seconds) of given choices, from the profile."""
    by_name = {b.name: b for b in profile.blocks}
    picked = {n: o for n, o in choices.items() if o != "none"}
    if unknown := [n for n in picked if n not in by_name]:
        raise ValueError(f"blocks {unknown} are not in the profile ({', '.join(by_name)})")
    return Plan(picked, tuple(by_name), budget_bytes,
                profile.base_bytes - sum(by_name[n].freed_bytes[o] for n, o in picked.items()),
                sum(by_name[n].recompute_flops[o] for n, o in picked.items()),
                sum(by_name[n].recompute_seconds[o] for n, o in picked.items()), objective)


def solve(profile: ActivationProfile, budget_bytes: int, objective: str = "time") -> Plan:
    """The least-cost plan (module docstring) whose activation bytes fit `budget_bytes`.

    A budget at or above `profile.base_bytes` gives the empty plan; one below
    `profile.min_bytes` (every block at its most memory-saving option) is a ValueError.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}; valid: {', '.join(OBJECTIVES)}")
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
    if budget_bytes < profile.min_bytes:
        raise ValueError(f"activation budget {budget_bytes:,} bytes is below the minimum achievable "
                         f"{profile.min_bytes:,} bytes (every block at its most memory-saving option; "
                         f"{profile.base_bytes:,} bytes with no checkpointing)")
    need = profile.base_bytes - budget_bytes
    if need <= 0:
        return plan_of(profile, {}, budget_bytes, objective)
    feasible = [s for s in partial_plans(profile, need, objective) if s[0] >= need]
    _, _, choices = min(feasible, key=lambda s: s[1])
    plan = plan_of(profile, dict(zip((b.name for b in profile.blocks), choices)), budget_bytes, objective)
    assert plan.predicted_bytes <= budget_bytes
    return plan


def option_cost(block: BlockProfile, option: str, objective: str = "time") -> tuple:
    """The lexicographic cost of one block's option (module docstring)."""
    if option == "none":
        return (0, 0, 0)
    seconds, flops = block.recompute_seconds[option], block.recompute_flops[option]
    return ((seconds, flops) if objective == "time" else (flops, seconds)) + (block.freed_bytes[option],)


def partial_plans(profile: ActivationProfile, need: int, objective: str = "time") -> list[tuple]:
    """The dynamic programme: the undominated plans as (bytes freed capped at `need`, cost,
    one option per block). With need > every plan's bytes freed nothing is capped, and the
    list holds every plan on the Pareto front of bytes freed vs cost."""
    states: list[tuple] = [(0, (0, 0, 0), ())]
    for block in profile.blocks:
        useful = [(o, block.freed_bytes[o], option_cost(block, o, objective)) for o in profile.options
                  if block.freed_bytes[o] > 0]
        grown = [(cap, cost, ch + ("none",)) for cap, cost, ch in states]
        grown += [(min(cap + f, need), tuple(a + b for a, b in zip(cost, c)), ch + (o,))
                  for cap, cost, ch in states for o, f, c in useful]
        states = _pareto(grown)
    return states


def _pareto(states):
    """Drop every partial plan that another frees at least as much for at most the cost."""
    states.sort(key=lambda s: (-s[0], s[1]))
    kept, best = [], None
    for s in states:
        if best is None or s[1] < best:
            kept.append(s)
            best = s[1]
    return kept
