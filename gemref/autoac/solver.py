"""AutoAC: choose which blocks to checkpoint so activations fit a memory budget, at the least
recompute, and apply the choice from outside the model.

Candidates are the 3 * n_layers blocks of GEMRef (each GEMLayer's sequence, interaction and
cross block), each with one of four options:
  * "none": keep everything the block saves for backward;
  * "selective": non-reentrant checkpoint with a selective policy: the outputs of ops that
    cost FLOPs (matmuls, attention, any op FlopCounterMode prices, any non-aten kernel) are
    saved, everything else (norms, activations, masks, views, elementwise) is recomputed
    in backward. Zero recomputed FLOPs; the recompute is memory-bound work;
  * "full": non-reentrant checkpoint of the whole block: only its inputs stay alive, its
    forward runs again in backward;
  * "compressed": nothing recomputed; what the block saves for backward is stored as FP8 /
    MXFP8 and expanded in backward (gemref/autoac/compress.py; `apply_plan(..., compression=)`
    picks the format). Approximate: gradients carry the E4M3 rounding of the activations.
gemref/autoac/profile.py measures, per block and option, the activation bytes it frees and the
FLOPs it recomputes (gemref/autoac/regions.py adds "compressed"); `solve` picks one option per
block. That is one budget per block, allocated jointly under the step's budget;
gemref/autoac/regions.py has the alternative of one fraction for every block, and the Pareto
fronts of both.

The solver. Minimise recompute FLOPs subject to  base_bytes - sum(freed) <= budget, one
option per block: a multiple-choice knapsack. The bytes are large integers (10^6..10^10),
so a table over bytes would need rounding; instead the dynamic programme keeps, after each
block, the Pareto set of partial plans (bytes freed, capped at what the budget needs; cost),
dropping a partial plan when another frees at least as much at no more cost. This is exact
(a dominated partial plan can never complete into a better plan), and the set stays small
because blocks of one kind repeat per layer with equal figures. Cost is compared as
(recompute FLOPs, bytes freed): among plans with equal FLOPs the one that frees (so
recomputes) fewer bytes wins, since recomputing elementwise work costs memory traffic in
proportion to those bytes. Options that free nothing are dropped up front.
"""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Mapping

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import flop_registry

from ..compile import CompiledRegion
from .compress import CompressionSpec, SavedCompression, wrap_compressed
from ..mfu.flops import BLOCK_KINDS, block_kind

_PLANS: "weakref.WeakKeyDictionary[nn.Module, Plan]" = weakref.WeakKeyDictionary()
_COMPRESSION: "weakref.WeakKeyDictionary[nn.Module, SavedCompression]" = weakref.WeakKeyDictionary()
OPTIONS = ("none", "selective", "full")     # exact: gradients unchanged bit for bit
APPROXIMATE_OPTIONS = ("compressed",)       # gradients within the compression format's error
LETTERS = {"none": "-", "selective": "S", "full": "F", "compressed": "C"}
# What "compressed" wraps in each block: its dense sub-regions (gemref/autoac/compress.py: the
# attention kernel's saved tensors stay exact), the units torch.compile compiles.
COMPRESSED_METHODS = {"sequence": ("project", "mix"), "interaction": ("forward",), "cross": ("project", "mix")}


def ac_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """{"layers.{i}.{kind}": block} for every block of a GEMRef, in forward order."""
    return {f"layers.{i}.{kind}": getattr(layer, kind)
            for i, layer in enumerate(model.layers) for kind in BLOCK_KINDS}


# ----------------------------------------------------------------------------- apply


def saves_output(op) -> bool:
    """Selective policy: keep the output of ops that cost FLOPs or whose cost is unknown.

    Non-aten ops (custom kernels such as gemref::cpu_jagged_fwd and gemref::gdpa_triton_fwd)
    are saved: the policy sees them as one op, so their FLOPs are never recomputed. Aten ops
    that write into a tensor they are given (`out=` variants, in-place ops) are never saved:
    what they write may be a caller's reused workspace, not an activation, and the caller
    may overwrite it later in the forward.
    """
    if op.namespace == "aten" and op._schema.is_mutable:
        return False
    if op.namespace != "aten":
        return True
    name = op.overloadpacket.__name__
    return op.overloadpacket in flop_registry or "attention" in name or "scaled_dot_product" in name


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if saves_output(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, option: str):
    context_fn = (partial(create_selective_checkpoint_contexts, _selective_policy)
                  if option == "selective" else None)

    def run(*args, **kwargs):
        if not torch.is_grad_enabled():   # evaluation: nothing is saved, nothing to recompute
            return forward(*args, **kwargs)
        if context_fn is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    run.gemref_ac = option
    return run


def _compress_block(block: nn.Module, kind: str, compression: SavedCompression) -> None:
    """Wrap the block's dense sub-regions in the hooks; mark its forward "compressed"."""
    forward = block.forward
    for method in COMPRESSED_METHODS[kind]:
        setattr(block, method, wrap_compressed(getattr(block, method), compression, block))
    if "forward" not in COMPRESSED_METHODS[kind]:
        def marked(*args, **kwargs):
            return forward(*args, **kwargs)
        block.forward = marked
    block.forward.gemref_ac = "compressed"


