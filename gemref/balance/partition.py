"""Partition one global batch of variable-length samples across data-parallel ranks.

With skewed history lengths, equal sample counts per rank give very unequal work: attention
cost grows with L^2, so the rank that draws a few long histories is the straggler every
other rank waits for at the gradient all-reduce. This module

1. partitions a global batch's costs (gemref/balance/cost.py prices them) into R index
   lists minimising the largest per-rank cost: `round_robin`, `sorted_chunk`, `lpt`,
   `karmarkar_karp`, and the default policy "kk" = best of (Karmarkar-Karp, LPT), each
   followed by a local search (`refine`);
2. states the loss normalisation that keeps gradients exact when ranks hold different
   sample counts (`rank_loss_scale`).

Every policy here needs the costs of the whole global batch on every rank (in a real job an
all-gather of the lengths each step); gemref/balance/local.py is the policy that does not.
Everything here is deterministic: ties are broken by sample index, then rank index.
"""
from __future__ import annotations

import heapq
import statistics
import time
from typing import Callable

import numpy as np

from .cost import SampleCost, check_costs

# ----------------------------------------------------------------------------- partitioners

Partition = list[list[int]]


def _check_ranks(ranks: int) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")


def round_robin(costs, ranks: int) -> Partition:
    """The naive split (what DistributedSampler does): sample i goes to rank i % R, ignoring cost."""
    n = len(check_costs(costs))
    _check_ranks(ranks)
    return [list(range(r, n, ranks)) for r in range(ranks)]


def sorted_chunk(costs, ranks: int) -> Partition:
    """Sort by cost, cut into R contiguous chunks of equal count.

    This is length bucketing (each rank gets similar lengths, which minimises padding); it
    is the worst for balance: the last rank gets every long sample. Shown for contrast.
    """
    c = check_costs(costs)
    _check_ranks(ranks)
    order = np.argsort(c, kind="stable")
    return [sorted(chunk.tolist()) for chunk in np.array_split(order, ranks)]


def lpt(costs, ranks: int) -> Partition:
    """Longest processing time first: each sample, dearest first, goes to the least-loaded rank.

    Graham (1969): max load <= (4/3 - 1/(3R)) * optimum. Ties go to the rank with fewer
    samples, then the lower rank index, so with n >= R every rank gets at least one sample.
    """
    c = check_costs(costs)
    _check_ranks(ranks)
    heap = [(0.0, 0, r) for r in range(ranks)]  # (load, n_samples, rank)
    parts: Partition = [[] for _ in range(ranks)]
    for i in np.argsort(-c, kind="stable").tolist():
        load, count, r = heapq.heappop(heap)
        parts[r].append(i)
        heapq.heappush(heap, (load + float(c[i]), count + 1, r))
    return [sorted(p) for p in parts]


def karmarkar_karp(costs, ranks: int) -> Partition:
    """Largest differencing method (Karmarkar & Karp 1982), R-way.

    Every sample starts as a partial solution with R subsets (itself, and R-1 empty). Then,
    repeatedly, the two partial solutions with the largest spread (max - min subset sum)
    are merged: the largest subset of one joins the smallest of the other, and so on, which
    cancels their spreads against each other. The last partial solution is the partition.
    """
    c = check_costs(costs)
    _check_ranks(ranks)
    # A partial solution: R (sum, members) pairs, sums descending. `members` is a tree
    # (None = empty, int = a sample, pair = the union of two trees), so merging is O(R).
    # Heap entry: (-spread, tie-breaker, partial solution).
    heap = [(-ci, i, [(ci, i)] + [(0.0, None)] * (ranks - 1)) for i, ci in enumerate(c.tolist())]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        # a is sorted descending; b reversed is ascending: big meets small.
        merged = [(sa + sb, (ta, tb)) for (sa, ta), (sb, tb) in zip(a, reversed(b))]
        merged.sort(key=lambda pair: pair[0], reverse=True)  # stable: ties keep their order
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
        tie += 1
    if not heap:
        return [[] for _ in range(ranks)]
    return [sorted(_members(tree)) for _, tree in heap[0][2]]


def _members(tree) -> list[int]:
    out, stack = [], [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, int):
            out.append(t)
        elif t is not None:
            stack.extend(t)
    return out


def rank_loads(costs, parts: Partition) -> np.ndarray:
    """(R,) total cost per rank."""
    c = check_costs(costs)
    return np.array([float(c[p].sum()) if p else 0.0 for p in parts])


