"""Where a training step's time goes, by named region (torch.profiler + record_function).

The model labels its forward regions (embeddings, sequence_block, interaction_block,
cross_block, heads); the training step labels backward and optimizer. The profiler reports
the inclusive time of each label; a region that runs once per layer is summed over layers.
On CPU the time is wall time; on CUDA it is the device time of the kernels inside the label.
"""
from __future__ import annotations

import os

from torch.profiler import ProfilerActivity, profile

REGIONS = ("embeddings", "sequence_block", "interaction_block", "cross_block", "heads", "loss",
           "backward", "optimizer")


def quiet_profile(device_type: str) -> profile:
    """A torch.profiler over CPU (and CUDA on a GPU) that does not print kineto's per-trace
    start/stop lines to stderr (KINETO_LOG_LEVEL, read when a trace starts; a user's own
    setting wins)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else []))


def time_breakdown(step_fn, device_type: str, repeats: int = 3) -> list[dict]:
    """Seconds per step spent in each region, averaged over `repeats` calls of step_fn()."""
    step_fn()  # warm-up outside the profile
    with quiet_profile(device_type) as prof:
        for _ in range(repeats):
            step_fn()
    totals = {}
    for event in prof.key_averages():
        if event.key in REGIONS:
            us = event.device_time_total if device_type == "cuda" else event.cpu_time_total
            totals[event.key] = totals.get(event.key, 0.0) + us / 1e6 / repeats
    return [{"region": r, "seconds": totals[r]} for r in REGIONS if r in totals]
