"""torch.compile one region at a time (regional compilation), shape-generic for jagged batches.

Regions: in every GEMLayer, the dense parts of each block, `SequenceBlock.project` / `.mix`,
`InteractionBlock.forward`, `CrossBlock.project` / `.mix` (gemref/model/blocks.py), plus the
loss. Attention sits between `project` and `mix` and is not compiled: it runs whatever
kernel gemref.attention dispatches to, whose jagged kernels need host-side lengths that a
graph would have to guard on. Compiling per block instead of the whole model keeps compile
time to one graph per region kind: the layers share code, so layer 2..L reuse layer 1's
graphs. Inside a region inductor fuses LayerNorm, the SiLU gate and the residual adds
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
inside compiled regions only (gemref/bench/autoac.py compares it with AutoAC). Each budget
is its own backend, hence its own graphs; dynamo keeps at most `recompile_limit` (8) graphs
per function, so a process that tries many budgets resets dynamo between them (the bench does).
"""
from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._functorch.config
import torch.fx.experimental._config as fx_config
from torch import Tensor, nn

from .config import COMPILE_REGIONS
from .model import ranking_loss

# region kind -> (block, method) of every GEMLayer; COMPILE_REGIONS (gemref/config) adds "loss"
REGION_KINDS = {"sequence.project": ("sequence", "project"), "sequence.mix": ("sequence", "mix"),
                "interaction": ("interaction", "forward"), "cross.project": ("cross", "project"),
                "cross.mix": ("cross", "mix")}
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


def compile_model(model: nn.Module, *, activation_memory_budget: float | None = None,
                  regions: "tuple[str, ...] | None" = None) -> CompileStats:
    """Compile GEMRef's blocks in place, region by region; returns (and registers) the stats.

    `regions`: the region kinds to compile (COMPILE_REGIONS names: REGION_KINDS and "loss";
    None: all of them); the others stay eager (e.g. a `plan_regions` plan: the kinds that won).
    Apply after activation checkpointing (gemref/autoac/solver.py) and before FSDP: a checkpointed
    interaction block is then compiled with its checkpoint inside the graph, while the
    checkpoint of a sequence or cross block wraps its compiled regions and eager attention.
    """
    if model in _STATS:
        raise ValueError("model is already compiled")
    if activation_memory_budget is not None and not 0.0 < activation_memory_budget <= 1.0:
        raise ValueError(f"activation_memory_budget must be in (0, 1], got {activation_memory_budget}")
    chosen = COMPILE_REGIONS if regions is None else tuple(regions)
    if unknown := [r for r in chosen if r not in COMPILE_REGIONS]:
        raise ValueError(f"unknown region kind(s) {unknown}; valid: {', '.join(COMPILE_REGIONS)}")
    stats = CompileStats(activation_memory_budget=activation_memory_budget)
    for i, layer in enumerate(model.layers):
        for kind, (block_name, method) in REGION_KINDS.items():
            if kind not in chosen:
                continue
            block = getattr(layer, block_name)
            region = CompiledRegion(f"layers.{i}.{kind}", getattr(block, method), stats, block)
            if hasattr(region.fn, "gemref_ac"):   # checkpointed (gemref/autoac/solver.py): keep it visible
                region.gemref_ac = region.fn.gemref_ac
            setattr(block, method, region)
    if "loss" in chosen:
        stats.loss = CompiledRegion("loss", ranking_loss, stats, model)
    _STATS[model] = stats
    return stats


def compile_stats(model: nn.Module) -> CompileStats | None:
    """The stats of a model compiled by `compile_model` (None if it was not)."""
    return _STATS.get(model)


def loss_function(model: nn.Module) -> Callable[..., Tensor]:
    """The loss to use with this model: the compiled region if the model is compiled."""
    stats = _STATS.get(model)
    return stats.loss if stats is not None and stats.loss is not None else ranking_loss




def region_inputs(model: nn.Module, forward: Callable[[], Any]) -> dict[str, tuple]:
    """The arguments each region kind of the first layer gets when `forward()` runs the model
    (detached; floating-point ones require grad so a region can be run forward+backward)."""
    layer = model.layers[0]
    inputs: dict[str, tuple] = {}
    for name, (block_name, method) in REGION_KINDS.items():
        block = getattr(layer, block_name)

        def spy(*args, _name=name, _fn=getattr(block, method)):
            inputs.setdefault(_name, tuple(a.detach().requires_grad_(a.is_floating_point()) for a in args))
            return _fn(*args)
        setattr(block, method, spy)
    try:
        with torch.no_grad():
            forward()
    finally:
        for block_name, method in REGION_KINDS.values():
            delattr(getattr(layer, block_name), method)
    return inputs


def run_region(fn: Callable, args: tuple) -> None:
    """Forward and backward of one region (the sum of its outputs as the loss)."""
    outs = fn(*args)
    sum(o.float().sum() for o in (outs if isinstance(outs, tuple) else (outs,))).backward()


def eager_vs_compiled(eager: Callable, compiled: Callable, args: tuple, reps: int,
                      warmup: int = 1) -> tuple[float, float]:
    """Median seconds of one forward+backward call (`run_region`) of `eager` and of `compiled` on
    `args`, interleaved and alternating who goes first (gemref/mfu/timing.interleaved), after
    `warmup` untimed rounds, so a change in the machine's load hits both."""
    import statistics

    from .mfu.timing import interleaved, stopwatch

    device = next((a.device for a in args if isinstance(a, Tensor)), torch.device("cpu"))
    fns = {"eager": eager, "compiled": compiled}

    def timed(name: str) -> float:
        with stopwatch(device) as elapsed:
            run_region(fns[name], args)
        return elapsed[0]

    samples = interleaved({n: (lambda k, n=n: timed(n)) for n in fns}, reps, warmup=warmup, alternate=True)
    return statistics.median(samples["eager"]), statistics.median(samples["compiled"])


