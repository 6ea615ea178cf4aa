"""What a memory budget buys in batch size: without and with AutoAC, and with compressed saved activations.

`batch_gain`: the largest batch that fits one memory budget without and with AutoAC
(gemref/measure/batch_search.py `find_batch_size`; CPU: activation bytes, CUDA: peak device
memory), then both timed side by side (gemref/measure/bench.py paired_steps): what the freed
memory bought in samples/s and MFU. `batch_search`: the same search with every block's saved
activations compressed. Batches are the first n samples of one fixed order of the bench's
data (`first_samples`), so memory grows with n.
"""
from __future__ import annotations

import statistics
from typing import Callable

import numpy as np

from ..activation_compression import CompressionSpec, compressing
from ..data.jagged import JaggedBatch
from ..mfu.flops import step_flops
from ..mfu.meter import mfu
from .batch_search import find_batch_size, gemref_forward_with_bytes, is_full_checkpointing, step_bytes
from .bench import Bench, Trainer, paired_steps, run_mfu, strategy_model, timed_batches

GAIN_COLUMNS = ("strategy", "batch_size", "memory_mb", "recompute_pct", "step_s", "samples_per_s", "mfu", "hfu",
                "plan")


def first_samples(b: Bench) -> Callable[[int], JaggedBatch]:
    """batch_of(n): the first n samples of one fixed order (the bench's seed) of its data, on its device."""
    order = np.random.default_rng(b.train.seed).permutation(len(b.dataset))

    def batch_of(n: int) -> JaggedBatch:
        return b.dataset.__getitems__(order[:n].tolist()).to(b.device)
    return batch_of


def batch_gain(b: Bench, memory_budget: int | None = None, max_batch: int | None = None, log=print) -> dict:
    """Largest batch without and with AutoAC under one memory budget, then both timed."""
    batch_of = first_samples(b)
    eager = strategy_model(b, "none", compiled=False)
    if memory_budget is None:
        memory_budget = step_bytes(eager, batch_of(b.train.batch_size), b.autocast)
    log(f"searching batch sizes under {memory_budget / 2**20:.1f} MiB ...")
    found = find_batch_size(eager, batch_of, memory_budget, autocast_dtype=b.autocast,
                            max_batch=min(len(b.dataset), max_batch or 16 * b.train.batch_size),
                            options=("full",) if b.train.compilation.enabled else ("save_matmuls", "full"))
    log(f"timing batch {found.no_ac_batch} without AC against batch {found.autoac_batch} with AutoAC ...")
    cfg, count = b.preset.model, len(b.batches)
    batches = {"none": timed_batches(b, found.no_ac_batch, count), "auto": timed_batches(b, found.autoac_batch, count)}
    auto_r, none_r = paired_steps(b, Trainer(b, strategy_model(b, "auto", found.plan)), batches["auto"],
                                  Trainer(b, strategy_model(b, "none")), batches["none"])
    auto_s, none_s = [r.step_s for r in auto_r], [r.step_s for r in none_r]
    rows = []
    for strategy, plan, used, timed in (("none", None, found.no_ac_bytes, none_r),
                                        ("auto", found.plan, found.autoac_bytes, auto_r)):
        first, n = batches[strategy][0], batches[strategy][0].batch_size
        seconds = [r.step_s for r in timed]
        flops = step_flops(cfg, first.lengths, jagged=True, kernel=b.s.kernel, ac_choices=plan.choices if plan else {})
        rows.append({"strategy": strategy, "batch_size": n, "memory_mb": used / 2**20,
                     "recompute_pct": 100 * flops.recompute / flops.model, "step_s": statistics.median(seconds),
                     "samples_per_s": statistics.median(n / s for s in seconds), "mfu": run_mfu(b, timed),
                     "hfu": mfu(sum(r.executed_flops for r in timed), sum(seconds), b.peak),
                     "plan": plan_label(plan)})
    rows[1]["strategy"] = "full" if is_full_checkpointing(found.plan) else "auto"   # credit the plan that ran
    none, auto = rows
    return {"memory_budget_bytes": memory_budget, "measure": found.measure, "rows": rows,
            "search_cap": found.max_batch, "capped": found.capped,
            "full_checkpointing": is_full_checkpointing(found.plan),
            "batch_ratio": auto["batch_size"] / max(none["batch_size"], 1),
            "samples_per_s_ratio": statistics.median((auto["batch_size"] / a) / (none["batch_size"] / n)
                                                     for a, n in zip(auto_s, none_s)),
            "mfu_gain": (auto["mfu"] - none["mfu"]) if none["mfu"] is not None else None}


def batch_search(b: Bench, spec: CompressionSpec, max_batch: int) -> dict:
    """The largest batch whose activations fit the no-AC bytes of the bench's batch size,
    without and with every block's saved activations compressed (the whole forward under
    `activation_compression.compressing`, attention's saved tensors included: right for the pointwise
    attention of every preset), each without AC and fully checkpointed, and AutoAC's plan."""
    batch_of = first_samples(b)
    plain = strategy_model(b, "none", compiled=False)
    _, budget = gemref_forward_with_bytes(plain, batch_of(b.train.batch_size), b.autocast)
    found = {"none": find_batch_size(plain, batch_of, budget, max_batch=max_batch, autocast_dtype=b.autocast)}
    model = strategy_model(b, "none", compiled=False)
    with compressing(model, spec):
        found[spec.format] = find_batch_size(model, batch_of, budget, max_batch=max_batch, autocast_dtype=b.autocast)
    return {"budget_bytes": budget, "max_batch": max_batch,
            "rows": [{"compression": k, "no_ac_batch": v.no_ac_batch, "full_ac_batch": v.autoac_batch,
                      "no_ac_batch_capped": v.no_ac_batch >= v.max_batch, "full_ac_batch_capped": v.capped,
                      "autoac_plan": plan_label(v.plan)} for k, v in found.items()]}


def plan_label(plan) -> str:
    """The plan's summary; one that checkpoints every block fully says it is full checkpointing."""
    if plan is None:
        return ""
    return f"{plan.summary()} (= full checkpointing)" if is_full_checkpointing(plan) else plan.summary()