def _enforce_min_count(c: np.ndarray, parts: Partition, min_per_rank: int) -> Partition:
    """Move samples into ranks holding fewer than `min_per_rank`, each time the move that keeps the max load lowest."""
    parts = [list(p) for p in parts]
    while True:
        short = [r for r, p in enumerate(parts) if len(p) < min_per_rank]
        if not short:
            return [sorted(p) for p in parts]
        dst = short[0]
        loads = rank_loads(c, parts)
        best = None  # (resulting max load, sample, donor)
        for src, p in enumerate(parts):
            if len(p) <= min_per_rank:
                continue
            others = np.delete(loads, [src, dst]).max(initial=0.0)
            for i in p:
                new_max = max(others, loads[src] - c[i], loads[dst] + c[i])
                if best is None or (new_max, i) < best[:2]:
                    best = (new_max, i, src)
        assert best is not None, "caller checked n >= min_per_rank * ranks"
        _, i, src = best
        parts[src].remove(i)
        parts[dst].append(i)


def refine(costs, parts: Partition, min_per_rank: int = 0, max_rounds: int | None = None) -> Partition:
    """Local search: move one sample, or swap two, between the most-loaded rank and another.

    Each round takes the most-loaded rank a and, over every other rank b, the move (a -> b)
    or swap (i in a with j in b) that leaves max(load_a, load_b) lowest; it is applied only
    if that is strictly below load_a. The sorted load vector then decreases from the top,
    so the search terminates; it stops at the first round without an improvement (or after
    `max_rounds`, default 4n). Counts never drop below `min_per_rank`.
    """
    c = check_costs(costs)
    parts = [sorted(int(i) for i in p) for p in parts]
    if sorted(i for p in parts for i in p) != list(range(len(c))):
        raise ValueError(f"parts must hold each of the {len(c)} sample indices exactly once")
    rounds = 4 * len(c) + 4 if max_rounds is None else max_rounds
    for _ in range(rounds):
        loads = rank_loads(c, parts)
        a = int(np.argmax(loads))
        la = loads[a]
        ca = c[parts[a]]
        best = None  # (new pair max, b, index into a, index into b or -1 for a move)
        for b in np.argsort(loads, kind="stable").tolist():
            if b == a:
                continue
            cb = c[parts[b]]
            if len(parts[a]) > min_per_rank:
                cb = np.append(cb, 0.0)  # a virtual zero-cost sample: "swap" with it = move
            if not ca.size or not cb.size:
                continue
            delta = ca[:, None] - cb[None, :]   # work that leaves a for b
            new_max = np.maximum(la - delta, loads[b] + delta)
            new_max[delta <= 0] = np.inf
            k = int(np.argmin(new_max))
            ia, ib = divmod(k, cb.size)
            if best is None or new_max[ia, ib] < best[0]:
                best = (float(new_max[ia, ib]), b, ia, ib if ib < len(parts[b]) else -1)
        if best is None or not best[0] < la * (1 - 1e-12):
            break
        _, b, ia, ib = best
        moved = parts[a].pop(ia)
        if ib >= 0:
            parts[a].append(parts[b].pop(ib))
        parts[b].append(moved)
        parts[a].sort()
        parts[b].sort()
    return parts


# Karmarkar-Karp keeps R subset sums per partial solution: O(n * R log R) Python work and
# n * R entries of memory. Above this many (n * R) "kk" refines LPT alone (R = 1024 ranks x
# 64 samples took 196 s for KK vs 0.08 s for LPT, and LPT already reaches ~1.0001 there).
KK_MAX_WORK = 2_000_000


def kk_refined(costs, ranks: int, min_per_rank: int = 0) -> Partition:
    """Policy "kk": Karmarkar-Karp and LPT, each refined by `refine`; the one with the lower max load.

    Taking the better of the two makes it never worse than LPT, hence within Graham's
    (4/3 - 1/(3R)) of the optimum. Measured against the exhaustive optimum on 2000 random
    heavy-tailed cases (n <= 10, R = 2, 3): optimal on 96.9%, worst 1.075x (LPT: 91.6%,
    1.089x); tests/test_balance.py checks both the bound and these rates. For batches where
    n * R > KK_MAX_WORK only refined LPT runs (see KK_MAX_WORK).
    """
    c = check_costs(costs)
    starts = [lpt(c, ranks)] if len(c) * ranks > KK_MAX_WORK else [karmarkar_karp(c, ranks), lpt(c, ranks)]
    candidates = [refine(c, _enforce_min_count(c, start, min_per_rank), min_per_rank) for start in starts]
    maxes = [rank_loads(c, p).max(initial=0.0) for p in candidates]
    return candidates[int(np.argmin(maxes))]  # ties -> the first (Karmarkar-Karp)


# "shared": the split every rank computes for itself, identically, from lengths it already has.
# A global policy balances each global batch with the lengths of all its samples; where a rank
# only reads its own data those lengths must first be all-gathered (gemref/balance/compare.py
# counts those bytes for lpt and kk). When every rank can read the whole global batch's lengths
# without exchanging anything (the same deterministic sample order on every rank, as gemref's
# sampler has, plus a length column or index shared by all ranks), each rank can run the same
# deterministic partition and take its own part: the global balance with 0 bytes exchanged.
# LPT is the partition: on the presets' skewed lengths it lands within 0.2% of the optimum's
# bound at 8..1024 ranks, and plans a 1024-rank step in about a tenth of a second (kk's
# refinement takes seconds per step there); `gemref bench local_balance` measures both.
SHARED = "shared"

