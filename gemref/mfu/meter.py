"""MFU, defined once: model FLOPs over the device-seconds a job held, times one device's peak.

Over any set of timed steps (a run's, after its warm-up, or a waterfall window's), with W
ranks, P one device's dense peak FLOP/s for the run's dtype (gemref/mfu/peak.py), F the
model FLOPs of those steps summed over ranks (gemref/mfu/flops.py: the real lengths), T the
job's wall clock (the slowest rank's sum of step walls, data waits included) and C_r rank r's
compute seconds (gemref/mfu/timing.py `compute_seconds`):

    E2E MFU        = F / (W x T x P)          what the job got out of its W devices
    local MFU      = F / (sum_r C_r x P)      the ranks' compute-only rate
    scaling ratio  = E2E / local = sum_r C_r / (W x T)
                                              what survives waiting, communication, data

so E2E = local x scaling exactly (GEM's own definition). HFU is the same with executed FLOPs
(padding and recompute included). This is torchtitan's and GEM's end-to-end MFU: total model
FLOPs over total time, never a median of per-step rates. `mfu()` is the formula; `figures()`
applies it to per-rank step records; `summary()` is a run's (the training loop's, gemref/train/loop.py) and
gemref/waterfall/stats.py's window figures are `figures()` of a window's records.
"""
from __future__ import annotations

import statistics
from typing import TypedDict

import torch

from .peak import Peak, peak_flops
from .timing import StepRecord, compute_seconds


def mfu(flops: float, device_seconds: float, peak: float | None) -> float | None:
    """THE definition: `flops` / (`device_seconds` x `peak`), None without a known peak (or time)."""
    if not peak or device_seconds <= 0:
        return None
    return flops / (device_seconds * peak)


def seconds_at(flops: float, mfu_value: float, peak: float) -> float:
    """The definition solved for time: seconds `flops` take at MFU `mfu_value` of `peak` (the
    scale projection's compute time from an assumed local MFU)."""
    if not 0 < mfu_value <= 1 or not peak or peak <= 0:
        raise ValueError(f"need 0 < mfu <= 1 and a positive peak, got mfu={mfu_value}, peak={peak}")
    return flops / (peak * mfu_value)


def gemm_dtype(precision: str, device_type: str, emulated: bool = False) -> str:
    """The dtype a run's GEMMs ran in, whose peak its MFU divides by (the PaLM / Megatron /
    torchtitan convention: model FLOPs over the peak of the compute dtype): fp32 runs fp32, bf16
    autocast bf16; float8/MXFP8 count against the bf16 peak ("bf16-equivalent", docs/design.md),
    except when emulated on a CPU, where their GEMMs run in fp32 (no autocast there)."""
    if precision in ("fp32", "bf16"):
        return precision
    return "fp32" if emulated and device_type == "cpu" else "bf16"


def run_peak(device: torch.device, precision: str, rank: int = 0, emulated: bool = False) -> Peak:
    """One device's peak FLOP/s a run's MFU divides by: the dense peak of its GEMMs' dtype
    (`gemm_dtype`). Only rank 0 looks it up (on CPU that times GEMMs); the others get None."""
    dtype = gemm_dtype(precision, device.type, emulated)
    return peak_flops(device, dtype) if rank == 0 else Peak(None, "reported by rank 0", dtype)


class Figures(TypedDict):
    """`figures()`: throughput and utilisation of a set of steps on every rank (base units)."""

    wall_s: float                  # T: the slowest rank's sum of step walls
    samples_per_s: float
    tokens_per_s: float
    model_tflops_per_s: float
    executed_tflops_per_s: float
    mfu: float | None              # E2E MFU
    local_mfu: float | None
    scaling_ratio: float | None
    hfu: float | None
    data_share: float              # time blocked on data / the ranks' summed wall time


def figures(ranks: list[list[StepRecord]], peak: float | None, *, device_type: str = "cpu", threads: int = 1,
            compute_s: list[float | None] | None = None) -> Figures:
    """The module doc's figures of `ranks[r]` = rank r's steps. `compute_s[r]` overrides rank
    r's compute seconds (GPU ranks: from a profiled step); otherwise `compute_seconds`."""
    world = len(ranks)
    if world == 0 or not all(ranks):
        raise ValueError("figures need at least one step on every rank")
    wall = max(sum(s.wall_s for s in steps) for steps in ranks)
    if wall <= 0:
        raise ValueError(f"the steps' wall time must be > 0, got {wall}")
    flops = sum(s.model_flops for steps in ranks for s in steps)
    executed = sum(s.executed_flops for steps in ranks for s in steps)
    compute = list(compute_s) if compute_s is not None else [None] * world
    for r, steps in enumerate(ranks):
        if compute[r] is None:
            parts = [compute_seconds(s, world, device_type, threads) for s in steps]
            compute[r] = None if any(p is None for p in parts) else sum(parts)
    have_compute = all(c is not None and c > 0 for c in compute)
    e2e = mfu(flops, world * wall, peak)
    local = mfu(flops, sum(compute), peak) if have_compute else None
    data = sum(s.data_s for steps in ranks for s in steps)
    return {"wall_s": wall,
            "samples_per_s": sum(s.samples for steps in ranks for s in steps) / wall,
            "tokens_per_s": sum(s.tokens for steps in ranks for s in steps) / wall,
            "model_tflops_per_s": flops / wall / 1e12, "executed_tflops_per_s": executed / wall / 1e12,
            "mfu": e2e, "local_mfu": local,
            "scaling_ratio": sum(compute) / (world * wall) if have_compute else None,
            "hfu": mfu(executed, world * wall, peak),
            "data_share": data / sum(s.wall_s for steps in ranks for s in steps)}


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank (no interpolation: a value that occurred)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class MeterSummary(Figures):
    """`summary()`: a run's timed steps (warm-up excluded); part of the run record."""

    steps_timed: int
    warmup_steps: int
    ranks: int
    median_step_s: float           # the job's step: the slowest rank's wall per step
    p10_step_s: float
    p90_step_s: float
    model_flops_per_step: float    # summed over ranks, median over steps
    executed_flops_per_step: float
    peak_flops: float | None       # ONE device's peak; the MFUs divide by it x ranks
    peak_source: str


def summary(ranks: list[list[StepRecord]], peak: Peak, warmup_steps: int, *, device_type: str = "cpu",
            threads: int = 1) -> MeterSummary:
    """The run's figures over its timed steps `ranks[r][warmup_steps:]`, and its step-time spread."""
    timed = [steps[warmup_steps:] for steps in ranks]
    if not all(timed):
        raise ValueError(f"no timed steps: {len(ranks[0]) if ranks else 0} step(s) ran, all warm-up "
                         f"(warmup_steps={warmup_steps}); run more steps")
    job_steps = [max(r[i].wall_s for r in timed) for i in range(len(timed[0]))]
    per_step = list(zip(*timed))
    return {**figures(timed, peak.flops, device_type=device_type, threads=threads),
            "steps_timed": len(job_steps), "warmup_steps": warmup_steps, "ranks": len(ranks),
            "median_step_s": statistics.median(job_steps), "p10_step_s": percentile(job_steps, 0.1),
            "p90_step_s": percentile(job_steps, 0.9),
            "model_flops_per_step": statistics.median(sum(s.model_flops for s in step) for step in per_step),
            "executed_flops_per_step": statistics.median(sum(s.executed_flops for s in step) for step in per_step),
            "peak_flops": peak.flops, "peak_source": peak.source}
