"""From measured windows to a waterfall row: E2E MFU = local MFU x scaling ratio, paired ratios, breakdown.

Per window, the figures are gemref/mfu/meter.py's (the one MFU definition) over the
window's steps on every rank: E2E MFU = F / (W x T x P), local MFU = F / (sum_r C_r x P),
scaling ratio = E2E / local, so E2E = local x scaling exactly, window by window (C_r: on one
rank the training steps' time, on one-thread CPU ranks the main thread's CPU time inside the
steps, on GPU ranks the profiled compute kernels' time per step). A row takes every figure from its
median window by tokens/s (so tokens/s, TFLOP/s and the three MFUs agree) and shows the
min..max tokens/s over its kept windows.

vs_previous: the median over rounds of the paired ratio tokens/s(rung i, round k) /
tokens/s(rung i-1, round k), both windows kept, with the min..max of those ratios.

Breakdown (seconds per step, averaged over ranks, from the median window): data (fetching
batches), waiting at the collective (rank r waits max_r' C_r' - C_r for the slowest rank),
queued (ready to run but without a core: the run-queue delay, ~0 in an uncontended window;
where schedstat exists), exposed communication (the rest of the step: wall - data - compute
- waiting - queued, floored at 0; on one rank only the timer's gaps), and the compute split
into GEMMs, attention, element-wise, optimizer and other by the shares of a profiled step, the
profiler's own cost out (gemref/mfu/op_profile.py: the account `gemref bench step_profile` gives).
"""
from __future__ import annotations

import math
import statistics

from ..mfu.meter import figures
from ..mfu.op_classes import COMPUTE
from .schedule import Round, Window


def window_figures(ranks: list[Window], peak_flops: float | None) -> dict:
    """The figures of one window over all ranks: gemref/mfu/meter.py `figures` of its steps
    (the one MFU definition), with the window's contention."""
    w0 = ranks[0]
    fig = figures([w.steps for w in ranks], peak_flops, device_type=w0.device_type, threads=w0.threads,
                  compute_s=[w.compute() for w in ranks])
    return {"round": w0.round, "attempt": w0.attempt, **fig,
            "cpu_per_wall": [w.cpu_per_wall for w in ranks], "core_share": [w.core_share for w in ranks],
            "contended": any(w.contended for w in ranks)}


def kept_windows(rounds: list[Round], position: int, peak_flops: float | None) -> dict[int, dict]:
    """{round index: figures} of the rung at `position` in its group: the kept attempt of each
    round, less a contended window."""
    out = {}
    for r in rounds:
        if r.kept:
            fig = window_figures([rank[position] for rank in r.windows], peak_flops)
            if not fig["contended"]:
                out[r.index] = fig
    return out


def paired_ratio(num: dict[int, dict], den: dict[int, dict], key: str = "tokens_per_s") -> dict:
    """Median and min..max of num[k][key] / den[k][key] over the rounds k both kept; None when none."""
    ratios = [num[k][key] / den[k][key] for k in sorted(set(num) & set(den)) if den[k][key]]
    if not ratios:
        return {"median": None, "min": None, "max": None, "pairs": 0}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": len(ratios)}


def median_window(kept: dict[int, dict]) -> dict | None:
    """The kept window with the median tokens/s (the upper one of an even count); None when none was kept."""
    if not kept:
        return None
    ordered = sorted(kept.values(), key=lambda f: f["tokens_per_s"])
    return ordered[len(ordered) // 2]


def breakdown(ranks: list[Window], profiled: list[dict[str, float]] | None) -> dict[str, float]:
    """Seconds per step by where they went, averaged over ranks (see the module doc).

    `profiled`: per rank, seconds per step by op class from a profiled step; only the compute
    classes' shares are used (None: the compute stays one entry, "compute_s")."""
    world = len(ranks)
    steps = len(ranks[0].steps)
    step_s = max(w.wall_s for w in ranks) / steps
    compute = [w.compute() / steps for w in ranks]
    slowest = max(compute)
    out = {"step_s": step_s, "data_s": sum(w.data_s for w in ranks) / steps / world,
           "waiting_s": sum(slowest - c for c in compute) / world}
    rest = max(0.0, step_s - sum(compute) / world - out["data_s"] - out["waiting_s"])
    if all(w.run_delay_s is not None for w in ranks):
        # Time queued for a core that the compute clock did not already include (on one rank the
        # compute is the steps' wall time, which holds any queueing inside them).
        out["queued_s"] = min(rest, sum(w.run_delay_s for w in ranks) / steps / world)
        rest -= out["queued_s"]
    out["exposed_comm_s"] = rest
    if profiled:
        for cls in COMPUTE:
            out[f"{cls}_s"] = 0.0
        for c, prof in zip(compute, profiled):
            total = sum(prof[cls] for cls in COMPUTE)
            for cls in COMPUTE:
                out[f"{cls}_s"] += c * (prof[cls] / total if total > 0 else 1 / len(COMPUTE)) / world
    else:
        out["compute_s"] = sum(compute) / world
    return out


def chain(ratios: list[float | None]) -> float | None:
    """The product of consecutive ratios (None if any is None): vs_baseline under sliding pairs."""
    return None if any(r is None for r in ratios) else math.prod(ratios)
