"""Batch samplers for variable-length samples: a token/FLOP budget per step, and balanced DP ranks.

Both are `batch_sampler`s for torch.utils.data.DataLoader: iterables of index lists that
need each sample's history length up front (`EventDataset.lengths`, or
`gemref.data.synthetic.draw_lengths` for synthetic profiles). Both are deterministic for a seed, reshuffle per epoch (`set_epoch`),
and use every sample exactly once per epoch; nothing is dropped silently.

- `TokenBudgetBatcher` (one device): variable batch size, each batch's total tokens (or
  FLOPs with a `SampleCost`) within a fixed budget.
- `BalancedDistributedBatchSampler` (R ranks): cuts global batches of fixed size and splits
  each across ranks by cost (gemref/balance/partition.py), so every rank finishes at the same
  time; or, with policy "local", keeps round_robin's split and lets each rank reorder its own
  samples across nearby steps, with nothing exchanged. Chapter 06 explains both.

A cost is whatever prices a sample from its history length: a `SampleCost` (c0 + c1*L + c2*L^2,
in the coefficients' unit), a `Calibration` fitted to your measured step times
(`gemref.balance.calibrate`, check its `r2`), or a callable lengths -> costs.

The loss rule: with a balanced sampler ranks hold different sample counts, so each rank divides
its SUMMED per-sample loss by `gemref.balance.loss_divisor(sampler.global_size(step), world,
grad_reduce)`: the global batch size when gradients are summed across ranks (gemref's
training), that over world when they are averaged (plain DDP). Then the reduced gradient is
the single-process gradient of the global batch's mean loss.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import torch

from ..balance import (LOCAL, SAMPLER_POLICIES, CostLike, check_int, check_lengths, check_policy, local_rank_batches,
                       partition, sample_costs)


def _weights(lengths, cost: CostLike | None) -> np.ndarray:
    L = check_lengths(lengths)
    return L.astype(np.float64) if cost is None else sample_costs(cost, L)


def _permutation(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's sample order; identical on every rank (torch.Generator, like DistributedSampler)."""
    if not shuffle:
        return np.arange(n)
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).numpy()


class TokenBudgetBatcher:
    """Variable-size batches, each within `budget` tokens (history events), or FLOPs given `cost`.

    Samples are taken in the epoch's shuffled order and packed greedily: a sample joins the
    current batch if it still fits (and the batch has fewer than `max_samples`), else the
    batch is emitted and a new one starts. With token weights a zero-length history costs
    nothing, so prefer a FLOP budget (its per-sample term) or set `max_samples`.
    A sample that alone exceeds the budget is a ValueError at construction, naming it; with
    `allow_oversize=True` it becomes a batch of its own instead.
    """

    def __init__(self, lengths, budget: float, cost: CostLike | None = None, seed: int = 0,
                 shuffle: bool = True, allow_oversize: bool = False, max_samples: int | None = None):
        self.weights = _weights(lengths, cost)
        if not (np.isfinite(budget) and budget > 0):
            raise ValueError(f"budget must be finite and > 0, got {budget}")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        over = np.flatnonzero(self.weights > budget)
        if over.size and not allow_oversize:
            i = int(over[0])
            unit = "tokens" if cost is None else "cost"
            raise ValueError(f"sample {i} ({unit} {self.weights[i]:.6g}) exceeds budget={budget:.6g} on its own "
                             f"({over.size} such samples); raise the budget or pass allow_oversize=True")
        self.budget, self.seed, self.shuffle = float(budget), seed, shuffle
        self.max_samples = max_samples or len(self.weights)
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """This epoch's batches (computed once per epoch)."""
        if self._cache is None or self._cache[0] != self.epoch:
            out: list[list[int]] = []
            current: list[int] = []
            filled = 0.0
            for i in _permutation(len(self.weights), self.seed, self.epoch, self.shuffle).tolist():
                w = float(self.weights[i])
                if current and (filled + w > self.budget or len(current) >= self.max_samples):
                    out.append(current)
                    current, filled = [], 0.0
                current.append(i)
                filled += w
            if current:
                out.append(current)
            self._cache = (self.epoch, out)
        return self._cache[1]

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches()])

    def __len__(self) -> int:
        return len(self.batches())


def _dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("rank and world_size were not given and torch.distributed is not initialised")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


