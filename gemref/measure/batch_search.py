"""Spend the memory AutoAC frees on a larger batch: the batch-size searches (the lab's; moved
here from gemref/autoac/, whose technique is profile -> solve -> apply on any model).

This module is GEMRef's side of AutoAC: its blocks (`GEMRef.checkpoint_blocks()`) and its step
(gemref/step.py `forward_loss` on a JaggedBatch) handed to the generic profiler
(`gemref_profile`, `gemref_forward_with_bytes`).

A memory budget bounds `step_bytes`: on CPU the activation bytes of a step (a declared
budget, measured as gemref/autoac/profile.py measures them), on CUDA the peak device memory
of forward + backward. Step bytes grow with the batch, so the largest batch that fits is
found by one search (`largest_fitting`: doubling, then bisection) over `batch_of(n)`, the
first n samples of one fixed order. Two questions use it:
  * `find_batch_size`: the largest batch without AutoAC and with it (every block fully
    checkpointed: the least memory any plan needs), and AutoAC's plan at the latter (which
    may be full checkpointing itself: `is_full_checkpointing`);
  * `larger_batch` (the waterfall's AutoAC rung): the largest batch, up to SEARCH_CAP x the
    per-rank batch, that fits the budget of the per-rank batch, with AutoAC's plan there;
    with a compression format, every block's saved activations compressed and nothing
    recomputed decide the batch, and the plan gets "compressed" as one more option per block
    (`gemref_profile(..., compression=)`).
A batch equal to the search's upper end is where the search stopped, not a measured limit
(`BatchSearch.capped`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor, nn

from ..activation_compression import CompressionSpec
from ..autoac import ActivationProfile, Plan, applied_plan, apply_plan, plan_of, profile_blocks, remove_plan, solve
from ..autoac.profile import forward_with_bytes as eager_forward_with_bytes
from ..compile import compile_stats
from ..data.jagged import JaggedBatch
from ..mfu.flops import recompute_flops
from ..mfu.memory import SavedTensors, storage_key, track_peak_memory
from ..step import forward_loss

SEARCH_CAP = 4      # larger_batch searches batches up to this multiple of the per-rank batch


def forward_with_bytes(model: nn.Module, step: Callable[[], Tensor], inputs=()) -> tuple[Tensor, int]:
    """AutoAC's activation bytes (gemref/autoac/profile.py), and on a compiled CPU model, where
    inductor allocates without the dispatcher, the bytes of the tensors saved for backward
    (saved_tensors_hooks, storages deduplicated). That misses what a checkpoint keeps (its
    inputs), so it serves only where nothing is checkpointed (PyTorch 2's memory_budget); on an
    eager step the two agree (tests/test_autoac.py)."""
    if next(model.parameters()).device.type == "cuda" or compile_stats(model) is None:
        return eager_forward_with_bytes(model, step, inputs)
    if applied_plan(model):
        raise ValueError("cannot measure a checkpointed, compiled model on CPU: inductor's "
                         "buffers are invisible there; measure the eager model instead")
    existing = {storage_key(t) for t in [*model.parameters(), *model.buffers(), *inputs]}
    with SavedTensors(existing).active() as saved:
        loss = step()
    return loss, sum(saved.bytes_by_block().values())


def gemref_forward_with_bytes(model: nn.Module, batch: JaggedBatch, autocast_dtype=None) -> tuple[Tensor, int]:
    """GEMRef's training forward on `batch`; the loss and the activation bytes it leaves."""
    return forward_with_bytes(model, lambda: forward_loss(model, batch, autocast_dtype), batch.tensors())


def gemref_activation_bytes(model: nn.Module, batch: JaggedBatch, autocast_dtype=None) -> int:
    loss, nbytes = gemref_forward_with_bytes(model, batch, autocast_dtype)
    del loss
    return nbytes


def gemref_profile(model: nn.Module, batch: JaggedBatch, *, options=("save_matmuls", "full"), autocast_dtype=None,
                   compression: CompressionSpec | None = None, repeats: int = 3) -> ActivationProfile:
    """`profile_blocks` on GEMRef's blocks and its training step on `batch`."""
    return profile_blocks(model, model.checkpoint_blocks(), lambda: forward_loss(model, batch, autocast_dtype),
                          options=options, repeats=repeats, compression=compression, inputs=batch.tensors())


def step_bytes(model: nn.Module, batch: JaggedBatch, autocast_dtype=None) -> int:
    """What a memory budget bounds: CPU, the activation bytes; CUDA, the peak device memory of
    forward + backward (parameters and gradients included). Leaves no gradients."""
    if batch.values.device.type != "cuda":
        return gemref_activation_bytes(model, batch, autocast_dtype)
    try:
        with track_peak_memory(batch.values.device) as peak:
            forward_loss(model, batch, autocast_dtype).backward()
    except torch.cuda.OutOfMemoryError:
        peak.bytes = 2 ** 62
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    return peak.bytes


def step_bytes_under(model: nn.Module, choices: Mapping[str, str], batch: JaggedBatch, *,
                     compression: CompressionSpec | None = None, autocast_dtype=None) -> int:
    """`step_bytes` with {block: option} applied for this one step (removed after)."""
    apply_plan(model, choices, compression=compression)
    try:
        return step_bytes(model, batch, autocast_dtype)
    finally:
        remove_plan(model)


def is_full_checkpointing(plan: Plan) -> bool:
    return bool(plan.blocks) and all(plan.choices.get(n) == "full" for n in plan.blocks)


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] with fits(n), for a monotone fits (true up to some n, false
    after): doubling from `low`, then bisection. `low - 1` when not even `low` fits."""
    if not fits(low):
        return low - 1
    lo, hi = low, max(2 * low, low + 1)
    while hi <= high and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, high + 1)               # fits(lo) holds, fits(hi) does not (or hi is past the end)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass
class BatchSearch:
    """What a memory budget allows without and with AutoAC (bytes as `measure` defines them)."""

    budget_bytes: int
    measure: str                 # "activation_bytes" (CPU, declared budget) or "peak_step_bytes" (CUDA)
    no_ac_batch: int
    no_ac_bytes: int
    autoac_batch: int
    autoac_bytes: int            # measured at autoac_batch with the plan applied
    plan: Plan
    max_batch: int               # the search's upper end (a batch equal to it may fit more)

    @property
    def capped(self) -> bool:
        """The AutoAC batch is the search's upper end: a cap, not a measured limit."""
        return self.autoac_batch >= self.max_batch


