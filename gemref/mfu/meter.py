"""Step timing, throughput and MFU, measured honestly.

* Warm-up steps are recorded but excluded from every statistic.
* On CUDA the clock reads happen after `torch.cuda.synchronize`, so a step's time is the
  device's time, not the launch time.
* Per-step rates (FLOP/s, tokens/s, samples/s) are computed step by step and the MEDIAN is
  reported (batches of variable-length histories do different work per step); the spread
  (10th..90th percentile of step time) is reported next to it.
* MFU = median model FLOP/s / peak FLOP/s (model FLOPs: gemref/mfu/flops.py, real lengths).
  HFU uses the executed FLOPs (padding and recompute included) instead.
* Data-loading share = time blocked waiting for the next batch / (that + step time).
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, TypedDict

import torch

from .peak import Peak, peak_flops


@contextmanager
def stopwatch(device: torch.device | str) -> Iterator[list[float]]:
    """`with stopwatch(dev) as t: ...` then t[0] is the elapsed seconds (CUDA-synchronised)."""
    cuda = torch.device(device).type == "cuda"
    out: list[float] = []
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    try:
        yield out
    finally:
        if cuda:
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - start)


@dataclass
class StepRecord:
    """One step as the meter sees it (the run record's `step_log` holds these as dicts)."""

    seconds: float            # compute time of the step (forward, backward, optimizer)
    data_seconds: float       # time blocked fetching the batch
    samples: int
    tokens: int               # real history events
    model_flops: int
    executed_flops: int


def run_peak(device: torch.device, precision: str, rank: int = 0, world: int = 1) -> Peak:
    """The peak FLOP/s a run's MFU divides by: the dense peak of its dtype (fp32 runs: fp32;
    bf16, float8 and MXFP8 runs: bf16, i.e. "bf16-equivalent", docs/design.md) times the
    ranks. Only rank 0 looks it up (on CPU that times a GEMM); the others get None."""
    dtype = "fp32" if precision == "fp32" else "bf16"
    peak = peak_flops(device, dtype) if rank == 0 else Peak(None, "reported by rank 0", dtype)
    if world > 1:
        peak = Peak(peak.flops * world if peak.flops else None, f"{peak.source}, x {world} ranks", peak.dtype)
    return peak


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank (no interpolation: a value that occurred)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class MeterSummary(TypedDict):
    """`Meter.summary()`: medians over the timed steps, base units; part of the run record."""

    steps_timed: int
    warmup_steps: int
    median_step_s: float
    p10_step_s: float
    p90_step_s: float
    samples_per_s: float
    tokens_per_s: float
    model_flops_per_step: float
    executed_flops_per_step: float
    model_tflops_per_s: float
    executed_tflops_per_s: float
    mfu: float | None              # model FLOP/s / peak FLOP/s; None without a known peak
    hfu: float | None              # executed FLOP/s / peak FLOP/s
    peak_flops: float | None
    peak_source: str
    data_share: float              # time blocked on data / (that + step time)


@dataclass
class Meter:
    peak: Peak
    warmup_steps: int = 3
    steps: list[StepRecord] = field(default_factory=list)

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)

    @property
    def timed(self) -> list[StepRecord]:
        return self.steps[self.warmup_steps:]

    def segments(self, n: int) -> list["Meter"]:
        """The timed steps cut into n consecutive windows of equal length (repeated
        measurements of one run; any remainder steps go to the last window)."""
        timed = self.timed
        if n < 1 or len(timed) < n:
            raise ValueError(f"cannot cut {len(timed)} timed steps into {n} windows")
        size = len(timed) // n
        cuts = [timed[i * size:(i + 1) * size if i < n - 1 else len(timed)] for i in range(n)]
        return [Meter(self.peak, 0, list(c)) for c in cuts]

    def summary(self) -> MeterSummary:
        """Medians over the timed steps; every field in base units (seconds, FLOP/s, bytes)."""
        timed = self.timed
        if not timed:
            raise ValueError(f"no timed steps: {len(self.steps)} step(s) ran, all warm-up "
                             f"(warmup_steps={self.warmup_steps}); run more steps")
        model_rate = statistics.median(s.model_flops / s.seconds for s in timed)
        executed_rate = statistics.median(s.executed_flops / s.seconds for s in timed)
        data, compute = sum(s.data_seconds for s in timed), sum(s.seconds for s in timed)
        mfu = model_rate / self.peak.flops if self.peak.flops else None
        hfu = executed_rate / self.peak.flops if self.peak.flops else None
        return {
            "steps_timed": len(timed),
            "warmup_steps": self.warmup_steps,
            "median_step_s": statistics.median(s.seconds for s in timed),
            "p10_step_s": percentile([s.seconds for s in timed], 0.1),
            "p90_step_s": percentile([s.seconds for s in timed], 0.9),
            "samples_per_s": statistics.median(s.samples / s.seconds for s in timed),
            "tokens_per_s": statistics.median(s.tokens / s.seconds for s in timed),
            "model_flops_per_step": statistics.median(s.model_flops for s in timed),
            "executed_flops_per_step": statistics.median(s.executed_flops for s in timed),
            "model_tflops_per_s": model_rate / 1e12,
            "executed_tflops_per_s": executed_rate / 1e12,
            "mfu": mfu,
            "hfu": hfu,
            "peak_flops": self.peak.flops,
            "peak_source": self.peak.source,
            "data_share": data / (data + compute) if data + compute > 0 else 0.0,
        }