class BalancedDistributedBatchSampler:
    """Per-rank batch sampler: global batches of `global_batch_size`, each split across ranks by cost.

    Every rank builds the same shuffled order (seed + epoch) and the same partition of every
    global batch (deterministic, no communication), and yields its own index list. So each
    sample is used once per epoch across all ranks, and all ranks take the same number of
    steps (a rank running out early would hang the others at the all-reduce).
    The last global batch may be smaller: it is kept and partitioned like the others, or
    dropped with drop_last=True. Every rank gets at least `min_per_rank` (default 1)
    samples per step; a dataset whose last batch cannot give that is a ValueError at
    construction. Ranks hold different sample counts: divide each rank's summed loss by
    `gemref.balance.loss_divisor(sampler.global_size(step), world, grad_reduce)` (module doc).
    `cost`: a SampleCost, a Calibration or a callable lengths -> costs (module doc).

    policy="local": rank r owns idx[r::world] of every global batch (round_robin's counts,
    so global_size and the loss divisor are round_robin's) and uses each of its samples within
    `pool_steps` - 1 steps of its home step, chosen from its own samples only so that each
    step's cost lands near the step's count x `target_per_sample` (default: the mean cost
    of `lengths`, the same on every rank). Every sample is still used exactly once per epoch
    (gemref/balance/partition.py states the rules and why).
    """

    def __init__(self, lengths, global_batch_size: int, cost: CostLike,
                 rank: int | None = None, world_size: int | None = None, seed: int = 0,
                 policy: str = "kk", drop_last: bool = False, shuffle: bool = True, min_per_rank: int = 1,
                 pool_steps: int = 8, target_per_sample: float | None = None):
        self.lengths = check_lengths(lengths)
        self.cost = cost
        self.costs = sample_costs(cost, self.lengths)
        self.rank, self.world_size = _dist_rank_world(rank, world_size)
        check_policy(policy, SAMPLER_POLICIES)
        check_int("pool_steps", pool_steps, 1)
        if target_per_sample is not None and not (np.isfinite(target_per_sample) and target_per_sample >= 0):
            raise ValueError(f"target_per_sample must be finite and >= 0, got {target_per_sample}")
        if min_per_rank < 1:
            raise ValueError(f"min_per_rank must be >= 1 (an empty per-rank batch cannot be collated), got {min_per_rank}")
        if global_batch_size < self.world_size * min_per_rank:
            raise ValueError(f"global_batch_size={global_batch_size} cannot give {self.world_size} ranks "
                             f"min_per_rank={min_per_rank} sample(s) each")
        n = len(self.lengths)
        if n == 0:
            raise ValueError("lengths is empty: no samples to batch")
        tail = n % global_batch_size
        if tail and not drop_last and tail < self.world_size * min_per_rank:
            raise ValueError(f"the last global batch would hold {tail} samples (of {n}), fewer than "
                             f"world_size={self.world_size} x min_per_rank={min_per_rank}; "
                             "pass drop_last=True or change global_batch_size")
        if drop_last and n < global_batch_size:
            raise ValueError(f"drop_last=True with {n} samples < global_batch_size={global_batch_size} leaves no batch")
        self.global_batch_size, self.seed, self.policy = global_batch_size, seed, policy
        self.drop_last, self.shuffle, self.min_per_rank = drop_last, shuffle, min_per_rank
        self.pool_steps = pool_steps
        self.target_per_sample = float(self.costs.mean()) if target_per_sample is None else float(target_per_sample)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n, b = len(self.lengths), self.global_batch_size
        return n // b if self.drop_last else -(-n // b)

    def global_size(self, step: int) -> int:
        """Samples in global batch `step` of an epoch, over all ranks (the loss denominator)."""
        if not 0 <= step < len(self):
            raise ValueError(f"step={step} is outside this epoch's [0, {len(self)})")
        return min(self.global_batch_size, len(self.lengths) - step * self.global_batch_size)

    def global_batches(self) -> Iterator[np.ndarray]:
        """This epoch's global batches of sample indices (the same on every rank)."""
        order = _permutation(len(self.lengths), self.seed, self.epoch, self.shuffle)
        for step in range(len(self)):
            yield order[step * self.global_batch_size: step * self.global_batch_size + self.global_size(step)]

    def rank_batches(self, rank: int) -> list[list[int]]:
        """Rank `rank`'s index list for every step of this epoch ("local": from its own samples only)."""
        if self.policy == LOCAL:
            return local_rank_batches(list(self.global_batches()), self.costs, rank, self.world_size,
                                      self.target_per_sample, self.pool_steps)
        return [parts[rank] for parts in self.plan()]

    def plan(self) -> Iterator[list[list[int]]]:
        """For each step, every rank's index list (rank r's is plan()[step][r])."""
        if self.policy == LOCAL:
            yield from (list(step) for step in zip(*(self.rank_batches(r) for r in range(self.world_size))))
            return
        for idx in self.global_batches():
            parts = partition(self.costs[idx], self.world_size, self.policy, self.min_per_rank)
            yield [idx[p].tolist() for p in parts]

    def __iter__(self) -> Iterator[list[int]]:
        if self.policy == LOCAL:
            yield from self.rank_batches(self.rank)
            return
        for parts in self.plan():
            yield parts[self.rank]


class StepBatches:
    """An endless batch_sampler that starts at global step `start` (epochs roll over; resumable).

    Resuming at step k re-plans (but does not load) the k % len(sampler) batches skipped in
    the current epoch, so the run continues with exactly the batches it would have drawn.
    """

    def __init__(self, sampler: BalancedDistributedBatchSampler, start: int = 0):
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[list[int]]:
        epoch, skip = divmod(self.start, len(self.sampler))
        while True:
            self.sampler.set_epoch(epoch)
            yield from itertools.islice(iter(self.sampler), skip, None)
            epoch, skip = epoch + 1, 0
