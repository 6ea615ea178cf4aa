"""The one comparison of balancing policies (chapter 06; the lab's, moved here from
gemref/balance/, which holds the policies): every policy over the steps of an epoch, on
simulated ranks. `gemref bench balance`, `gemref bench local_balance`, the scale
projection (gemref/simulate/projection.py) and chapter 06 all read these rows.

A step's time is its most loaded rank's cost (every rank waits for it at the gradient
all-reduce), so the figures are per step, then over the epoch (one row per policy):
  imbalance      max / mean rank cost of a step, median over steps (1.0 = perfect); _worst: max
  idle           share of rank-time spent waiting for the straggler, median over steps
  kept           sum over steps of the mean rank cost / sum of the max: the share of the ranks'
                 time spent working over the epoch, i.e. of single-device MFU data parallelism keeps
  lower_bound    max(dearest sample, mean rank cost) / mean rank cost, median over steps: no
                 split of that batch can do better
  of_optimum     sum over steps of that bound's max / this policy's: a conservative share of
                 the best split's throughput
  of_kk          kk's sum of max / this policy's (None when kk is not among the policies)
  gap_closed     (round_robin's sum of max - this policy's) / (round_robin's - the bound's)
  exchange_bytes bytes each rank receives per step to balance: 0 for round_robin and local,
                 and for every policy when each rank holds every sample's length (gemref's
                 sampler: `lengths_on_every_rank=True`); else lpt, kk and sorted_chunk
                 all-gather the global batch's lengths (world x per-rank batch x 8 bytes)
  plan_ms        milliseconds one rank spends planning one step
  samples/rank   fewest-most samples a rank held in a step
  displacement   steps between a sample's home step and the step that uses it (mean, max)
  once           every sample used exactly once over the epoch (checked, not assumed)
  peak_tokens    most history events on one rank in one step; peak_act_bytes the same for a
                 per-sample `memory` cost (e.g. activation bytes), None without one
  loads          per-rank costs of the first step (for bar charts)
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np

from ..balance import (LOCAL, POLICIES, CostLike, check_costs, check_lengths, check_policy, local_rank_batches,
                       partition, sample_costs)

LENGTH_BYTES = 8             # one int64 history length


def exchange_bytes(policy: str, ranks: int, per_rank_batch: int, lengths_on_every_rank: bool = False) -> int:
    """Bytes each rank receives per step to balance (module doc)."""
    free = lengths_on_every_rank or policy in ("round_robin", LOCAL)
    return 0 if free else ranks * per_rank_batch * LENGTH_BYTES


def imbalance(loads) -> float:
    """max / mean per-rank cost (1.0 = perfect; 1.0 when there is no work at all)."""
    loads = check_costs(loads, "loads")
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


def idle_fraction(loads) -> float:
    """Share of rank-time spent waiting for the straggler: sum_r (max - load_r) / (R * max)."""
    loads = check_costs(loads, "loads")
    top = float(loads.max()) if loads.size else 0.0
    return float((top - loads).sum()) / (loads.size * top) if top > 0 else 0.0


def displacement(plan: list[list[tuple[int, int]]]) -> np.ndarray:
    """|step used - home step| of every sample of a `local_schedule` plan (the order effect)."""
    return np.array([abs(s - home) for s, step in enumerate(plan) for home, _ in step], dtype=np.int64)


def epoch_plan(lengths_steps, cost: CostLike, ranks: int, policy: str, *, pool_steps: int = 8,
               target_per_sample: float | None = None, min_per_rank: int = 1) -> list[list[np.ndarray]]:
    """plan[s][r] = the sample ids (s * G + position) rank r uses at step s, for `lengths_steps`
    (steps, G): one global batch of history lengths per step. "local" aims every rank at
    `target_per_sample` (default: the mean cost of these lengths)."""
    lengths = np.asarray(lengths_steps)
    if lengths.ndim != 2 or lengths.shape[1] < ranks:
        raise ValueError(f"lengths_steps must be (steps, G) with G >= ranks={ranks}, got shape {lengths.shape}")
    check_policy(policy, (*POLICIES, LOCAL))
    costs = sample_costs(cost, lengths.ravel())
    steps, G = lengths.shape
    ids = np.arange(steps * G).reshape(steps, G)
    if policy == LOCAL:
        target = float(costs.mean()) if target_per_sample is None else target_per_sample
        per_rank = [local_rank_batches(list(ids), costs, r, ranks, target, pool_steps) for r in range(ranks)]
        return [[np.asarray(per_rank[r][s], dtype=np.int64) for r in range(ranks)] for s in range(steps)]
    return [[ids[s][p] for p in partition(costs[ids[s]], ranks, policy, min_per_rank)] for s in range(steps)]


def compare(lengths_steps, cost: CostLike, ranks: int, policies: Sequence[str] = ("round_robin", "lpt", "kk", LOCAL),
            *, pool_steps: int = 8, target_per_sample: float | None = None, memory: CostLike | None = None,
            min_per_rank: int = 1, lengths_on_every_rank: bool = False) -> list[dict]:
    """One row per policy over an epoch of global batches `lengths_steps` (steps, G) (module doc)."""
    lengths = np.asarray(lengths_steps)
    flat_len = check_lengths(lengths.ravel())
    costs = sample_costs(cost, flat_len)
    act = sample_costs(memory, flat_len) if memory is not None else None
    steps, G = lengths.shape
    per_step = costs.reshape(steps, G)
    step_bound = np.maximum(per_step.max(axis=1), per_step.sum(axis=1) / ranks)
    runs, plan_s = {}, {}
    for p in dict.fromkeys([*policies, "round_robin"]):
        t0 = time.perf_counter()
        runs[p] = epoch_plan(lengths, cost, ranks, p, pool_steps=pool_steps, target_per_sample=target_per_sample,
                             min_per_rank=min_per_rank)
        plan_s[p] = (time.perf_counter() - t0) / steps / (ranks if p == LOCAL else 1)   # local: one rank's part
    loads = {p: np.array([[costs[b].sum() for b in step] for step in plan]) for p, plan in runs.items()}
    totals = {p: float(v.max(axis=1).sum()) for p, v in loads.items()}
    bound, rr = float(step_bound.sum()), totals["round_robin"]
    rows = []
    for policy in policies:
        plan, L = runs[policy], loads[policy]                                  # L: (steps, ranks)
        mean = L.mean(axis=1)
        ratio = np.where(mean > 0, L.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
        top = L.max(axis=1)
        idle = np.where(top > 0, (top[:, None] - L).sum(axis=1) / (ranks * np.where(top > 0, top, 1)), 0.0)
        used = np.sort(np.concatenate([b for step in plan for b in step]))
        moved = np.concatenate([np.abs(s - b // G) for s, step in enumerate(plan) for b in step])
        counts = [len(b) for step in plan for b in step]
        rows.append({
            "policy": policy, "ranks": ranks, "per_rank_batch": G // ranks,
            "imbalance": float(np.median(ratio)), "imbalance_worst": float(ratio.max()),
            "idle": float(np.median(idle)),
            "kept": float(mean.sum() / top.sum()) if top.sum() > 0 else 1.0,
            "lower_bound": statistics.median((step_bound / np.where(mean > 0, mean, 1)).tolist()),
            "of_optimum": bound / totals[policy] if totals[policy] > 0 else 1.0,
            "of_kk": totals["kk"] / totals[policy] if "kk" in totals and totals[policy] > 0 else None,
            "gap_closed": (rr - totals[policy]) / (rr - bound) if rr > bound else 1.0,
            "exchange_bytes": exchange_bytes(policy, ranks, G // ranks, lengths_on_every_rank),
            "plan_ms": 1e3 * plan_s[policy], "samples/rank": f"{min(counts)}-{max(counts)}",
            "displacement_mean": float(moved.mean()), "displacement_max": int(moved.max()),
            "once": bool(np.array_equal(used, np.arange(steps * G))),
            "peak_tokens": int(max(flat_len[b].sum() for step in plan for b in step)),
            "peak_act_bytes": float(max(act[b].sum() for step in plan for b in step)) if act is not None else None,
            "loads": L[0].tolist(),
        })
    return rows
