"""Applying torch.compile to a model, one region at a time (regional compilation), shape-generic for jagged batches.

Regions are named by the caller (`compile_model(model, ["stack.*", "head"])`: module names, a
module's method, or patterns; gemref/compile/regions.py), on any nn.Module. GEMRef's path names
its own (`gemref_regions`): in every GEMLayer, the dense parts of each block,
`SequenceBlock.project` / `.mix`, `InteractionBlock.forward`, `CrossBlock.project` / `.mix`
(gemref/model/blocks.py), plus the loss. Attention sits between `project` and `mix` and is not
compiled: it runs whatever kernel gemref.attention dispatches to, whose jagged kernels need
host-side lengths that a graph would have to guard on. Compiling per block instead of the whole
model keeps compile time to one graph per region kind: the layers share code, so layer 2..L
reuse layer 1's graphs (a region of any model whose blocks share a class does the same). Inside a region inductor fuses LayerNorm, the SiLU gate and the residual adds
into a few kernels around the matmuls (TORCH_LOGS=output_code shows them).

Dynamic shapes: dim 0 of every tensor handed to a region is the one that varies between
batches (history rows T, samples B, or B*N query tokens); it is marked dynamic before each
call (`torch._dynamo.maybe_mark_dynamic`), so the first compile is already generic and a
new batch does not recompile. Model widths stay static, so the kernels are specialised on
them. (A dim of size 0 or 1 is still specialised by dynamo: that shows up as a recompile.)

Measured, per model (`CompileStats`, also in the run record):
  * graphs: graphs compiled; recompiles: graphs compiled when a region is called again in a
    mode it already ran in (grad on/off x train/eval), i.e. after a guard failure.
    TORCH_LOGS=recompiles prints the failing guard.
  * compile_seconds: wall time of the calls that compiled. The backward graph is compiled
    together with the forward (`force_non_lazy_backward_lowering`, where torch has it), so
    the time includes it and no step after the first pays for compilation.

`activation_memory_budget` (0..1] is PyTorch 2's own answer to activation checkpointing
(`torch._functorch.config.activation_memory_budget`): inductor's min-cut partitioner then
saves at most that fraction of the region's activations and recomputes the rest. It acts
inside compiled regions only (gemref/measure/autoac_sweep.py compares it with AutoAC). Each budget
is its own backend, hence its own graphs; dynamo keeps at most `recompile_limit` (8) graphs
per function, so a process that tries many budgets resets dynamo between them (the bench does).
"""
from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch._functorch.config
import torch.fx.experimental._config as fx_config
from torch import Tensor, nn

from ..model.gem import ranking_loss
from .regions import resolve_regions
_STATS: "weakref.WeakKeyDictionary[nn.Module, CompileStats]" = weakref.WeakKeyDictionary()


@dataclass
class CompileStats:
    regions: list[str] = field(default_factory=list)
    graphs: int = 0                 # graphs compiled (first compiles and recompiles)
    recompiles: int = 0             # graphs compiled for a region in a mode it already ran in
    compile_seconds: float = 0.0    # wall time (s) of the calls that compiled
    region_seconds: dict[str, float] = field(default_factory=dict)   # per region kind: its share of it
    activation_memory_budget: float | None = None
    loss: Callable[..., Tensor] | None = None   # the compiled loss region

    def as_record(self) -> dict:
        kinds = sorted({n.split(".", 2)[-1] if n.startswith("layers.") else n for n in self.regions})
        return {"regions": len(self.regions), "kinds": kinds, "graphs": self.graphs, "recompiles": self.recompiles,
                "compile_s": self.compile_seconds, "compile_s_by_region": dict(self.region_seconds),
                "activation_memory_budget": self.activation_memory_budget}


