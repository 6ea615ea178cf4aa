"""Where a training step's time goes by op class, the profiler's own cost taken out: the one
account that the waterfall's breakdown (gemref/waterfall/runner.py) and `gemref bench
step_profile` (gemref/mfu/step_profile.py) both give.

Measure (`profile_op_classes(step, steps, device)`): `steps` pairs, each the step run
unprofiled and right after it under torch.profiler (A B A B), both on the stopwatch
(seconds, CUDA-synchronised): an `OpProfile`.

Account (`account(profile)`), on CPU: every event's self time on the step's thread goes to
its class (gemref/mfu/op_classes.py `classify_cpu`). The profiler makes a step slower, and
that cost sits in the self times of the events it records, mostly in the parents of many
small ops (autograd nodes, a block's record_function), which are "other". The mean gap
between the profiled and the unprofiled steps, spread over the event boundaries recorded
(`profiler_cost_per_boundary`), comes out of each event's self time: an estimate, as noisy
as the gap. The profiled step's time no event accounts for (Python, the autograd engine,
gaps) goes to "other" as one row (UNTRACED). On CUDA: each kernel's device time
(`classify_cuda`), which the profiler does not slow; nothing is taken out or added.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .op_classes import classify_cpu, classify_cuda, step_events
from .profile import quiet_profile
from .timing import stopwatch

UNTRACED = "(untraced: Python, autograd engine, gaps)"


@dataclass
class OpProfile:
    """Profiled training steps, each right after an unprofiled one (seconds per step)."""

    events: list                    # torch.profiler events of every profiled step
    profiled_s: list[float]         # wall seconds of each profiled step
    unprofiled_s: list[float]       # of the unprofiled step right before it
    profiled_cpu_s: list[float] = field(default_factory=list)   # process CPU seconds of each profiled step
    device_type: str = "cpu"

    @property
    def steps(self) -> int:
        return len(self.profiled_s)


@dataclass
class StepClasses:
    """One account of a profiled step: seconds per step by op class (op_classes.CLASSES)."""

    seconds: dict[str, float]       # the profiler's cost out; the untraced time in "other"
    profiled: dict[str, float]      # as recorded, the untraced time in "other": sums to profiled_step_s
    profiler_s_per_boundary: float
    profiled_step_s: float          # mean wall of the profiled steps
    unprofiled_step_s: float        # mean wall of the unprofiled steps paired with them
    gemm_shapes: dict[tuple, dict]  # {(B, M, K, N): {"calls", "seconds"}} per step (CPU)
    other_ops: dict[str, dict]      # {op: {"calls", "seconds", "profiled_seconds"}}, UNTRACED included (CPU)


def event_boundaries(events) -> int:
    """The profiler's event boundaries: every event once, and once more per direct child."""
    return sum(1 + len(e.cpu_children) for e in events)


def profiler_cost_per_boundary(boundaries: float, profiled_s: float, unprofiled_s: float) -> float:
    """Seconds the profiler adds per event boundary (an estimate): the step timed with and without
    it, cost = profiled_s - unprofiled_s, spread evenly over the boundaries it recorded (an event
    counts once for itself and once per direct child: recording a child runs inside its parent's
    self time); 0 when the profiled step was not slower."""
    cost = profiled_s - unprofiled_s
    return cost / boundaries if cost > 0 and boundaries > 0 else 0.0


def profile_op_classes(step: Callable[[], object], steps: int, device: torch.device | str) -> OpProfile:
    """Run `step()` 2 x `steps` times: unprofiled, then profiled (shapes recorded), in pairs."""
    device = torch.device(device)
    events, profiled, plain, profiled_cpu = [], [], [], []
    for _ in range(steps):
        with stopwatch(device) as t:
            step()
        plain.append(t[0])
        prof = quiet_profile(device.type)
        prof.record_shapes = True   # read when the trace starts
        with prof:
            c0 = time.process_time()
            with stopwatch(device) as t:
                step()
            profiled_cpu.append(time.process_time() - c0)
        profiled.append(t[0])
        events.extend(prof.events())
    return OpProfile(events, profiled, plain, profiled_cpu, device.type)


def account(profile: OpProfile) -> StepClasses:
    """The step's seconds by op class (module doc)."""
    steps = profile.steps
    profiled_s, plain_s = statistics.fmean(profile.profiled_s), statistics.fmean(profile.unprofiled_s)
    if profile.device_type == "cuda":
        seconds = classify_cuda(profile.events, steps)
        return StepClasses(seconds, dict(seconds), 0.0, profiled_s, plain_s, {}, {})
    per = profiler_cost_per_boundary(event_boundaries(step_events(profile.events)) / steps, profiled_s, plain_s)
    c = classify_cpu(profile.events, steps, per)
    untraced = max(0.0, profiled_s - sum(c.profiled.values()))
    for by_class in (c.profiled, c.seconds):
        by_class["other"] += untraced
    other = c.other_ops | {UNTRACED: {"calls": 0.0, "seconds": untraced, "profiled_seconds": untraced}}
    return StepClasses(c.seconds, c.profiled, per, profiled_s, plain_s, c.gemm_shapes, other)