def apply_plan(model: nn.Module, plan: "Plan | Mapping[str, str]", *,
               compression: CompressionSpec | None = None) -> None:
    """Checkpoint (or compress) blocks from outside: a Plan, or {block name: option} (blocks
    left out stay as they are).

    The block's `forward` is replaced by an instance attribute, so parameter names and the
    model code are unchanged. Apply before torch.compile and FSDP (gemref/train/compose.py).
    "compressed" blocks share one SavedCompression per model (its counters:
    `saved_compression(model).stats`), in `compression`'s format (default CompressionSpec()).
    """
    choices = plan.choices if isinstance(plan, Plan) else plan
    blocks = ac_blocks(model)
    for name, option in choices.items():
        if name not in blocks:
            raise ValueError(f"unknown block {name!r}; valid: {', '.join(blocks)}")
        if option not in OPTIONS + APPROXIMATE_OPTIONS:
            raise ValueError(f"unknown checkpoint option {option!r} for {name}; "
                             f"valid: {', '.join(OPTIONS + APPROXIMATE_OPTIONS)}")
        if option != "none" and hasattr(blocks[name].forward, "gemref_ac"):
            raise ValueError(f"{name} is already checkpointed; remove_plan first")
    if "compressed" in choices.values():
        current = _COMPRESSION.get(model)
        spec = compression or (current.spec if current is not None else CompressionSpec())
        if current is not None and current.spec != spec:
            raise ValueError(f"the model already compresses with {current.spec}; remove_plan first")
        if current is None:
            _COMPRESSION[model] = SavedCompression(spec)
    for name, option in choices.items():
        if option == "compressed":
            _compress_block(blocks[name], block_kind(name), _COMPRESSION[model])
        elif option != "none":
            blocks[name].forward = _checkpointed(blocks[name].forward, option)
    if isinstance(plan, Plan):
        _PLANS[model] = plan


def remove_plan(model: nn.Module) -> None:
    """Undo `apply_plan` (every block runs its own forward again)."""
    _PLANS.pop(model, None)
    _COMPRESSION.pop(model, None)
    for name, block in ac_blocks(model).items():
        for method in ("forward", "project", "mix"):
            wrapped = block.__dict__.get(method)
            if isinstance(wrapped, CompiledRegion) and (hasattr(wrapped, "gemref_ac") or
                                                        hasattr(wrapped.fn, "gemref_compressed")):
                raise ValueError(f"{name} is compiled: its checkpoint is inside the graph; rebuild the model")
            if hasattr(wrapped, "gemref_ac") or hasattr(wrapped, "gemref_compressed"):
                delattr(block, method)


def applied_plan(model: nn.Module) -> dict[str, str]:
    """{block name: option} of the checkpointed blocks, read off the model."""
    return {name: block.__dict__["forward"].gemref_ac for name, block in ac_blocks(model).items()
            if hasattr(block.__dict__.get("forward"), "gemref_ac")}


def saved_compression(model: nn.Module) -> SavedCompression | None:
    """The hooks (and counters) of the model's "compressed" blocks, if any."""
    return _COMPRESSION.get(model)


def plan_record(model: nn.Module) -> dict | None:
    """The run-record entry of the plan applied to the model (None when nothing is)."""
    choices = applied_plan(model)
    if model in _PLANS:
        return _PLANS[model].as_record()
    return {"choices": choices, "counts": dict(Counter(choices.values()))} if choices else None


# ----------------------------------------------------------------------------- solve


@dataclass(frozen=True)
class BlockProfile:
    """One block's figures on the profiled batch (bytes, FLOPs, seconds)."""

    name: str
    saved_bytes: int                 # bytes this block saves for backward, storages deduplicated
    forward_flops: int               # FLOPs of its forward (FlopCounterMode)
    forward_seconds: float           # time of its forward
    freed_bytes: dict[str, int] = field(default_factory=dict)       # option -> bytes freed
    recompute_flops: dict[str, int] = field(default_factory=dict)   # option -> FLOPs recomputed

    @property
    def kind(self) -> str:
        return block_kind(self.name)


@dataclass(frozen=True)
class ActivationProfile:
    base_bytes: int                  # activation bytes of a step with nothing checkpointed
    blocks: tuple[BlockProfile, ...]
    options: tuple[str, ...]         # options measured (besides "none")
    method: str                      # how bytes were measured (gemref/autoac/profile.py)
    model_flops: int                 # model FLOPs of the profiled step (to express recompute in %)

    @property
    def min_bytes(self) -> int:
        """The least activation memory any plan reaches."""
        return self.base_bytes - sum(max([0] + list(b.freed_bytes.values())) for b in self.blocks)