def _graphs_compiled() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@functools.cache
def inductor_backend(memory_budget: float | None) -> Callable:
    """Inductor, with the backward compiled eagerly and an optional activation memory budget.

    One backend object per budget: dynamo keeps compiled graphs per backend, so models
    compiled with different budgets never share a graph (and models with the same one do).
    """
    patch: dict[str, Any] = {}
    if hasattr(torch._functorch.config, "force_non_lazy_backward_lowering"):
        patch["force_non_lazy_backward_lowering"] = True
    if memory_budget is not None:
        patch["activation_memory_budget"] = memory_budget
    # Inductor's CPU code picks a cascade summation for fp32 sums longer than 4096 and guards
    # on that (rows > 4096): with it a batch crossing 4096 history rows would recompile. While
    # lowering, let undecidable size tests fall to "no" without a guard instead.
    oblivious = {"backed_size_oblivious": True} if hasattr(fx_config, "backed_size_oblivious") else {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx   # heavy import: only when compiling

        with torch._functorch.config.patch(**patch), fx_config.patch(**oblivious):
            return compile_fx(gm, example_inputs)

    return backend


class CompiledRegion:
    """A compiled function that marks dim 0 of its tensor arguments dynamic and counts compiles.

    Not an nn.Module: installing it as an attribute leaves parameter names and state_dict
    keys unchanged (checkpoints and FSDP see the same model).
    """

    def __init__(self, name: str, fn: Callable, stats: CompileStats, owner: nn.Module | None = None,
                 backend: Callable | None = None):
        self.name = name
        self.fn = fn
        self.compiled = torch.compile(fn, backend=backend or inductor_backend(stats.activation_memory_budget))
        self.stats = stats
        self.owner = owner
        self.modes_seen: set[tuple[bool, bool]] = set()
        stats.regions.append(name)

    def __call__(self, *args: Any) -> Any:
        for a in args:
            if isinstance(a, Tensor) and a.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(a, 0)
        mode = (torch.is_grad_enabled(), bool(getattr(self.owner, "training", True)))
        before, start = _graphs_compiled(), time.perf_counter()
        out = self.compiled(*args)
        new_graphs = _graphs_compiled() - before
        if new_graphs:
            self.stats.graphs += new_graphs
            seconds = time.perf_counter() - start
            self.stats.compile_seconds += seconds
            kind = self.name.split(".", 2)[-1] if self.name.startswith("layers.") else self.name
            self.stats.region_seconds[kind] = self.stats.region_seconds.get(kind, 0.0) + seconds
            if mode in self.modes_seen:
                self.stats.recompiles += new_graphs
        self.modes_seen.add(mode)
        return out


def compile_model(model: nn.Module, regions: Sequence[str], *, activation_memory_budget: float | None = None,
                  loss: Callable[..., Tensor] | None = None) -> CompileStats:
    """Compile the named regions of any model in place, each on its own (regional compilation, as
    torchtitan compiles each block); returns (and registers) the stats.

    `regions`: module names (their `forward`), "module.method" names, or fnmatch patterns of
    either, matched per dot-separated segment ("stack.*"): gemref/compile/regions.py. A name that
    matches nothing, or a region inside another, is a ValueError naming it. Each region becomes a
    `CompiledRegion` set as an instance attribute (dim 0 of every tensor argument dynamic, so a
    new jagged batch does not recompile; parameter names and state_dict keys unchanged). `loss`:
    a loss function to compile as one more region, "loss" (`loss_function(model)` returns it).
    GEMRef's path names its regions explicitly (`gemref_regions(model, kinds)`,
    gemref/train/compose.py). Apply after activation checkpointing and before FSDP: a region named
    by a block that AutoAC wrapped (gemref/autoac/plan.py `CheckpointedBlock`) is the block inside
    the wrapper, so the checkpoint stays eager around the compiled block.
    """
    if model in _STATS:
        raise ValueError("model is already compiled")
    if activation_memory_budget is not None and not 0.0 < activation_memory_budget <= 1.0:
        raise ValueError(f"activation_memory_budget must be in (0, 1], got {activation_memory_budget}")
    resolved = resolve_regions(model, regions) if regions or loss is None else []
    if already := [r.name for r in resolved if isinstance(getattr(r.owner, r.attr), CompiledRegion)]:
        raise ValueError(f"region(s) {already} are compiled already")
    stats = CompileStats(activation_memory_budget=activation_memory_budget)
    for r in resolved:
        fn = getattr(r.owner, r.attr)
        setattr(r.owner, r.attr, CompiledRegion(r.name, fn, stats, r.owner))
    if loss is not None:
        stats.loss = CompiledRegion("loss", loss, stats, model)
    _STATS[model] = stats
    return stats


def compile_stats(model: nn.Module) -> CompileStats | None:
    """The stats of a model compiled by `compile_model` (None if it was not)."""
    return _STATS.get(model)


def loss_function(model: nn.Module) -> Callable[..., Tensor]:
    """The loss to use with this model: the compiled region if the model is compiled."""
    stats = _STATS.get(model)
    return stats.loss if stats is not None and stats.loss is not None else ranking_loss