POLICIES: dict[str, Callable[[np.ndarray, int], Partition]] = {
    "round_robin": round_robin,
    "sorted_chunk": sorted_chunk,
    "lpt": lpt,
    "kk": kk_refined,
    SHARED: lpt,
}


def partition(costs, ranks: int, policy: str = "kk", min_per_rank: int = 0) -> Partition:
    """R lists of sample indices (each ascending) that cover every sample exactly once.

    `min_per_rank` > 0 guarantees that many samples on every rank (a rank with an empty
    batch would break a forward pass); a batch with fewer than min_per_rank * R samples
    is then a ValueError. Short ranks are filled by the moves that keep the max load lowest
    (only "kk" and, for min_per_rank > 1, "lpt" ever need that), before "kk"'s refinement.
    """
    c = check_costs(costs)
    _check_ranks(ranks)
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}; valid: {', '.join(POLICIES)}")
    if isinstance(min_per_rank, bool) or not isinstance(min_per_rank, (int, np.integer)) or min_per_rank < 0:
        raise ValueError(f"min_per_rank must be an integer >= 0, got {min_per_rank!r}")
    if len(c) < min_per_rank * ranks:
        raise ValueError(f"a batch of {len(c)} samples cannot give {ranks} ranks at least "
                         f"min_per_rank={min_per_rank} sample(s) each")
    if policy == "kk":
        return kk_refined(c, ranks, min_per_rank)
    return _enforce_min_count(c, POLICIES[policy](c, ranks), min_per_rank)


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


# ----------------------------------------------------------------------------- loss scaling


def rank_loss_scale(n_rank: int, n_global: int, world: int, grad_reduce: str = "mean") -> float:
    """Factor for this rank's MEAN per-sample loss so the reduced gradient equals the global-batch mean's.

    The single-process reference is loss = (1/N) * sum over all N samples of the global
    batch. Rank r holds n_r of them and computes mean_r = (1/n_r) * sum over its samples.
    - grad_reduce="sum" (all_reduce SUM): use mean_r * n_r / N  (= its sum / N).
    - grad_reduce="mean" (DDP and FSDP average over `world` ranks): use mean_r * world * n_r / N.
    Multiplying mean_r by 1 (the usual per-rank mean) is only right when every n_r = N/world,
    which load balancing breaks on purpose. N is the size of THIS step's global batch (the
    last one of an epoch may be smaller): `BalancedDistributedBatchSampler.global_size(step)`.
    """
    for name, value, low in (("n_rank", n_rank, 1), ("n_global", n_global, 1), ("world", world, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if n_rank > n_global:
        raise ValueError(f"n_rank={n_rank} exceeds n_global={n_global}")
    if grad_reduce == "sum":
        return n_rank / n_global
    if grad_reduce == "mean":
        return world * n_rank / n_global
    raise ValueError(f"grad_reduce={grad_reduce!r}; valid: sum, mean")


def compare_policies(batches, cost: SampleCost, ranks: int, policies=tuple(POLICIES),
                     min_per_rank: int = 1) -> list[dict]:
    """Partition every global batch (an array of history lengths) with each policy.

    One row per policy, medians over batches: imbalance (max/mean rank cost, 1 = perfect),
    its worst batch, idle (the share of rank-time spent waiting for the straggler at the
    all-reduce), samples per rank (min-max), the partitioner's own time (ms; it runs on
    every rank every step), the lower bound no partition can beat (largest sample or mean,
    over mean), and `loads`: the per-rank costs of the first batch (for bar charts).
    """
    rows = []
    for policy in policies:
        imb, idle, ms, counts, bound, first = [], [], [], [], [], None
        for lengths in batches:
            costs = cost.cost(lengths)
            t0 = time.perf_counter()
            parts = partition(costs, ranks, policy, min_per_rank=min_per_rank)
            ms.append((time.perf_counter() - t0) * 1e3)
            loads = rank_loads(costs, parts)
            first = loads if first is None else first
            imb.append(imbalance(loads))
            idle.append(idle_fraction(loads))
            counts += [len(p) for p in parts]
            bound.append(max(costs.max(), loads.mean()) / loads.mean())
        rows.append({"policy": policy, "imbalance": statistics.median(imb), "imbalance_worst": max(imb),
                     "idle": statistics.median(idle), "samples/rank": f"{min(counts)}-{max(counts)}",
                     "part_ms": statistics.median(ms), "lower_bound": statistics.median(bound),
                     "loads": first.tolist()})
    return rows
