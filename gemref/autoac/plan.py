"""AutoAC's plan (chapter 05; the idea and the options: gemref/autoac/__init__.py): the solver
that picks one option per block, and the wrapper that applies it.

Solve: the least sum of cost(block, option) with base_bytes - sum freed(block, option) <= budget.
Cost, by `objective`: "time" (default) the recompute seconds, then FLOPs, then bytes freed (fewer
first); "flops" FLOPs first. Tuples add and compare lexicographically, so pruning is exact: after
each block a dynamic programme keeps the Pareto set of partial plans (bytes freed, capped at
what the budget needs; cost). Apply: a chosen block is replaced in its parent by a
`CheckpointedBlock` holding it as `_checkpoint_wrapped_module` (torch's checkpoint_wrapper's
name), which `state_dict()` drops: a checkpoint written under one plan loads under another."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Mapping

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts, noop_context_fn
from torch.utils.flop_counter import flop_registry

from .config import plan_text

OPTIONS = ("none", "save_matmuls", "full")  # exact: gradients unchanged bit for bit
APPROXIMATE_OPTIONS = ("compressed",)       # gradients within the compression format's error
OBJECTIVES = ("time", "flops")
PREFIX = "_checkpoint_wrapped_module."


@dataclass(frozen=True)
class BlockProfile:                  # one block's figures on the profiled step
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
        return self.base_bytes - sum(max([0, *b.freed_bytes.values()]) for b in self.blocks)


@dataclass(frozen=True)
class Plan:
    choices: dict[str, str]          # block fqn -> option (blocks left out: "none")
    blocks: tuple[str, ...]          # every profiled block, in forward order
    budget_bytes: int | None
    predicted_bytes: int             # base_bytes - freed
    recompute_flops: int             # on the profiled step (HFU counts them)
    recompute_seconds: float         # on the profiled step
    objective: str = "time"

    def summary(self) -> str:
        """The plan as the ac_plan switch's text, e.g. "sequence:SF interaction:-- cross:F-"."""
        return plan_text(self.choices, self.blocks)


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
    """The least-cost plan (module docstring) whose activation bytes fit `budget_bytes`; ValueError
    below `profile.min_bytes` (every block at its most memory-saving option)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}; valid: {', '.join(OBJECTIVES)}")
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
    if budget_bytes < profile.min_bytes:
        raise ValueError(f"activation budget {budget_bytes:,} bytes is below the minimum achievable "
                         f"{profile.min_bytes:,} bytes (every block at its most memory-saving option; "
                         f"{profile.base_bytes:,} bytes with no checkpointing)")
    need = profile.base_bytes - budget_bytes     # <= 0: every plan fits, the cheapest is no plan
    _, _, choices = min((s for s in partial_plans(profile, need, objective) if s[0] >= need), key=lambda s: s[1])
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
    """The undominated plans as (bytes freed capped at `need`, cost, one option per block); with
    `need` above any plan's bytes freed, the Pareto front of bytes freed vs cost."""
    states: list[tuple] = [(0, (0, 0, 0), ())]
    for block in profile.blocks:
        useful = [(o, block.freed_bytes[o], option_cost(block, o, objective)) for o in profile.options
                  if block.freed_bytes[o] > 0]
        grown = [(cap, cost, ch + ("none",)) for cap, cost, ch in states]
        grown += [(min(cap + f, need), tuple(a + b for a, b in zip(cost, c)), ch + (o,))
                  for cap, cost, ch in states for o, f, c in useful]
        grown.sort(key=lambda s: (-s[0], s[1]))         # keep a state only if cheaper than all freeing more
        states = []
        for s in grown:
            if not states or s[1] < states[-1][1]:
                states.append(s)
    return states


