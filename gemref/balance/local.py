"""Policy "local": every rank rebalances its own samples across steps; nothing is exchanged.

The global policies (gemref/balance/partition.py) split each global batch by cost, so every
rank needs every rank's lengths each step (an all-gather). "local" keeps round_robin's
assignment of samples to ranks (rank r owns idx[r::R] of every global batch, so it takes
the same number of samples every step as with round_robin) and changes only WHEN a rank
uses each of its own samples:

  * pool: at step s a rank may use any of its own samples whose home step (the global batch
    round_robin would have used them in) lies in [s - (k-1), s + (k-1)], k = `pool_steps`.
    It reads ahead k-1 steps of its own shard, so its pool holds about k x its share;
  * deadline: a sample still unused at home + k - 1 must go at that step (forced), and the
    last step of the epoch takes whatever is left;
  * choice: besides the forced samples it fills the step's count with the pool samples that
    bring the step's cost closest to the target count x `target_per_sample`, starting from
    the oldest samples and improving by one-for-one swaps while |cost - target| drops.
    The target is a constant of the data (the dataset's mean per-sample cost, which every
    rank computes from the length column it already holds, or the length distribution's
    expectation): since every rank aims at the same number, their step costs meet without
    talking to each other;
  * epoch tail: once the read-ahead reaches the end of the epoch (the last k steps) the pool
    holds all the rank's remaining samples, and the aim becomes the pool's own mean cost per
    sample: a rank left with heavier samples spreads them evenly over the steps left
    instead of piling them into the last step. (Measured on skewed lengths at k = 8, 64
    ranks, 64 steps: 93.5% of kk's throughput with this rule, 92.3% without; 98.8% on the
    steps before the tail. gemref/bench/local_balance.py prints these figures.)

Sample order: every sample is used exactly once per epoch, at most k-1 steps before or after
its home step; no sample is dropped and none crosses into the next epoch. Why: a step takes
exactly its count; the pool always holds at least that many (it includes the whole home
share of step s minus what earlier steps took, plus read-ahead); the forced samples of
step s all have home s-k+1 (older ones were forced earlier), so there are at most as many
as the step's count; and the counts add up, so the last step's leftover is exactly its
count. k = 1 is round_robin exactly. Loss scaling is round_robin's (global counts per step
do not change).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .cost import check_costs

LOCAL = "local"


def _check_pool_steps(pool_steps) -> None:
    if isinstance(pool_steps, bool) or not isinstance(pool_steps, (int, np.integer)) or pool_steps < 1:
        raise ValueError(f"pool_steps must be an integer >= 1, got {pool_steps!r}")


def closest_subset(values: np.ndarray, k: int, aim: float, max_rounds: int | None = None) -> np.ndarray:
    """Boolean mask of k of `values` whose sum is close to `aim`: the first k, then swaps.

    Each round makes the single swap (a chosen value for an unchosen one) that leaves
    |aim - sum| lowest, if that is strictly lower than before; ties keep earlier entries.
    Stops at the first round without a gain or after `max_rounds` (default 2k + 4).
    O(k log n) per round (binary search for the partner of every chosen value).
    """
    n = len(values)
    if not 0 <= k <= n:
        raise ValueError(f"cannot choose k={k} of {n} values")
    chosen = np.zeros(n, dtype=bool)
    chosen[:k] = True
    if k in (0, n):
        return chosen
    gap = float(aim - values[chosen].sum())
    for _ in range(2 * k + 4 if max_rounds is None else max_rounds):
        ci, ui = np.flatnonzero(chosen), np.flatnonzero(~chosen)
        order = np.argsort(values[ui], kind="stable")
        u_sorted = values[ui][order]
        j = np.searchsorted(u_sorted, values[ci] + gap)        # the partner that would close the gap
        cand = np.stack([np.clip(j - 1, 0, len(ui) - 1), np.clip(j, 0, len(ui) - 1)])
        resid = np.abs(gap - (u_sorted[cand] - values[ci][None, :]))
        flat = int(np.argmin(resid.T.ravel()))                # chosen-major: ties -> the older chosen value
        a, side = divmod(flat, 2)
        if not resid[side, a] < abs(gap) * (1 - 1e-12):
            break
        b = ui[order[cand[side, a]]]
        gap -= float(values[b] - values[ci[a]])
        chosen[ci[a]], chosen[b] = False, True
    return chosen


def local_schedule(share_costs: Sequence, target_per_sample: float, pool_steps: int = 8) -> list[list[tuple[int, int]]]:
    """One rank's plan for an epoch from ITS OWN samples only.

    `share_costs[s]` holds the costs of the samples this rank owns in global batch s (its
    round_robin share), in order; every share holds the same count but the last, which may
    hold fewer. Returns, per step s, the samples to use as (home step,
    position in that step's share) pairs, sorted, len(share_costs[s]) of them. See the
    module docstring for the rules and the proof that every sample is used once.
    """
    _check_pool_steps(pool_steps)
    if not (np.isfinite(target_per_sample) and target_per_sample >= 0):
        raise ValueError(f"target_per_sample must be finite and >= 0, got {target_per_sample}")
    shares = [check_costs(c, f"share_costs[{s}]") for s, c in enumerate(share_costs)]
    counts = [len(c) for c in shares]
    steps = len(shares)
    if steps > 1 and (len(set(counts[:-1])) > 1 or counts[-1] > counts[0]):
        raise ValueError(f"shares must hold equal counts (the last may hold fewer), got {counts}")
    home = np.repeat(np.arange(steps), counts)
    position = np.concatenate([np.arange(n) for n in counts]) if steps else np.zeros(0, dtype=np.int64)
    cost = np.concatenate(shares) if steps else np.zeros(0)
    ends = np.cumsum(counts)
    pending = np.zeros(0, dtype=np.int64)         # stream indices (home-major) not used yet
    loaded = 0
    plan = []
    for s in range(steps):
        top = min(s + pool_steps - 1, steps - 1)
        pending = np.concatenate([pending, np.arange(loaded, ends[top])])
        loaded = int(ends[top])
        forced = np.ones(len(pending), dtype=bool) if s == steps - 1 else home[pending] <= s - (pool_steps - 1)
        optional = pending[~forced]
        free = counts[s] - int(forced.sum())
        assert 0 <= free <= len(optional), "the pool always covers the step (module docstring)"
        # once the read-ahead reaches the epoch's end, spread what is left evenly instead
        per_sample = target_per_sample if top < steps - 1 else float(cost[pending].mean())
        aim = counts[s] * per_sample - float(cost[pending[forced]].sum())
        chosen = closest_subset(cost[optional], free, aim)
        take = np.sort(np.concatenate([pending[forced], optional[chosen]]))
        pending = optional[~chosen]
        plan.append([(int(home[i]), int(position[i])) for i in take])
    return plan


def local_rank_batches(global_batches: Sequence[np.ndarray], costs: np.ndarray, rank: int, world: int,
                       target_per_sample: float, pool_steps: int = 8) -> list[list[int]]:
    """Rank `rank`'s sample ids for every step of an epoch under policy "local".

    Reads the costs of the rank's own samples only (idx[rank::world] of every global batch):
    the plan is the same whatever the other ranks' samples cost.
    """
    shares = [np.asarray(idx)[rank::world] for idx in global_batches]
    plan = local_schedule([costs[share] for share in shares], target_per_sample, pool_steps)
    return [[int(shares[home][pos]) for home, pos in step] for step in plan]


def displacement(plan: list[list[tuple[int, int]]]) -> np.ndarray:
    """|step used - home step| of every sample of a `local_schedule` plan (the order effect)."""
    return np.array([abs(s - home) for s, step in enumerate(plan) for home, _ in step], dtype=np.int64)
