"""Split variable-length samples across data-parallel ranks so every rank does the same work
(chapter 06): the global policies, the local one, and the loss rule that keeps gradients exact.

A global policy (POLICIES) splits ONE global batch's costs (gemref/balance/cost.py) into R index
lists, minimising the largest per-rank cost. Every rank runs the same deterministic split from
the whole batch's lengths, so nothing is exchanged (ranks that read only their own data must
all-gather the lengths first); ties go by sample index, then rank index. Policy "local"
exchanges nothing either: a rank keeps round_robin's samples and changes only WHEN it uses each.

The loss rule: ranks hold different counts, so a per-rank MEAN loss weights samples unequally.
Each rank divides its SUMMED loss by `loss_divisor` (N when gradients are summed across ranks, as
gemref's DDP and FSDP do, N / world when averaged): the reduced gradient is then exactly the
single-process gradient of the global batch's mean loss."""
from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np

from .cost import check_costs

Partition = list[list[int]]


def check_int(name: str, value, low: int) -> None:
    """ValueError unless `value` is an integer (not a bool) >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _checked(costs, ranks: int) -> np.ndarray:
    c = check_costs(costs)
    check_int("ranks", ranks, 1)
    return c


def round_robin(costs, ranks: int) -> Partition:
    """The naive split (what DistributedSampler does): sample i goes to rank i % R, ignoring cost."""
    n = len(_checked(costs, ranks))
    return [list(range(r, n, ranks)) for r in range(ranks)]


def sorted_chunk(costs, ranks: int) -> Partition:
    """Sort by cost, cut R equal-count chunks (length bucketing): the last rank gets every long sample."""
    order = np.argsort(_checked(costs, ranks), kind="stable")
    return [sorted(chunk.tolist()) for chunk in np.array_split(order, ranks)]


def lpt(costs, ranks: int) -> Partition:
    """Each sample, dearest first, onto the least-loaded rank; Graham (1969): max load <= (4/3 - 1/(3R))
    x optimum. Ties go to the rank with fewer samples, then the lower index (n >= R: none empty)."""
    c = _checked(costs, ranks)
    heap = [(0.0, 0, r) for r in range(ranks)]  # (load, n_samples, rank)
    parts: Partition = [[] for _ in range(ranks)]
    for i in np.argsort(-c, kind="stable").tolist():
        load, count, r = heapq.heappop(heap)
        parts[r].append(i)
        heapq.heappush(heap, (load + float(c[i]), count + 1, r))
    return [sorted(p) for p in parts]


def karmarkar_karp(costs, ranks: int) -> Partition:
    """Largest differencing method (Karmarkar & Karp 1982), R-way: every sample starts as a partial
    solution of R subsets (itself and R-1 empty); the two with the largest spread (max - min sum)
    are merged, largest subset of one with smallest of the other, until one is left."""
    c = _checked(costs, ranks)
    # A partial solution: R (sum, members) pairs, sums descending; members is a tree (None, a
    # sample, or a pair of trees): merging is O(R). Heap entry: (-spread, tie, solution).
    heap = ([(-ci, i, [(ci, i)] + [(0.0, None)] * (ranks - 1)) for i, ci in enumerate(c.tolist())]
            or [(0.0, 0, [(0.0, None)] * ranks)])                  # no samples: one empty solution
    heapq.heapify(heap)
    for tie in range(len(heap), 2 * len(heap) - 1):          # n - 1 merges leave one solution
        a, b = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        # a is sorted descending; b reversed is ascending: big meets small.
        merged = [(sa + sb, (ta, tb)) for (sa, ta), (sb, tb) in zip(a, reversed(b))]
        merged.sort(key=lambda pair: pair[0], reverse=True)  # stable: ties keep their order
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
    return [sorted(_members(tree)) for _, tree in heap[0][2]]


def _members(tree) -> list[int]:
    out, stack = [], [tree]
    while stack:                       # iterative: a tree is as deep as the merges that made it
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
    while short := [r for r, p in enumerate(parts) if len(p) < min_per_rank]:
        dst, loads = short[0], rank_loads(c, parts)
        best = None  # (resulting max load, sample, donor)
        for src in [r for r, p in enumerate(parts) if len(p) > min_per_rank]:
            others = np.delete(loads, [src, dst]).max(initial=0.0)
            for i in parts[src]:
                new_max = max(others, loads[src] - c[i], loads[dst] + c[i])
                if best is None or (new_max, i) < best[:2]:
                    best = (new_max, i, src)
        _, i, src = best                               # a donor exists: partition checked n >= min * R
        parts[src].remove(i)
        parts[dst].append(i)
    return [sorted(p) for p in parts]


def refine(costs, parts: Partition, min_per_rank: int = 0) -> Partition:
    """Local search: each round, the move (a -> b) or swap between the most-loaded rank a and any
    other b that leaves max(load_a, load_b) lowest, applied if strictly below load_a (so it ends);
    stops at the first round without a gain or after 4n + 4 rounds. Counts stay >= min_per_rank."""
    c = check_costs(costs)
    parts = [sorted(int(i) for i in p) for p in parts]
    if sorted(i for p in parts for i in p) != list(range(len(c))):
        raise ValueError(f"parts must hold each of the {len(c)} sample indices exactly once")
    for _ in range(4 * len(c) + 4):
        loads = rank_loads(c, parts)
        a = int(np.argmax(loads))
        la, ca = loads[a], c[parts[a]]
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
            ia, ib = divmod(int(np.argmin(new_max)), cb.size)
            if best is None or new_max[ia, ib] < best[0]:
                best = (float(new_max[ia, ib]), b, ia, ib if ib < len(parts[b]) else -1)
        if best is None or not best[0] < la * (1 - 1e-12):
            break
        _, b, ia, ib = best
        moved = parts[a].pop(ia)                      # parts stay sorted
        if ib >= 0:
            parts[a] = sorted(parts[a] + [parts[b].pop(ib)])
        parts[b] = sorted(parts[b] + [moved])
    return parts


# KK keeps R sums per partial solution: O(n R log R) work. Above n * R = this, "kk" refines LPT
# alone (1024 ranks x 64 samples: KK 196 s, LPT 0.08 s, and LPT already ~1.0001 there).
KK_MAX_WORK = 2_000_000


def kk_refined(costs, ranks: int, min_per_rank: int = 0) -> Partition:
    """Policy "kk": Karmarkar-Karp and LPT, each refined; the lower max load, never worse than LPT. Of
    2000 heavy-tailed cases (n <= 10, R = 2, 3) optimal on 96.9%, worst 1.075x (LPT 91.6%, 1.089x)."""
    c = check_costs(costs)
    starts = [lpt(c, ranks)] if len(c) * ranks > KK_MAX_WORK else [karmarkar_karp(c, ranks), lpt(c, ranks)]
    candidates = [refine(c, _enforce_min_count(c, start, min_per_rank), min_per_rank) for start in starts]
    return min(candidates, key=lambda p: rank_loads(c, p).max(initial=0.0))   # ties -> the first (KK)


POLICIES: dict[str, Callable[[np.ndarray, int], Partition]] = {
    "round_robin": round_robin, "sorted_chunk": sorted_chunk, "lpt": lpt, "kk": kk_refined}
LOCAL = "local"
ALIASES = {"shared": "lpt", "none": "round_robin"}   # old names, refused with the one to use


def check_policy(policy: str, valid: Sequence[str]) -> None:
    """ValueError naming the valid policies (and, for an old name, the policy it was)."""
    if policy not in valid:
        hint = f" ('{policy}' is policy '{ALIASES[policy]}')" if policy in ALIASES else ""
        raise ValueError(f"policy={policy!r}{hint}; valid: {', '.join(valid)}")


def partition(costs, ranks: int, policy: str = "kk", min_per_rank: int = 0) -> Partition:
    """R ascending lists of sample indices, covering each sample once. `min_per_rank` > 0 puts that
    many samples on every rank (an empty batch breaks a forward; fewer than min_per_rank * R is a
    ValueError), filled by the moves that keep the max load lowest, before "kk"'s refinement."""
    c = _checked(costs, ranks)
    check_policy(policy, tuple(POLICIES))
    check_int("min_per_rank", min_per_rank, 0)
    if len(c) < min_per_rank * ranks:
        raise ValueError(f"a batch of {len(c)} samples cannot give {ranks} ranks at least "
                         f"min_per_rank={min_per_rank} sample(s) each")
    return (kk_refined(c, ranks, min_per_rank) if policy == "kk"
            else _enforce_min_count(c, POLICIES[policy](c, ranks), min_per_rank))