def find_batch_size(model: nn.Module, batch_of: Callable[[int], JaggedBatch], memory_budget: int, *,
                    max_batch: int, autocast_dtype=None, objective: str = "time",
                    options: tuple[str, ...] = ("save_matmuls", "full")) -> BatchSearch:
    """The largest batch that fits `memory_budget` bytes without and with AutoAC.

    `batch_of(n)` must return the first n samples of one fixed order, so memory grows with n.
    CPU: the budget bounds activation bytes (a declared budget). CUDA: it bounds the peak
    device memory of a step. With AutoAC a batch fits when the fully checkpointed step fits
    (the least memory any plan needs); at the largest such batch the plan is AutoAC's
    least-recompute plan for the budget (on CUDA the non-activation part of the peak, measured
    under full checkpointing, is taken off the budget first, and the plan is checked).
    """
    if memory_budget <= 0 or max_batch < 1:
        raise ValueError(f"need memory_budget > 0 and max_batch >= 1, got {memory_budget}, {max_batch}")
    if applied_plan(model):
        raise ValueError("find_batch_size needs the model without a checkpoint plan")
    all_full = {name: "full" for name in model.checkpoint_blocks()}
    measured: dict[tuple[str, int], int] = {}

    def fits(strategy: str, n: int) -> bool:
        choices = all_full if strategy == "full" else {}
        measured[strategy, n] = step_bytes_under(model, choices, batch_of(n), autocast_dtype=autocast_dtype)
        return measured[strategy, n] <= memory_budget

    measure = "peak_step_bytes" if next(model.parameters()).device.type == "cuda" else "activation_bytes"
    no_ac = largest_fitting(lambda n: fits("none", n), 1, max_batch)
    with_ac = largest_fitting(lambda n: fits("full", n), 1, max_batch)
    if with_ac == 0:
        raise ValueError(f"even one sample needs {measured['full', 1]:,} bytes with every block "
                         f"checkpointed, over the budget of {memory_budget:,} bytes")
    batch = batch_of(with_ac)
    activation_budget = memory_budget
    if measure == "peak_step_bytes":
        apply_plan(model, all_full)
        activation_budget -= measured["full", with_ac] - gemref_activation_bytes(model, batch, autocast_dtype)
        remove_plan(model)
    plan, used = None, measured["full", with_ac]
    try:
        profile = gemref_profile(model, batch, options=options, autocast_dtype=autocast_dtype)
    except torch.cuda.OutOfMemoryError:     # one block left un-checkpointed does not fit either
        torch.cuda.empty_cache()
        profile = None
    for _ in range(3 if profile is not None else 0):
        candidate = solve(profile, max(activation_budget, profile.min_bytes), objective)
        candidate_bytes = step_bytes_under(model, candidate.choices, batch, autocast_dtype=autocast_dtype)
        if candidate_bytes <= memory_budget:
            plan, used = candidate, candidate_bytes
            break
        activation_budget -= candidate_bytes - memory_budget       # CUDA: tighten by the overshoot
    if plan is None:      # no profile, or no solved plan fits: full checkpointing is what fits
        flops = recompute_flops(model.cfg, batch.lengths, all_full, jagged=model.jagged, kernel=model.kernel)
        blocks = tuple(all_full)
        plan = Plan(all_full, blocks, memory_budget, used, flops, float("nan"), "time") if profile is None \
            else plan_of(profile, all_full, memory_budget)
    return BatchSearch(memory_budget, measure, no_ac, measured.get(("none", no_ac), 0), with_ac, used, plan,
                       max_batch)