PLAN_MARGIN = 0.03     # a region kind is compiled only if compiled is this much faster (median) than eager
PLAN_REPS = 7          # interleaved forward+backward calls per variant and region when planning


@dataclass
class RegionPlan:
    """Which region kinds to compile: those whose compiled forward+backward beat eager by more
    than `margin` on the model's own inputs; `rows` has each kind's measurement."""

    kept: tuple[str, ...]
    rows: list[dict]
    margin: float

    def regions_text(self) -> str:
        """TrainConfig.compile_regions of this plan ("" when no region wins)."""
        return ",".join(self.kept)


def plan_regions(model: nn.Module, batch: Any, *, reps: int = PLAN_REPS, margin: float = PLAN_MARGIN) -> RegionPlan:
    """Measure every region kind of layer 0 and the loss, eager against compiled,
    forward+backward on the inputs `model(batch)` hands them; keep the kinds whose median
    compiled time is below (1 - margin) x eager's.

    `model` is an eager GEMRef (left unchanged); each kind is compiled afresh with its own
    backend (so no graph is shared with a later `compile_model`), dim 0 dynamic as there. The
    calls alternate (`eager_vs_compiled`, one warm-up call each). Rows: region, eager_ms,
    compiled_ms (medians, milliseconds), speedup (eager/compiled), compile_s (seconds), kept.
    """
    if reps < 1 or not 0.0 <= margin < 1.0:
        raise ValueError(f"need reps >= 1 and margin in [0, 1), got {reps}, {margin}")
    logits: list[Tensor] = []
    inputs = region_inputs(model, lambda: logits.append(model(batch)))
    inputs["loss"] = (logits[0].detach().float().requires_grad_(True), batch.labels)
    fns = {kind: getattr(getattr(model.layers[0], block), method) for kind, (block, method) in REGION_KINDS.items()}
    fns["loss"] = ranking_loss
    rows = []
    for kind in COMPILE_REGIONS:
        stats = CompileStats()
        region = CompiledRegion(kind, fns[kind], stats, model, backend=inductor_backend.__wrapped__(None))  # own graphs
        start = time.perf_counter()
        run_region(region, inputs[kind])                  # compiles (forward and backward)
        compile_s = time.perf_counter() - start
        eager, compiled = eager_vs_compiled(fns[kind], region, inputs[kind], reps)
        rows.append({"region": kind, "eager_ms": 1e3 * eager, "compiled_ms": 1e3 * compiled,
                     "speedup": eager / compiled, "compile_s": compile_s, "kept": compiled < (1 - margin) * eager})
    model.zero_grad(set_to_none=True)                    # the timing runs left gradients on the weights
    return RegionPlan(tuple(r["region"] for r in rows if r["kept"]), rows, margin)


def call_overhead(reps: int = 50, width: int = 64) -> dict[str, float]:
    """Seconds a compiled region costs per forward+backward call beyond the work inside it: a
    trivial region (LayerNorm-free y = x * w + x on one (1, width) row) timed eager and compiled
    (dim 0 dynamic, gemref's backend), interleaved, medians of `reps` calls each. The difference
    is the fixed cost (dynamo's guard check, AOTAutograd's forward and backward wrappers, the
    graph call) that fusion inside a region must win back before the region gains."""
    def tiny(x: Tensor, w: Tensor) -> Tensor:
        return x * w + x

    x = torch.randn(1, width, requires_grad=True)
    w = torch.randn(width, requires_grad=True)
    region = CompiledRegion("overhead", tiny, CompileStats(), backend=inductor_backend.__wrapped__(None))
    run_region(region, (x, w))                            # compiles
    eager, compiled = eager_vs_compiled(tiny, region, (x, w), reps, warmup=2)
    return {"eager_s": eager, "compiled_s": compiled, "overhead_s": compiled - eager}


_FUSED = r"\b(cpp_fused_\w+|triton_\w+_fused_\w+)\s*=\s*async_compile"
# the GEMMs a graph leaves to a library: inductor's extern BLAS calls, and gemref's FastLinear ops
_MATMULS = r"extern_kernels\.(?:mm|addmm|bmm|baddbmm)\b|torch\.ops\.fastlinear\.\w+"


def generated_kernels(codes: list[str], labels: list[str]) -> list[dict]:
    """Per graph of inductor's output code (e.g. from torch._inductor.utils.run_and_get_code):
    its fused kernels (a name lists the ops fused into one loop) and the GEMMs left to a library."""
    import re

    return [{"graph": label, "fused_kernels": re.findall(_FUSED, code), "matmuls": len(re.findall(_MATMULS, code))}
            for label, code in zip(labels, codes)]


def fused_kernels(model: nn.Module, forward: Callable[[], Any]) -> list[dict]:
    """What inductor generates for each region kind of the first layer: per pass, the fused
    kernels (a name lists the ops fused into one loop) and the matmuls left to the BLAS.

    `model` is an eager GEMRef and `forward()` runs it once; every region is then compiled
    afresh (in a temporary inductor cache) and run forward+backward.
    """
    from torch._inductor import utils as inductor_utils

    fresh_cache = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    inputs = region_inputs(model, forward)
    rows = []
    for name, (block_name, method) in REGION_KINDS.items():
        fn = torch.compile(getattr(getattr(model.layers[0], block_name), method),
                           backend=inductor_backend.__wrapped__(None))   # a new backend: a new graph
        with fresh_cache():
            _, codes = inductor_utils.run_and_get_code(run_region, fn, inputs[name])
        for row in generated_kernels(codes, ["forward", "backward"]):
            rows.append({"region": name, "pass": row.pop("graph"), **row})
    return rows
