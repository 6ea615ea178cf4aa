"""Which regions to compile on this machine: each region measured eager against compiled.

`plan_regions(model, names, step_fn)` runs each named region of any model (module names,
methods, patterns: gemref/compile/regions.py) forward and backward on the inputs `step_fn()`
hands it, eager and compiled afresh, interleaved, and keeps the regions whose compiled median
beats eager's by more than PLAN_MARGIN. `plan_gemref_regions(model, batch)` is GEMRef's: layer
0's region of each kind and the loss, reported by kind (the waterfall's compile rung compiles
only the kinds kept: gemref/waterfall/rungs.py). `call_overhead()` measures what a compiled
call costs beyond its work (guards, wrappers, the graph call): why a small region loses.
`region_inputs`, `run_region` and `eager_vs_compiled` are the pieces both use (and
gemref/compile/inspect.py and the compile bench).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .config import COMPILE_REGIONS
from ..model.gem import ranking_loss
from .apply import CompiledRegion, CompileStats, inductor_backend
from .regions import gemref_regions, resolve_regions


def region_inputs(model: nn.Module, regions: Sequence[str], forward: Callable[[], Any]) -> dict[str, tuple]:
    """The arguments each named region (gemref/compile/regions.py) gets the first time `forward()`
    calls it, under no_grad (detached; floating-point ones require grad so a region can be run
    forward+backward; keyword arguments are refused). A region `forward()` never calls is a ValueError."""
    resolved = resolve_regions(model, regions)
    inputs: dict[str, tuple] = {}
    before = [(r, r.attr in r.owner.__dict__, r.owner.__dict__.get(r.attr)) for r in resolved]
    for r in resolved:
        def spy(*args, _name=r.name, _fn=getattr(r.owner, r.attr), **kwargs):
            if kwargs:
                raise ValueError(f"region {_name!r} was called with keyword arguments {sorted(kwargs)}; "
                                 "a region is timed on positional arguments only")
            inputs.setdefault(_name, tuple(a.detach().requires_grad_(a.is_floating_point())
                                           if isinstance(a, Tensor) else a for a in args))
            return _fn(*args)
        r.owner.__dict__[r.attr] = spy
    try:
        with torch.no_grad():
            forward()
    finally:
        for r, had, value in before:      # the instance attribute it had (a wrapper), else none
            if had:
                r.owner.__dict__[r.attr] = value
            else:
                del r.owner.__dict__[r.attr]
    if missing := [r.name for r in resolved if r.name not in inputs]:
        raise ValueError(f"region(s) {missing} were not called by the step function: nothing to measure them on")
    return inputs


def run_region(fn: Callable, args: tuple) -> None:
    """Forward and backward of one region (the sum of its floating-point outputs as the loss)."""
    outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum(o.float().sum() for o in outs if isinstance(o, Tensor) and o.is_floating_point()).backward()


def eager_vs_compiled(eager: Callable, compiled: Callable, args: tuple, reps: int,
                      warmup: int = 1) -> tuple[float, float]:
    """Median seconds of one forward+backward call (`run_region`) of `eager` and of `compiled` on
    `args`, interleaved and alternating who goes first (gemref/mfu/timing.interleaved), after
    `warmup` untimed rounds, so a change in the machine's load hits both."""
    import statistics

    from ..mfu.timing import interleaved, stopwatch

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
    """Which regions to compile: those whose compiled forward+backward beat eager by more than
    `margin` on the model's own inputs; `rows` has each region's measurement."""

    kept: tuple[str, ...]
    rows: list[dict]
    margin: float

    def regions_text(self) -> str:
        """The kept regions comma-separated; for GEMRef's plan (`plan_gemref_regions`) the
        compile_regions switch (TrainConfig.compilation.regions), "" when no region wins."""
        return ",".join(self.kept)


def _measure(name: str, fn: Callable, args: tuple, owner: nn.Module | None, reps: int, margin: float) -> dict:
    """One row of a plan: `fn` compiled afresh with its own backend (no graph shared with a later
    compile_model), dim 0 dynamic, then eager vs compiled forward+backward, interleaved."""
    region = CompiledRegion(name, fn, CompileStats(), owner, backend=inductor_backend.__wrapped__(None))
    start = time.perf_counter()
    run_region(region, args)                          # compiles (forward and backward)
    compile_s = time.perf_counter() - start
    eager, compiled = eager_vs_compiled(fn, region, args, reps)
    return {"region": name, "eager_ms": 1e3 * eager, "compiled_ms": 1e3 * compiled, "speedup": eager / compiled,
            "compile_s": compile_s, "kept": compiled < (1 - margin) * eager}


def plan_regions(model: nn.Module, names: Sequence[str], step_fn: Callable[[], Any], *, reps: int = PLAN_REPS,
                 margin: float = PLAN_MARGIN,
                 extra: Mapping[str, tuple[Callable, Callable[[], tuple]]] | None = None) -> RegionPlan:
    """Measure each named region of any model (gemref/compile/regions.py: module names, methods,
    patterns), eager against compiled, forward+backward on the inputs `step_fn()` (one forward of
    the model, e.g. `lambda: my_loss(model, batch)`, run once under no_grad) hands it; keep the
    regions whose median compiled time is below (1 - margin) x eager's. `extra`: more regions that
    are not attributes of the model, {name: (function, args_fn)}, `args_fn()` giving its
    arguments once `step_fn()` has run (e.g. a loss on the logits the forward produced).

    `model` is left unchanged (its gradients cleared). Rows: region, eager_ms, compiled_ms
    (medians, milliseconds), speedup (eager/compiled), compile_s (seconds), kept.
    """
    if reps < 1 or not 0.0 <= margin < 1.0:
        raise ValueError(f"need reps >= 1 and margin in [0, 1), got {reps}, {margin}")
    inputs = region_inputs(model, names, step_fn)
    rows = [_measure(r.name, getattr(r.owner, r.attr), inputs[r.name], r.owner, reps, margin)
            for r in resolve_regions(model, names)]
    rows += [_measure(name, fn, args_fn(), model, reps, margin) for name, (fn, args_fn) in (extra or {}).items()]
    model.zero_grad(set_to_none=True)                    # the timing runs left gradients on the weights
    return RegionPlan(tuple(r["region"] for r in rows if r["kept"]), rows, margin)


def plan_gemref_regions(model: nn.Module, batch: Any, *, reps: int = PLAN_REPS,
                        margin: float = PLAN_MARGIN) -> RegionPlan:
    """GEMRef's plan: `plan_regions` on layer 0's region of each kind (gemref_regions) and the
    loss, reported by kind (COMPILE_REGIONS order), so that `kept` is a compile_regions value
    (the waterfall's compile rung compiles only those: gemref/waterfall/rungs.py)."""
    logits: list[Tensor] = []
    kinds = [k for k in COMPILE_REGIONS if k != "loss"]
    names = gemref_regions(model, kinds, layers=[0])
    plan = plan_regions(model, names, lambda: logits.append(model(batch)), reps=reps, margin=margin,
                        extra={"loss": (ranking_loss, lambda: (logits[0].detach().float().requires_grad_(True),
                                                               batch.labels))})
    by_name = dict(zip(names, kinds), loss="loss")
    rows = [{**r, "region": by_name[r["region"]]} for r in plan.rows]
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
