"""Which regions to compile on this machine: each region kind measured eager against compiled.

`plan_regions(model, batch)` runs every region kind of layer 0 (and the loss) forward and
backward on the inputs the model hands it, eager and compiled afresh, interleaved, and keeps
the kinds whose compiled median beats eager's by more than PLAN_MARGIN (the waterfall's compile
rung compiles only those: gemref/waterfall/rungs.py). `call_overhead()` measures what a compiled
call costs beyond its work (guards, wrappers, the graph call): why a small region loses.
`region_inputs`, `run_region` and `eager_vs_compiled` are the pieces both use (and
gemref/compile/inspect.py and the compile bench).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..config import COMPILE_REGIONS
from ..model import ranking_loss
from .apply import REGION_KINDS, CompiledRegion, CompileStats, inductor_backend


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
    """Which region kinds to compile: those whose compiled forward+backward beat eager by more
    than `margin` on the model's own inputs; `rows` has each kind's measurement."""

    kept: tuple[str, ...]
    rows: list[dict]
    margin: float

    def regions_text(self) -> str:
        """The compile_regions switch (TrainConfig.compilation.regions) of this plan ("" when no region wins)."""
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
