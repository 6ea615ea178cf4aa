"""Eager vs torch.compile (regional) training steps of the composed model, interleaved: the
comparison `gemref bench compile` prints and chapter 04 plots.

`region_plan` times each region kind alone (gemref/compile/plan.py plan_gemref_regions);
`compare_steps` trains an eager, a fully compiled and (given the plan) a plan-compiled model
on the same batches, alternating who goes first, and reports each variant's median step
time (seconds), its spread, its step-time ratio to eager paired per batch, MFU, compile time
and graphs, and recompiles after warm-up.
"""
from __future__ import annotations

import statistics

from ..compile import compile_stats
from ..compile.plan import RegionPlan, plan_gemref_regions
from ..train.override import override
from ..mfu.meter import percentile
from ..mfu.timing import interleaved
from ..train import build_model
from .bench import Bench, Trainer, run_mfu, strategy_model

STEP_COLUMNS = ("variant", "median_step_s", "p10_step_s", "p90_step_s", "vs_eager", "mfu", "compile_s", "graphs",
                "recompiles_after_warmup", "regions")


def region_plan(b: Bench, reps: int = 5) -> RegionPlan:
    """The region plan on the bench's first batch (gemref/compile/plan.py plan_gemref_regions)."""
    return plan_gemref_regions(strategy_model(b, "none", compiled=False), b.batches[0], reps=reps)


def compare_steps(b: Bench, planned: tuple[str, ...] | None = None) -> dict:
    """Interleaved training steps of an eager and a compiled model on the same batches
    (gemref/mfu/timing.py interleaved, alternating who goes first); with `planned` (region
    kinds), a third model compiles only those ("planned"). Every ratio is paired per batch."""
    models = {"eager": strategy_model(b, "none", compiled=False), "compiled": strategy_model(b, "none", compiled=True)}
    if planned:
        models["planned"] = build_model(b.preset, override(b.train, compile=True, ac="none", ac_budget=1.0, ac_plan="",
                                                           ac_compress="none", compile_regions=",".join(planned)),
                                        b.device)[0]
    trainers = {name: Trainer(b, model) for name, model in models.items()}
    stats = {name: compile_stats(model) for name, model in models.items() if name != "eager"}
    after_warmup: dict = {}

    def step(name: str, k: int):
        if k == b.warmup and not after_warmup:          # the first timed round: compilation is behind us
            after_warmup.update({n: (s.graphs, s.recompiles) for n, s in stats.items()})
        return trainers[name].step(b.batches[k])

    records = interleaved({name: (lambda k, name=name: step(name, k)) for name in trainers},
                          len(b.batches) - b.warmup, warmup=b.warmup, alternate=True)
    seconds = {name: [r.step_s for r in rs] for name, rs in records.items()}
    rows = []
    for name, s in seconds.items():
        row = {"variant": name, "median_step_s": statistics.median(s), "p10_step_s": percentile(s, 0.1),
               "p90_step_s": percentile(s, 0.9), "mfu": run_mfu(b, records[name]), "steps_s": s,
               "vs_eager": statistics.median(c / e for c, e in zip(s, seconds["eager"]))}
        if name in stats:
            row.update(compile_s=stats[name].compile_seconds, graphs=stats[name].graphs,
                       recompiles_after_warmup=stats[name].recompiles - after_warmup[name][1],
                       graphs_after_warmup=stats[name].graphs - after_warmup[name][0],
                       regions=",".join(stats[name].as_record()["kinds"]))
        rows.append(row)
    return {"rows": rows, "ratio": rows[1]["vs_eager"], "planned_ratio": rows[2]["vs_eager"] if planned else None,
            "compile": stats["compiled"].as_record(), "models": models}