def save_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save the outputs of ops that cost FLOPs or whose cost is unknown (FlopCounterMode's, aten
    *attention* / *scaled_dot_product*, non-aten custom kernels), never of aten ops writing into
    a given tensor (`out=`, in-place: maybe a reused workspace); recompute the rest."""
    name = op.overloadpacket.__name__
    keep = op.namespace != "aten" or not op._schema.is_mutable and (
        op.overloadpacket in flop_registry or "attention" in name or "scaled_dot_product" in name)
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def _strip_prefix(module, state_dict, prefix, local_metadata):
    for key in [k for k in state_dict if k.startswith(prefix + PREFIX)]:
        state_dict[prefix + key[len(prefix + PREFIX):]] = state_dict.pop(key)
    return state_dict


def _add_prefix(state_dict, prefix, *args):
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + PREFIX)]:
        state_dict[prefix + PREFIX + key[len(prefix):]] = state_dict.pop(key)


class CheckpointedBlock(nn.Module):
    """One block under one option: "full", "save_matmuls" by torch.utils.checkpoint (non-reentrant),
    "compressed" under a SavedCompression's saved_tensors_hooks; without grad, the block as it is."""

    def __init__(self, block: nn.Module, option: str, compression=None):
        super().__init__()
        if option not in OPTIONS[1:] + APPROXIMATE_OPTIONS:
            raise ValueError(f"unknown checkpoint option {option!r}; valid: {', '.join(OPTIONS + APPROXIMATE_OPTIONS)}")
        if (option == "compressed") != (compression is not None):
            raise ValueError("a 'compressed' block needs its SavedCompression (and only it does)")
        self._checkpoint_wrapped_module = block
        self.option, self.compression, self.plan = option, compression, None   # plan: the solver's (apply_plan)
        self._register_state_dict_hook(_strip_prefix)
        self._register_load_state_dict_pre_hook(_add_prefix)

    # The hooks run eagerly around what torch.compile traces (a traced pack fails: no E8M0 on CPU).
    @torch.compiler.disable(recursive=False)
    def _compressed(self, *args, **kwargs):
        with self.compression.hooks(self._checkpoint_wrapped_module):
            return self._checkpoint_wrapped_module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._checkpoint_wrapped_module(*args, **kwargs)
        if self.option == "compressed":
            return self._compressed(*args, **kwargs)
        context = (partial(create_selective_checkpoint_contexts, save_matmuls_policy)
                   if self.option == "save_matmuls" else noop_context_fn)
        return checkpoint(self._checkpoint_wrapped_module, *args, use_reentrant=False, context_fn=context, **kwargs)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    try:
        return model.get_submodule(parent_name), child
    except AttributeError:
        raise ValueError(f"no block {name!r} in the model (no module {parent_name!r})") from None


def find_blocks(model: nn.Module, blocks) -> dict[str, nn.Module]:
    """{name: module} of blocks named by module path; ValueError naming the first missing one."""
    found = {}
    for name in blocks:
        if not isinstance(name, str) or not name:
            raise ValueError(f"block names are module paths such as 'layers.0', got {name!r}")
        parent, child = _parent(model, name)
        if (module := parent._modules.get(child)) is None:
            where = repr(name.rpartition(".")[0]) if "." in name else "the model"
            raise ValueError(f"no block {name!r} in the model: {where} has no submodule {child!r}")
        found[name] = module
    return found


def apply_plan(model: nn.Module, plan, *, compression=None) -> None:
    """Put each block of `plan` (a Plan or {block fqn: option}; "none" and blocks left out stay) in
    a CheckpointedBlock; "compressed" ones share a SavedCompression in `compression`'s format (a
    CompressionSpec, default mxfp8). Apply before torch.compile and FSDP."""
    choices = dict(getattr(plan, "choices", plan))
    blocks = find_blocks(model, choices)
    if done := [name for name, block in blocks.items() if isinstance(block, CheckpointedBlock)]:
        raise ValueError(f"{done[0]} is already checkpointed ({blocks[done[0]].option}); remove_plan first")
    shared = saved_compression(model)
    if "compressed" in choices.values():      # imported on use: the exact options need nothing of it
        from ..activation_compression import CompressionSpec, SavedCompression
        spec = compression or (shared.spec if shared is not None else CompressionSpec())
        if shared is not None and shared.spec != spec:
            raise ValueError(f"the model already compresses with {shared.spec}; remove_plan first")
        shared = shared or SavedCompression(spec)
    wrapped = {name: CheckpointedBlock(blocks[name], option, shared if option == "compressed" else None)
               for name, option in choices.items() if option != "none"}   # all checked before any moves
    for name, wrapper in wrapped.items():
        setattr(*_parent(model, name), wrapper)
    for wrapper in wrappers(model).values():
        wrapper.plan = plan if hasattr(plan, "choices") else None   # the solver's Plan, if any


def wrappers(model: nn.Module) -> dict[str, CheckpointedBlock]:
    """{module path: wrapper} of every wrapped block, in module order (nested: through the wrappers above)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, CheckpointedBlock)}


def applied_plan(model: nn.Module) -> dict[str, str]:
    """{block fqn: option} of the wrapped blocks, read off the model."""
    return {name.replace(PREFIX, ""): m.option for name, m in wrappers(model).items()}


def remove_plan(model: nn.Module) -> None:
    """Undo `apply_plan`: every wrapped block goes back in its parent's place."""
    for name, wrapper in sorted(wrappers(model).items(), key=lambda kv: -kv[0].count(".")):
        setattr(*_parent(model, name), wrapper._checkpoint_wrapped_module)


def saved_compression(model: nn.Module):
    """The SavedCompression (hooks and counters) of the model's "compressed" blocks, or None."""
    return next((m.compression for m in wrappers(model).values() if m.compression is not None), None)
