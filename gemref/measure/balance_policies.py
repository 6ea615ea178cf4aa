"""Partition policies across data-parallel ranks: projected on drawn batches, and the GEM step measured on gloo ranks.

Projected (`projected_rows`): each global batch of history lengths priced by a SampleCost and
split by every policy: gemref/measure/balance_compare.py `compare` over those batches as the steps of an
epoch (it states the columns), the columns of one step's split kept.

Measured (`measure_policies`): R one-thread gloo ranks (gemref.parallel.launch) run the real
GEM training step: every rank builds the preset's GEMRef and its optimizer as training does
(`gem_model`), and on each global batch (synthetic ids, the given lengths) takes its samples
split by round_robin and by kk in turn and runs training's step (`step.train_step`) with the
loss divided by training's `loss_divisor` of the global batch; between backward and the optimizer update the gradients
are all-reduced (`all_reduce_grads`: one flat buffer, as DDP without buckets), timed apart from the
forward+backward (`timed_step`). Per rank: compute time and wait (+comm) time in the
all-reduce; per step: step time (max over ranks), imbalance of compute wall time and of compute
CPU time, idle share. With more ranks than CPU cores, or other jobs on the machine, ranks
time-share cores and wall times stretch: then cpu_imbalance (thread CPU time, blind to
time-sharing) is the figure to read. `calibrate_gem` fits the split's SampleCost to seconds of
this machine's GEM step instead of model FLOPs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..balance import POLICIES, Calibration, CostLike, SampleCost, calibrate, check_costs, loss_divisor, nnls, \
    partition, sample_costs
from .balance_compare import compare
from ..train.presets import get_preset
from ..train.override import override
from ..data.batches import batch_with_lengths
from ..parallel.launch import cpu_ranks, launch, to_rank0
from ..step import train_step
from ..train import build_model, make_optimizer

MEASURED_POLICIES = ("round_robin", "kk")
WARMUP_STEPS = 2     # untimed steps of --measure before the timed ones


PROJECTED_COLUMNS = ("policy", "imbalance", "imbalance_worst", "idle", "samples/rank", "plan_ms", "lower_bound")


def projected_rows(batches: list[np.ndarray], cost: SampleCost, ranks: int) -> list[dict]:
    """One row per policy (every POLICIES entry) over the equal-size global batches of lengths
    `batches`: `compare`'s PROJECTED_COLUMNS (medians over the batches)."""
    return [{k: row[k] for k in PROJECTED_COLUMNS} for row in compare(np.stack(batches), cost, ranks, tuple(POLICIES))]


def gem_model(preset: str, max_len: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The preset's GEMRef (built by training's `build_model`: jagged, the best attention kernel
    here, fp32, seed 0) with max_len widened to the profile's, and training's optimizer."""
    p = get_preset(preset)
    train = override(p.train, jagged=True, kernel="auto", precision="fp32", seed=0)
    model = build_model(replace(p, model=replace(p.model, max_len=max_len)), train, torch.device("cpu"))[0]
    return model, make_optimizer(model, train)


def all_reduce_grads(model: nn.Module) -> None:
    """Sum the gradients over the ranks in one flat buffer (replicated data parallelism, as DDP
    without buckets, nothing overlapped), written back so every rank steps the same model."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    torch._foreach_copy_(grads, [g.view_as(p) for g, p in zip(flat.split([g.numel() for g in grads]), grads)])


def timed_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, normalizer: int) -> tuple[float, float, float]:
    """Training's step on this rank's `batch`, its gradient all-reduce (`all_reduce_grads`) timed
    apart from the forward+backward before it; the optimizer update after it is in neither.
    Returns (compute wall s, compute thread-CPU s, all-reduce wall s)."""
    marks: list[float] = []

    def timed_all_reduce(m: nn.Module) -> None:
        marks.extend((time.perf_counter(), time.thread_time()))
        all_reduce_grads(m)
        marks.append(time.perf_counter())

    t0, c0 = time.perf_counter(), time.thread_time()
    train_step(model, optimizer, batch, normalizer=normalizer, finish_backward=timed_all_reduce)
    t1, c1, t2 = marks
    return t1 - t0, c1 - c0, t2 - t1


def _measure_rank(rank, world, preset, max_len, lengths_per_step, cost_coeffs, policies, warmup):
    """One rank of measure_policies: per step and policy, (compute wall s, compute CPU s, all-reduce wall s, n)."""
    model, optimizer = gem_model(preset, max_len)
    cost = SampleCost(*cost_coeffs)
    out = {p: [] for p in policies}
    for step, lengths in enumerate(lengths_per_step):
        batch = batch_with_lengths(model.cfg, lengths, seed=step)
        for policy in policies:
            mine = batch.select(partition(cost.cost(lengths), world, policy, min_per_rank=1)[rank])
            dist.barrier()
            times = timed_step(model, optimizer, mine, loss_divisor(len(lengths)))
            if step >= warmup:
                out[policy].append([*times, mine.batch_size])
    return to_rank0({p: torch.tensor(v, dtype=torch.float64) for p, v in out.items()})


