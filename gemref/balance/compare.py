"""Every balancing policy over the steps of an epoch, on simulated ranks: what each leaves on
the straggler, what it exchanges, how it reorders samples, and the heaviest rank's memory.

A step's time is its most loaded rank's cost (every rank waits for it at the gradient
all-reduce), so the figures are per step, then over the epoch:
  imbalance      max / mean rank cost of a step, median over steps (1.0 = perfect)
  of_optimum     sum over steps of a lower bound on the optimal max (the dearest sample, or
                 the mean rank cost, whichever is larger) / sum of this policy's max: a
                 conservative share of the best split's throughput (the true share is higher)
  of_kk          sum over steps of kk's max / this policy's ("kk" partitions each global batch
                 with every rank's lengths; within Graham's 4/3 of the best split, in practice
                 within 1e-3 of the bound); None when kk is not among the policies
  gap_closed     (round_robin's sum of max - this policy's) / (round_robin's - the bound's)
  exchange_bytes bytes each rank receives per step to balance: the global policies (lpt, kk)
                 need the lengths of the whole global batch, which a rank reading only its own
                 data must all-gather (world x per-rank batch int64 = 8 bytes each);
                 round_robin, local and shared (every rank reads the lengths it needs from
                 data it already has, gemref/balance/partition.py) need none
  plan_ms        milliseconds each rank spends planning one step (every rank plans every step)
  displacement   steps between a sample's home step and the step that uses it (mean, max)
  once           every sample used exactly once over the epoch (checked, not assumed)
  peak_tokens    most history events on one rank in one step; peak_act_bytes the same for
                 activation bytes when a per-sample bytes model (a SampleCost in bytes) is given
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np

from .cost import SampleCost, check_lengths
from .local import LOCAL, local_rank_batches
from .partition import POLICIES, SHARED, partition

LENGTH_BYTES = 8             # one int64 history length
NO_EXCHANGE = ("round_robin", LOCAL, SHARED)


def exchange_bytes(policy: str, ranks: int, per_rank_batch: int) -> int:
    """Bytes each rank receives per step to balance (module docstring)."""
    return 0 if policy in NO_EXCHANGE else ranks * per_rank_batch * LENGTH_BYTES


def epoch_batches(lengths_steps, cost: SampleCost, ranks: int, policy: str, *, pool_steps: int = 8,
                  target_per_sample: float | None = None, min_per_rank: int = 1) -> list[list[list[int]]]:
    """batches[s][r] = the sample ids (s * G + position) rank r uses at step s.

    `lengths_steps` is (steps, G): one global batch of history lengths per step. "local"
    aims every rank at `target_per_sample` (default: the mean cost of these lengths).
    """
    lengths = np.asarray(lengths_steps)
    if lengths.ndim != 2 or lengths.shape[1] < ranks:
        raise ValueError(f"lengths_steps must be (steps, G) with G >= ranks={ranks}, got shape {lengths.shape}")
    costs = cost.cost(check_lengths(lengths.ravel()))
    steps, G = lengths.shape
    ids = np.arange(steps * G).reshape(steps, G)
    if policy == LOCAL:
        target = float(costs.mean()) if target_per_sample is None else target_per_sample
        per_rank = [local_rank_batches(list(ids), costs, r, ranks, target, pool_steps) for r in range(ranks)]
        return [[per_rank[r][s] for r in range(ranks)] for s in range(steps)]
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}; valid: {', '.join((*POLICIES, LOCAL))}")
    return [[ids[s][p].tolist() for p in partition(costs[ids[s]], ranks, policy, min_per_rank)]
            for s in range(steps)]


def compare_over_steps(lengths_steps, cost: SampleCost, ranks: int,
                       policies: Sequence[str] = ("round_robin", "lpt", "kk", LOCAL), *, pool_steps: int = 8,
                       target_per_sample: float | None = None, memory: SampleCost | None = None) -> list[dict]:
    """One row per policy (module docstring); round_robin is always computed (for gap_closed)."""
    lengths = np.asarray(lengths_steps)
    flat_len = check_lengths(lengths.ravel())
    costs = cost.cost(flat_len)
    act = memory.cost(flat_len) if memory is not None else None
    steps, G = lengths.shape
    per_step = costs.reshape(steps, G)
    bound = np.maximum(per_step.max(axis=1), per_step.sum(axis=1) / ranks).sum()
    runs, plan_s = {}, {}
    for p in dict.fromkeys([*policies, "round_robin"]):
        t0 = time.perf_counter()
        runs[p] = epoch_batches(lengths, cost, ranks, p, pool_steps=pool_steps, target_per_sample=target_per_sample)
        plan_s[p] = (time.perf_counter() - t0) / steps
        if p == LOCAL:          # one rank plans only its own part: the simulation planned all of them
            plan_s[p] /= ranks
    totals = {p: sum(max(costs[b].sum() for b in step) for step in batches) for p, batches in runs.items()}
    rows = []
    for policy in policies:
        batches = runs[policy]
        loads = np.array([[costs[b].sum() for b in step] for step in batches])       # (steps, ranks)
        used = np.sort(np.concatenate([np.asarray(b, dtype=np.int64) for step in batches for b in step]))
        moved = np.array([abs(s - i // G) for s, step in enumerate(batches) for b in step for i in b])
        ratio = loads.max(1) / loads.mean(1)
        rows.append({
            "policy": policy, "ranks": ranks, "per_rank_batch": G // ranks,
            "imbalance": statistics.median(ratio.tolist()), "imbalance_worst": float(ratio.max()),
            "of_optimum": float(bound / totals[policy]),
            "of_kk": float(totals["kk"] / totals[policy]) if "kk" in totals else None,
            "gap_closed": float((totals["round_robin"] - totals[policy]) / (totals["round_robin"] - bound))
            if totals["round_robin"] > bound else 1.0,
            "exchange_bytes": exchange_bytes(policy, ranks, G // ranks), "plan_ms": 1e3 * plan_s[policy],
            "displacement_mean": float(moved.mean()), "displacement_max": int(moved.max()),
            "once": bool(np.array_equal(used, np.arange(steps * G))),
            "peak_tokens": int(max(flat_len[b].sum() for step in batches for b in step)),
            "peak_act_bytes": float(max(act[b].sum() for step in batches for b in step)) if act is not None else None,
        })
    return rows
