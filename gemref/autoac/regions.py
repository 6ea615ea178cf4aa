"""Per-region activation budgets, with compressed saved activations as one more option per
region, against one budget fraction shared by every region; and the Pareto front of
activation bytes vs recompute FLOPs for both.

A region is one checkpointable block (gemref/autoac/solver.py: `ac_blocks`). Two ways to turn
a step's memory budget into per-region choices:
  * joint (AutoAC, `solver.solve`): every region gets its own budget, the bytes of the option
    chosen for it, and the choices are solved together (a multiple-choice knapsack) for the
    least recompute under the step's budget. `region_budgets` reads the budgets off a plan;
  * uniform (one global fraction, as PyTorch 2's activation_memory_budget applies one
    fraction to every compiled graph): each region independently keeps at most `fraction`
    of its own saved bytes, at its least recompute (`uniform_plan`).
Any uniform plan is a feasible joint plan at its own bytes, so at equal memory the joint
solver never recomputes more (tests check it on random profiles). `pareto_front` gives the
joint front exactly (the solver's dynamic programme, uncapped), `uniform_front` the plans
of every distinct fraction.

`profile_regions` measures the "compressed" option of every block (gemref/autoac/compress.py)
on top of `profile_blocks`: bytes freed against "none" and recompute FLOPs (zero: expanding
FP8 costs no FLOPs, only memory traffic), so the solver can pick it per region.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from ..data.jagged import JaggedBatch
from .compress import CompressionSpec
from .profile import backward_flops, forward_with_bytes, profile_blocks
from .solver import ActivationProfile, Plan, ac_blocks, apply_plan, partial_plans, plan_of, remove_plan, solve


def profile_regions(model: nn.Module, batch: JaggedBatch, compression: CompressionSpec | None = None, *,
                    options: tuple[str, ...] = ("selective", "full"),
                    autocast_dtype: torch.dtype | None = None) -> ActivationProfile:
    """`profile_blocks`, plus the "compressed" option of every block measured the same way
    (that block compressed, every other fully checkpointed). Costs n_blocks + 1 more steps."""
    spec = compression or CompressionSpec()
    profile = profile_blocks(model, batch, options=options, autocast_dtype=autocast_dtype)
    names = list(ac_blocks(model))

    def step(choices):
        apply_plan(model, choices, compression=spec)
        try:
            loss, nbytes = forward_with_bytes(model, batch, autocast_dtype)
            return nbytes, backward_flops(loss, model)
        finally:
            remove_plan(model)

    all_full = {name: "full" for name in names}
    reference_bytes, reference_backward = step(all_full)
    blocks = []
    for block in profile.blocks:
        # "none" for this block = the all-full step plus what "full" frees (profile_blocks' definitions)
        none_bytes = reference_bytes + block.freed_bytes["full"]
        none_backward = reference_backward - block.recompute_flops["full"]
        nbytes, backward = step({**all_full, block.name: "compressed"})
        blocks.append(replace(block, freed_bytes={**block.freed_bytes, "compressed": none_bytes - nbytes},
                              recompute_flops={**block.recompute_flops, "compressed": backward - none_backward}))
    return replace(profile, blocks=tuple(blocks), options=profile.options + ("compressed",))


def without_option(profile: ActivationProfile, option: str) -> ActivationProfile:
    """The same profile with one option removed (to solve with and without compression)."""
    if option not in profile.options:
        raise ValueError(f"option {option!r} is not in the profile's {profile.options}")
    return replace(profile, options=tuple(o for o in profile.options if o != option),
                   blocks=tuple(replace(b, freed_bytes={o: v for o, v in b.freed_bytes.items() if o != option},
                                        recompute_flops={o: v for o, v in b.recompute_flops.items() if o != option})
                                for b in profile.blocks))


def region_bytes(profile: ActivationProfile) -> dict[str, int]:
    """Each region's own activation bytes with nothing checkpointed: what it saves, or what
    an option frees if that is more (a checkpoint also frees temporaries the block created)."""
    return {b.name: max([b.saved_bytes] + list(b.freed_bytes.values())) for b in profile.blocks}


def region_budgets(profile: ActivationProfile, plan: Plan) -> dict[str, int]:
    """The bytes each region keeps under `plan` (its per-region budget)."""
    own = region_bytes(profile)
    return {b.name: own[b.name] - (b.freed_bytes[plan.choices[b.name]] if b.name in plan.choices else 0)
            for b in profile.blocks}


def uniform_plan(profile: ActivationProfile, fraction: float) -> Plan:
    """One fraction for every region: each keeps at most `fraction` of its own bytes, by its
    least-recompute option that does (ties: the one keeping more); a region that cannot
    takes its most memory-saving option."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    own, choices = region_bytes(profile), {}
    for b in profile.blocks:
        options = [("none", 0, 0)] + [(o, b.freed_bytes[o], b.recompute_flops[o]) for o in profile.options]
        fits = [opt for opt in options if own[b.name] - opt[1] <= fraction * own[b.name]]
        best = min(fits, key=lambda opt: (opt[2], -(own[b.name] - opt[1]))) if fits else \
            max(options, key=lambda opt: (opt[1], -opt[2]))
        choices[b.name] = best[0]
    return plan_of(profile, choices)


def _undominated(plans: list[Plan]) -> list[Plan]:
    """Plans not beaten on both predicted bytes and recompute FLOPs, by bytes ascending."""
    out: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.recompute_flops, p.predicted_bytes)):
        if not out or plan.predicted_bytes < out[-1].predicted_bytes:
            out.append(plan)
    return sorted(out, key=lambda p: p.predicted_bytes)


def uniform_front(profile: ActivationProfile) -> list[Plan]:
    """The undominated plans over every fraction at which some region changes its choice."""
    own = region_bytes(profile)
    fractions = {0.0, 1.0} | {(own[b.name] - f) / own[b.name] for b in profile.blocks if own[b.name] > 0
                              for f in b.freed_bytes.values() if 0 <= f <= own[b.name]}
    return _undominated([uniform_plan(profile, f) for f in sorted(fractions)])


def pareto_front(profile: ActivationProfile) -> list[Plan]:
    """Every joint plan on the front of activation bytes vs recompute FLOPs (exact)."""
    names = [b.name for b in profile.blocks]
    uncapped = 1 + sum(max([0] + list(b.freed_bytes.values())) for b in profile.blocks)
    states = partial_plans(profile, uncapped)
    return _undominated([plan_of(profile, dict(zip(names, choices))) for _, _, _, choices in states])


def auto_checkpoint_regions(model: nn.Module, batch: JaggedBatch, budget_fraction: float,
                            compression: CompressionSpec | None = None, *,
                            options: tuple[str, ...] = ("selective", "full"),
                            autocast_dtype: torch.dtype | None = None) -> tuple[Plan, ActivationProfile]:
    """`profile.auto_checkpoint` with "compressed" as one more option per region: profile,
    solve for `budget_fraction` of the no-AC activation bytes, apply (eager model)."""
    if not 0.0 < budget_fraction <= 1.0:
        raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
    spec = compression or CompressionSpec()
    profile = profile_regions(model, batch, spec, options=options, autocast_dtype=autocast_dtype)
    plan = solve(profile, int(budget_fraction * profile.base_bytes))
    apply_plan(model, plan, compression=spec)
    return plan, profile