def loss_divisor(global_size: int, world: int = 1, grad_reduce: str = "sum") -> float:
    """What each rank divides its SUMMED per-sample loss by (module docstring): N = `global_size`
    (the sampler's `global_size(step)`) for grad_reduce "sum", N / world for "mean"."""
    check_int("global_size", global_size, 1)
    check_int("world", world, 1)
    if grad_reduce not in ("sum", "mean"):
        raise ValueError(f"grad_reduce={grad_reduce!r}; valid: sum, mean")
    return int(global_size) if grad_reduce == "sum" else global_size / world


def closest_subset(values: np.ndarray, k: int, aim: float) -> np.ndarray:
    """Boolean mask of k of `values` with a sum close to `aim`: the first k, then each round the one
    swap that lowers |aim - sum| most (ties keep earlier entries), until none does or after 2k + 4
    rounds. O(k log n) per round (a binary search for every chosen value's partner)."""
    n = len(values)
    if not 0 <= k <= n:
        raise ValueError(f"cannot choose k={k} of {n} values")
    chosen = np.arange(n) < k
    if k in (0, n):
        return chosen
    gap = float(aim - values[chosen].sum())
    for _ in range(2 * k + 4):
        ci, ui = np.flatnonzero(chosen), np.flatnonzero(~chosen)
        order = np.argsort(values[ui], kind="stable")
        u_sorted = values[ui][order]
        j = np.searchsorted(u_sorted, values[ci] + gap)        # the partner that would close the gap
        cand = np.stack([np.clip(j - 1, 0, len(ui) - 1), np.clip(j, 0, len(ui) - 1)])
        resid = np.abs(gap - (u_sorted[cand] - values[ci][None, :]))
        a, side = divmod(int(np.argmin(resid.T.ravel())), 2)    # chosen-major: ties -> the older chosen value
        if not resid[side, a] < abs(gap) * (1 - 1e-12):
            break
        b = ui[order[cand[side, a]]]
        gap -= float(values[b] - values[ci[a]])
        chosen[ci[a]], chosen[b] = False, True
    return chosen