@dataclass(frozen=True)
class LargerBatch:
    """What AutoAC buys in a memory budget: the batch it fits (samples per rank), the budget as
    a fraction of that batch's step bytes with nothing checkpointed (the ac_budget switch),
    the compression format of saved activations ("none": exact options only) and the plan."""

    batch: int
    budget_fraction: float
    compress: str
    plan: Plan


def larger_batch(model: nn.Module, batch_of: Callable[[int], JaggedBatch], budget_bytes: int, per_rank: int, *,
                 compress: str = "none", options: tuple[str, ...] = ("save_matmuls", "full"),
                 objective: str = "time") -> LargerBatch | str:
    """The largest batch above `per_rank`, up to SEARCH_CAP x `per_rank`, whose step fits
    `budget_bytes` with AutoAC, and AutoAC's plan at it; or why no larger batch fits.

    `model`: eager, nothing checkpointed (left so). `compress="none"`: `find_batch_size` (fully
    checkpointed steps decide the batch). A format: every block's saved activations in it and
    nothing recomputed decide the batch, then AutoAC with "compressed" as one more option
    per block is solved at that batch."""
    high = SEARCH_CAP * per_rank
    if compress == "none":
        found = find_batch_size(model, batch_of, budget_bytes, max_batch=high, options=options, objective=objective)
        batch, plan = found.autoac_batch, found.plan
    else:
        spec = CompressionSpec(compress)
        every_block = {name: "compressed" for name in model.checkpoint_blocks()}
        batch = largest_fitting(lambda n: step_bytes_under(model, every_block, batch_of(n), compression=spec)
                                <= budget_bytes, per_rank, high)
    if batch <= per_rank:
        return ("compressing" if compress != "none" else "checkpointing") + \
            " frees no room for a larger batch in this memory budget"
    fraction = min(1.0, budget_bytes / step_bytes(model, batch_of(batch)))
    if compress != "none":
        profile = gemref_profile(model, batch_of(batch), options=tuple(options) + ("compressed",), compression=spec)
        solved = solve(profile, int(fraction * profile.base_bytes), objective)
        # every block compressed fits by measurement (it decided the batch) even where the
        # profile's additive prediction overshoots it by a fraction of a percent: a candidate too
        every = plan_of(profile, every_block, solved.budget_bytes, objective)
        key = (lambda p: (p.recompute_seconds, p.recompute_flops)) if objective == "time" else \
            (lambda p: (p.recompute_flops, p.recompute_seconds))
        plan = min((solved, every), key=key)
    return LargerBatch(batch, fraction, compress, plan)
