"""AutoAC against the alternatives at every activation-memory budget: bytes, recompute, step time, MFU.

For each budget (a fraction of the activation bytes of a step with nothing checkpointed),
four strategies side by side on the bench's batches (gemref/measure/bench.py):
  none  nothing checkpointed: the reference (the same row at every budget)
  full  every block fully checkpointed: the classic recipe (the same row at every budget)
  auto  AutoAC: the plan of least measured recompute time that fits the budget
        (gemref/autoac/plan.py, objective "time")
  memory_budget  torch.compile with torch._functorch.config.activation_memory_budget = the budget
Activation bytes are measured on the first batch (gemref/autoac/profile.py; compiled and
checkpointed on CPU: on the eager twin), recompute FLOPs are backward FLOPs minus the eager
no-AC backward's, step seconds the median of timed steps paired with the no-AC model's.

`head_to_head` answers the question the solver's objective is about: at one budget (50%),
AutoAC by time, AutoAC by FLOPs and full checkpointing, their steps interleaved round by round
on the same batches (gemref/mfu/timing.py interleaved, alternating order), median seconds and
the median per-round ratio to full checkpointing. A plan that checkpoints every block fully
is full checkpointing, and says so.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from .batch_search import gemref_forward_with_bytes, gemref_profile, is_full_checkpointing
from ..autoac.profile import backward_flops
from ..autoac.plan import solve
from ..mfu.flops import executed_flops, model_flops
from ..mfu.timing import interleaved
from ..step import forward_loss
from .bench import Bench, Trainer, paired_steps, run_mfu, strategy_model

DEFAULT_BUDGETS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
SWEEP_COLUMNS = ("budget", "strategy", "act_mb", "act_pct", "fits", "recompute_pct", "step_s", "vs_none",
                 "mfu", "hfu", "plan")
HEAD_COLUMNS = ("strategy", "plan", "predicted_mb", "recompute_pct", "predicted_recompute_ms", "step_s", "vs_full")


def measure(b: Bench, model, reference: Trainer, *, bytes_model=None, base_backward: int = 0) -> dict:
    """Activation bytes and backward FLOPs on the first batch, then the timed steps, each
    paired with a step of `reference` (vs_reference: the median ratio)."""
    batch = b.batches[0]
    loss, nbytes = gemref_forward_with_bytes(bytes_model or model, batch, b.autocast)
    del loss
    bwd = backward_flops(forward_loss(model, batch, b.autocast), model)
    timed, ref_timed = paired_steps(b, Trainer(b, model), b.batches, reference)
    seconds, ref_seconds = [r.step_s for r in timed], [r.step_s for r in ref_timed]
    cfg, model_f = b.preset.model, model_flops(b.preset.model, batch.lengths).total
    recompute = bwd - base_backward if base_backward else 0
    step_mfu = run_mfu(b, timed)
    executed = executed_flops(cfg, batch.lengths, jagged=True, kernel=b.s.kernel).total + recompute
    return {"act_bytes": nbytes, "backward_flops": bwd, "recompute_flops": recompute,
            "recompute_pct": 100 * recompute / model_f, "step_s": statistics.median(seconds), "steps_s": seconds,
            "vs_reference": statistics.median(t / r for t, r in zip(seconds, ref_seconds)),
            "mfu": step_mfu, "hfu": step_mfu * executed / model_f if step_mfu is not None else None}


def budget_sweep(b: Bench, budgets=DEFAULT_BUDGETS, *, memory_budget: bool = True, log=print) -> dict:
    """Every strategy at every budget; returns {"profile", "rows", "done_when", "head_to_head"}."""
    for f in budgets:
        if not 0.0 < f <= 1.0:
            raise ValueError(f"budgets are fractions in (0, 1], got {f}")
    eager_twin = b.device.type == "cpu" and b.train.compilation.enabled   # CPU can't see compiled + checkpointed bytes
    log("profiling every block (eager) ...")
    eager = strategy_model(b, "none", compiled=False)
    profile = gemref_profile(eager, b.batches[0], autocast_dtype=b.autocast,
                             options=("full",) if b.train.compilation.enabled else ("save_matmuls", "full"))
    base = profile.base_bytes
    reference_backward = backward_flops(forward_loss(eager, b.batches[0], b.autocast), eager)
    reference = Trainer(b, strategy_model(b, "none"))     # every strategy's steps pair with its steps

    def run(label, strategy, plan=None, budget=1.0):
        log(f"timing {label} ...")
        if strategy == "memory_budget":
            # Each budget is a new inductor backend, so a new graph for every region; dynamo
            # keeps at most recompile_limit (8) per function, then runs it eagerly. Start clean.
            torch._dynamo.reset()
        twin = strategy_model(b, strategy, plan, compiled=False) if eager_twin and strategy in ("full", "auto") \
            else None
        return measure(b, strategy_model(b, strategy, plan, budget=budget), reference, bytes_model=twin,
                       base_backward=reference_backward)

    none, full = run("none", "none"), run("full", "full")
    plans, auto_runs, rows = {}, {}, []
    for f in budgets:
        try:
            plans[f] = solve(profile, int(f * base))
        except ValueError:
            plans[f] = None
    for plan in {p.summary(): p for p in plans.values() if p is not None}.values():
        auto_runs[plan.summary()] = run(f"auto {plan.summary()}", "auto", plan)
    for f in budgets:
        target = f * base
        entries = [("none", none, ""), ("full", full, "every block")]
        if plans[f] is None:
            entries.append(("auto", None, f"impossible: min {100 * profile.min_bytes / base:.0f}%"))
        else:
            entries.append(("auto", {**auto_runs[plans[f].summary()], "predicted_bytes": plans[f].predicted_bytes},
                            _label(plans[f])))
        if memory_budget:
            entries.append(("memory_budget", run(f"memory_budget {f}", "memory_budget", budget=f),
                            f"activation_memory_budget={f}"))
        for strategy, m, note in entries:
            row = {"budget": f, "strategy": strategy, "plan": note}
            if m is not None:
                row.update(act_mb=m["act_bytes"] / 2**20, act_pct=100 * m["act_bytes"] / base,
                           fits=m["act_bytes"] <= target, recompute_pct=m["recompute_pct"], step_s=m["step_s"],
                           vs_none=m["vs_reference"], mfu=m["mfu"], hfu=m["hfu"],
                           act_bytes=m["act_bytes"], recompute_flops=m["recompute_flops"], steps_s=m["steps_s"],
                           predicted_bytes=m.get("predicted_bytes"))
            rows.append(row)
    half = plans.get(0.5)
    done = None
    if half is not None:
        # measured: the time plan's recompute; predicted (the profile's FLOPs): the FLOPs plan's, and
        # the time plan's recompute seconds against full checkpointing's (a feasible plan, so never less)
        auto_pct, full_pct = auto_runs[half.summary()]["recompute_pct"], full["recompute_pct"]
        by_flops = solve(profile, int(0.5 * base), "flops")
        full_flops = sum(x.recompute_flops["full"] for x in profile.blocks)
        full_seconds = sum(x.recompute_seconds["full"] for x in profile.blocks)
        done = {"budget": 0.5, "auto_recompute_pct": auto_pct, "full_recompute_pct": full_pct,
                "auto_over_full": auto_pct / full_pct if full_pct else None,
                "flops_plan": by_flops.summary(),
                "flops_plan_over_full": by_flops.recompute_flops / full_flops if full_flops else None,
                "time_plan_seconds_over_full": half.recompute_seconds / full_seconds if full_seconds else None,
                "met": by_flops.recompute_flops <= 0.5 * full_flops}
    model_f = model_flops(b.preset.model, b.batches[0].lengths).total
    return {"profile": {"base_bytes": base, "min_bytes": profile.min_bytes, "method": profile.method,
                        "model_flops": model_f, "step_flops": profile.step_flops,
                        "blocks": [asdict(x) for x in profile.blocks]},
            "rows": rows, "done_when": done, "head_to_head": head_to_head(b, profile, 0.5, log=log)}


def _label(plan) -> str:
    return f"{plan.summary()} (= full checkpointing)" if is_full_checkpointing(plan) else plan.summary()


def head_to_head(b: Bench, profile, budget: float = 0.5, log=print) -> dict | None:
    """AutoAC by time and by FLOPs against full checkpointing at one budget, interleaved (module doc)."""
    try:
        plans = {f"auto ({o})": solve(profile, int(budget * profile.base_bytes), o) for o in ("time", "flops")}
    except ValueError as e:          # the budget is below what any plan reaches
        return {"budget": budget, "impossible": str(e)}
    trainers = {name: Trainer(b, strategy_model(b, "auto", plan)) for name, plan in plans.items()}
    trainers["full"] = Trainer(b, strategy_model(b, "full"))
    log(f"timing AutoAC (time), AutoAC (FLOPs) and full checkpointing at a {budget:.0%} budget, interleaved ...")
    steps = interleaved({name: (lambda k, t=t: t.step(b.batches[k])) for name, t in trainers.items()},
                        len(b.batches) - b.warmup, warmup=b.warmup, alternate=True)
    seconds = {name: [r.step_s for r in records] for name, records in steps.items()}
    model_f = model_flops(b.preset.model, b.batches[0].lengths).total
    rows = []
    for name in trainers:
        plan = plans.get(name)
        rows.append({"strategy": name, "plan": _label(plan) if plan else "every block",
                     "predicted_mb": plan.predicted_bytes / 2**20 if plan else None,
                     "recompute_pct": 100 * (plan.recompute_flops if plan else sum(
                         x.recompute_flops["full"] for x in profile.blocks)) / model_f,
                     "predicted_recompute_ms": 1e3 * (plan.recompute_seconds if plan else sum(
                         x.recompute_seconds["full"] for x in profile.blocks)),
                     "step_s": statistics.median(seconds[name]),
                     "vs_full": statistics.median(a / f for a, f in zip(seconds[name], seconds["full"]))})
    return {"budget": budget, "rounds": len(b.batches) - b.warmup, "rows": rows}