def local_schedule(share_costs: Sequence, target_per_sample: float, pool_steps: int = 8) -> list[list[tuple[int, int]]]:
    """Policy "local": one rank's plan for an epoch from ITS OWN samples, per step sorted (home step,
    position) pairs; `share_costs[s]`: the costs of its round_robin share of global batch s. Pool
    k = pool_steps: at step s the rank may use its samples whose home step lies within k-1 of s;
    one unused at home + k-1 is forced then (the last step takes what is left); the rest of the
    step's count is filled with pool samples bringing the step's cost closest to count x target
    (`closest_subset`), or, once the read-ahead reaches the epoch's end, to the pool's mean cost.
    Each sample goes once: the forced never exceed a step's count. k = 1 is round_robin."""
    check_int("pool_steps", pool_steps, 1)
    if not (np.isfinite(target_per_sample) and target_per_sample >= 0):
        raise ValueError(f"target_per_sample must be finite and >= 0, got {target_per_sample}")
    shares = [check_costs(c, f"share_costs[{s}]") for s, c in enumerate(share_costs)]
    counts, steps = [len(c) for c in shares], len(shares)
    if steps > 1 and (len(set(counts[:-1])) > 1 or counts[-1] > counts[0]):
        raise ValueError(f"shares must hold equal counts (the last may hold fewer), got {counts}")
    position = np.concatenate([np.arange(n) for n in counts]) if steps else np.zeros(0, dtype=np.int64)
    cost = np.concatenate(shares) if steps else np.zeros(0)
    home, ends = np.repeat(np.arange(steps), counts), np.cumsum(counts)
    pending, loaded, plan = np.zeros(0, dtype=np.int64), 0, []    # pending: stream indices (home-major) not used yet
    for s in range(steps):
        top = min(s + pool_steps - 1, steps - 1)
        pending, loaded = np.concatenate([pending, np.arange(loaded, ends[top])]), int(ends[top])
        forced = np.ones(len(pending), dtype=bool) if s == steps - 1 else home[pending] <= s - (pool_steps - 1)
        optional, free = pending[~forced], counts[s] - int(forced.sum())
        assert 0 <= free <= len(optional), "the pool always covers the step (docstring)"
        per_sample = target_per_sample if top < steps - 1 else float(cost[pending].mean())
        aim = counts[s] * per_sample - float(cost[pending[forced]].sum())
        chosen = closest_subset(cost[optional], free, aim)
        take = np.sort(np.concatenate([pending[forced], optional[chosen]]))
        pending = optional[~chosen]
        plan.append([(int(home[i]), int(position[i])) for i in take])
    return plan


def local_rank_batches(global_batches: Sequence[np.ndarray], costs: np.ndarray, rank: int, world: int,
                       target_per_sample: float, pool_steps: int = 8) -> list[list[int]]:
    """Rank `rank`'s sample ids for every step under "local", from its own samples' costs only
    (idx[rank::world] of every global batch): the same whatever the other ranks' samples cost."""
    shares = [np.asarray(idx)[rank::world] for idx in global_batches]
    plan = local_schedule([costs[share] for share in shares], target_per_sample, pool_steps)
    return [[int(shares[home][pos]) for home, pos in step] for step in plan]