@dataclass(frozen=True)
class Plan:
    choices: dict[str, str]          # block name -> option (blocks left out: "none")
    budget_bytes: int | None
    predicted_bytes: int             # base_bytes - freed
    recompute_flops: int             # on the profiled batch
    n_layers: int

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.choices.values()))

    def summary(self) -> str:
        """E.g. "sequence:SSF interaction:--C cross:F--" (per kind, layer by layer)."""
        return " ".join(kind + ":" + "".join(LETTERS[self.choices.get(f"layers.{i}.{kind}", "none")]
                                             for i in range(self.n_layers)) for kind in BLOCK_KINDS)

    def as_record(self) -> dict:
        return {"choices": dict(self.choices), "counts": self.counts(), "summary": self.summary(),
                "budget_bytes": self.budget_bytes, "predicted_bytes": self.predicted_bytes,
                "recompute_flops": self.recompute_flops}


def parse_plan(text: str, n_layers: int) -> dict[str, str]:
    """Plan.summary() text ("sequence:SSF interaction:--C cross:F--") -> {block name: option}
    of the blocks it checkpoints or compresses; ValueError naming what is wrong."""
    letters = {v: k for k, v in LETTERS.items()}
    parts = dict(part.split(":", 1) for part in text.split() if ":" in part)
    if sorted(parts) != sorted(BLOCK_KINDS) or len(text.split()) != len(BLOCK_KINDS):
        raise ValueError(f"ac_plan {text!r}: expected one 'kind:letters' per block kind "
                         f"({', '.join(BLOCK_KINDS)}), e.g. 'sequence:SF interaction:-- cross:F-'")
    choices = {}
    for kind, row in parts.items():
        if len(row) != n_layers or any(c not in letters for c in row):
            raise ValueError(f"ac_plan {text!r}: {kind} needs {n_layers} letters of "
                             f"{''.join(letters)} (one per layer), got {row!r}")
        choices.update({f"layers.{i}.{kind}": letters[c] for i, c in enumerate(row) if letters[c] != "none"})
    return choices


def plan_of(profile: ActivationProfile, choices: Mapping[str, str], budget_bytes: int | None = None) -> Plan:
    """The Plan (predicted bytes, recompute FLOPs) of given choices, from the profile."""
    by_name = {b.name: b for b in profile.blocks}
    picked = {n: o for n, o in choices.items() if o != "none"}
    freed = sum(by_name[n].freed_bytes[o] for n, o in picked.items())
    flops = sum(by_name[n].recompute_flops[o] for n, o in picked.items())
    return Plan(picked, budget_bytes, profile.base_bytes - freed, flops, len(profile.blocks) // len(BLOCK_KINDS))


def solve(profile: ActivationProfile, budget_bytes: int) -> Plan:
    """The least-recompute plan whose activation bytes fit `budget_bytes` (see module docstring).

    Raises ValueError when even the most memory-saving plan does not fit.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
    if budget_bytes < profile.min_bytes:
        raise ValueError(f"activation budget {budget_bytes:,} bytes is below the minimum achievable "
                         f"{profile.min_bytes:,} bytes (every block at its most memory-saving option; "
                         f"{profile.base_bytes:,} bytes with no checkpointing)")
    need = profile.base_bytes - budget_bytes
    if need <= 0:
        return plan_of(profile, {}, budget_bytes)
    feasible = [s for s in partial_plans(profile, need) if s[0] >= need]
    assert feasible, "min_bytes said the budget is reachable"
    _, _, _, choices = min(feasible, key=lambda s: (s[1], s[2]))
    plan = plan_of(profile, dict(zip((b.name for b in profile.blocks), choices)), budget_bytes)
    assert plan.predicted_bytes <= budget_bytes
    return plan


def partial_plans(profile: ActivationProfile, need: int) -> list[tuple[int, int, int, tuple[str, ...]]]:
    """The dynamic programme: the undominated plans as (bytes freed capped at `need`, recompute
    FLOPs, bytes freed, one option per block). With need >= base_bytes nothing is capped, and
    the list holds every plan on the Pareto front of bytes freed vs (FLOPs, bytes freed)."""
    states: list[tuple[int, int, int, tuple[str, ...]]] = [(0, 0, 0, ())]
    for block in profile.blocks:
        useful = [(o, block.freed_bytes[o], block.recompute_flops[o]) for o in profile.options
                  if block.freed_bytes[o] > 0]
        grown = [(cap, fl, fr, ch + ("none",)) for cap, fl, fr, ch in states]
        grown += [(min(cap + f, need), fl + c, fr + f, ch + (o,))
                  for cap, fl, fr, ch in states for o, f, c in useful]
        states = _pareto(grown)
    return states


def _pareto(states):
    """Drop every partial plan that another frees at least as much for at most the cost."""
    states.sort(key=lambda s: (-s[0], s[1], s[2]))
    kept, best = [], None
    for s in states:
        if best is None or (s[1], s[2]) < best:
            kept.append(s)
            best = (s[1], s[2])
    return kept