def measure_policies(preset: str, max_len: int, steps: list[np.ndarray], cost: SampleCost, ranks: int,
                     warmup: int = WARMUP_STEPS, timeout_s: float = 540) -> tuple[list[dict], list[dict]]:
    """The GEM step on `ranks` gloo ranks, split by each MEASURED_POLICIES entry on every global
    batch of lengths in `steps` (the first `warmup` untimed). Returns (per-rank rows: samples,
    compute_ms, compute_cpu_ms, allreduce_wait_ms; per-policy rows: step_ms, imbalance,
    cpu_imbalance, idle, speedup over round_robin), medians over the timed steps."""
    policies = list(MEASURED_POLICIES)
    results = launch(_measure_rank, (preset, max_len, steps, (cost.per_sample, cost.per_token, cost.per_token_sq),
                                     policies, warmup), cpu_ranks(ranks), timeout_s=timeout_s)
    per_rank, summary = [], []
    for policy in policies:
        per_step = torch.stack([res[policy] for res in results])    # (R, steps, 4)
        wall = per_step[:, :, 0] + per_step[:, :, 2]                  # compute + all-reduce
        for r in range(ranks):
            med = per_step[r].median(dim=0).values.tolist()
            per_rank.append({"policy": policy, "rank": r, "samples": int(med[3]), "compute_ms": med[0] * 1e3,
                             "compute_cpu_ms": med[1] * 1e3, "allreduce_wait_ms": med[2] * 1e3})
        compute, cpu = per_step[:, :, 0], per_step[:, :, 1]
        summary.append({"policy": policy, "step_ms": float(wall.max(0).values.median()) * 1e3,
                        "imbalance": float((compute.max(0).values / compute.mean(0)).median()),
                        "cpu_imbalance": float((cpu.max(0).values / cpu.mean(0)).median()),
                        "idle": float((per_step[:, :, 2].sum(0) / wall.sum(0)).median())})
    base = summary[0]["step_ms"]
    for row in summary:
        row["speedup"] = base / row["step_ms"]
    return per_rank, summary


def time_gem_steps(preset: str, max_len: int, pool: np.ndarray, n_batches: int = 16, reps: int = 2,
                   seed: int = 0, max_batch: int = 32) -> tuple[list[np.ndarray], list[float]]:
    """Time the GEM training step (`step.train_step`) on `n_batches` batches of 2..`max_batch`
    samples drawn from the lengths `pool` (varied size and length mix). Returns (each batch's
    lengths, its median step seconds over `reps` runs after one warm-up).

    Times are this thread's CPU time with one torch thread (as on every rank), so other
    processes sharing the cores do not distort them.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, optimizer = gem_model(preset, max_len)
    rng = np.random.default_rng(seed)
    lengths_list, times = [], []
    try:
        for k in range(n_batches):
            lengths = rng.choice(pool, size=int(rng.integers(2, max_batch + 1)))
            batch = batch_with_lengths(model.cfg, lengths, seed=k)
            samples = []
            for _ in range(reps + 1):   # first run is warm-up
                t0 = time.thread_time()
                train_step(model, optimizer, batch)
                samples.append(time.thread_time() - t0)
            lengths_list.append(lengths)
            times.append(statistics.median(samples[1:]))
    finally:
        torch.set_num_threads(threads)
    return lengths_list, times


def calibrate_gem(preset: str, max_len: int, pool: np.ndarray, n_batches: int = 16, reps: int = 2,
                  seed: int = 0) -> Calibration:
    """`time_gem_steps`, then a SampleCost in seconds fitted to those times (`balance.calibrate`)."""
    return calibrate(*time_gem_steps(preset, max_len, pool, n_batches, reps, seed))


def explained_by(cost: CostLike, lengths_list: Sequence, measured_times: Sequence[float]) -> float:
    """R^2 of measured step times against time = a + k x (the batch's summed `cost`), a and k >= 0
    fitted: how much of the measured times a cost in another unit (FLOPs, say) explains."""
    times = check_costs(measured_times, "measured_times")
    if len(lengths_list) != len(times) or len(times) < 3:
        raise ValueError(f"explained_by needs >= 3 batches and one time each, got {len(lengths_list)} and {len(times)}")
    A = np.array([[float(sample_costs(cost, L).sum()), 1.0] for L in lengths_list])
    fit = A @ nnls(A, times)
    total = float(np.sum((times - times.mean()) ** 2))
    return 1.0 - float(np.sum((fit - times) ** 2)) / total if total > 0 else 1.0


def calibration_record(fit: Calibration) -> dict:
    """A calibrate_gem fit as the record's `calibration` entry (seconds per sample, event, event^2, step)."""
    return {"per_sample_s": fit.cost.per_sample, "per_token_s": fit.cost.per_token,
            "per_token_sq_s": fit.cost.per_token_sq, "per_step_s": fit.per_step, "rel_rms_error": fit.rel_rms_error,
            "r2": fit.r2}
