"""Does the scale projection predict runs it did not see? Predicted vs measured steps of CPU gloo ranks.

The projection's formula (gemref/simulate.py), fed with inputs measured on this machine:

    predicted step = compute x time-sharing x imbalance + comm (alpha-beta, nothing hidden)

* compute: the run's per-rank batches (the same global batches, split by the same
  sampler), each timed in ONE process with one thread: a 1-rank process group with the
  run's switches (thread CPU seconds, median of `compute_reps`); per step the mean over ranks.
* time-sharing: R one-thread ranks on C cores run at most C at a time: compute stretches
  by max(1, R / C) on an otherwise idle machine. The machine is shared (CI runs tests side
  by side), so the factor is measured: wall seconds per CPU second of a compute probe that
  all R ranks run at once, before, during and after the run (median).
* imbalance: max/mean model FLOPs of the step's partition (the projection's cost model).
* comm: every collective of the step (volume.py) priced with a gloo "link" per collective
  kind (gloo's algorithms differ by kind): alpha and beta fitted to a few payload sizes
  measured on loopback in the step's rhythm (a compute burst of the step's compute per
  collective, then the collective), before and after the run, on the run's R ranks. With
  more ranks than cores a message step waits for the scheduler, so the link's latency
  depends on R and on the load, as an nccl-tests calibration depends on the job's scale.
  `calibration_ranks=2` calibrates once on 2 processes instead (the plain loopback link).
  On CPUs nothing is assumed hidden: gloo's threads need the cores the compute uses.
* measured: the median step time (rank 0, after warm-up) of the run on R gloo ranks.

Not in the formula, shown next to it: the ranks' own thread CPU time per step exceeds the
one-process compute (FSDP2 skips its all-gather machinery on one rank; the sharded
tables' bookkeeping and the collective calls run on the ranks' threads).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from .balance import SampleCost, imbalance
from .config import Preset, TrainConfig, get_preset, override
from .mfu.flops import sample_cost_coefficients
from .parallel.cost_model import LinkTier, collective_time
from .parallel.launch import spawn
from .parallel.mesh import parse_mesh
from .simulate import comm_rows, predict_step, step_collectives

KINDS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
SIZES = (4 << 10, 32 << 10, 256 << 10, 1 << 20)   # payload bytes (volume.py's convention)


def _run_collective(kind: str, nbytes: int, world: int) -> None:
    n = max(world, nbytes // 4 // world * world)           # fp32 elements of the payload
    if kind == "all_gather":
        dist.all_gather_into_tensor(torch.empty(n), torch.ones(n // world))
    elif kind == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.empty(n // world), torch.ones(n))
    elif kind == "all_to_all":
        dist.all_to_all_single(torch.empty(n), torch.ones(n))
    else:
        dist.all_reduce(torch.ones(n))


def _burst(cpu_s: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Compute for `cpu_s` seconds of this thread's CPU time (small matmuls)."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < cpu_s:
        a = torch.tanh(a @ b)
    return a


def _time_collectives(world: int, sizes, reps: int, burst_s: float = 0.002, kinds=KINDS) -> dict:
    """{kind: [(payload bytes, median seconds)]}: each collective timed in a step's rhythm.

    Every rank computes a `burst_s` CPU burst, then joins the collective (timed alone),
    `reps` times. The collective's time then includes what it includes inside a step: the
    wait for peers still computing, and on a host with more ranks than cores the wait for
    the scheduler at each message step (a barrier before each call would hide both).
    """
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    out = {}
    for kind in kinds:
        out[kind] = []
        for nbytes in sizes:
            dist.barrier()
            times = []
            for _ in range(reps + 2):
                a = _burst(burst_s, a, b)
                t0 = time.perf_counter()
                _run_collective(kind, nbytes, world)
                times.append(time.perf_counter() - t0)
            n = max(world, nbytes // 4 // world * world)
            out[kind].append((4 * n, statistics.median(times[2:])))
    return out


def _calibration_rank(rank: int, world: int, sizes, reps: int, burst_s: float):
    timings = _time_collectives(world, sizes, reps, burst_s)
    return timings if rank == 0 else None


def fit_tier(kind: str, samples: list[tuple[float, float]], world: int) -> LinkTier:
    """alpha, beta of `kind` on `world` ranks from (payload bytes, seconds), least relative error, both >= 0."""
    unit_a = collective_time(kind, 0.0, world, LinkTier("unit", 1.0, 1.0, ""), "ring")     # hops
    unit_b = collective_time(kind, 1.0, world, LinkTier("unit", 0.0, 1.0, ""), "ring")     # bytes factor
    t = np.array([s for _, s in samples])
    A = np.array([[unit_a, unit_b * b] for b, _ in samples]) / t[:, None]    # rows scaled: relative error
    alpha, inv_bw = np.linalg.lstsq(A, np.ones(len(t)), rcond=None)[0]
    if alpha < 0 or inv_bw < 0:       # the non-negative optimum then sits on one column alone
        fits = [(c, np.linalg.lstsq(A[:, [c]], np.ones(len(t)), rcond=None)[0][0]) for c in (0, 1)]
        c, x = min(fits, key=lambda f: float(np.sum((A[:, [f[0]]] @ [max(f[1], 0.0)] - 1) ** 2)))
        alpha, inv_bw = (max(x, 0.0), 0.0) if c == 0 else (0.0, max(x, 0.0))
    return LinkTier(f"gloo_{kind}", float(alpha), float(1 / inv_bw) if inv_bw > 0 else float("inf"),
                    f"calibrated: {kind} on {world} gloo processes over loopback, sizes {[int(b) for b, _ in samples]}")


def calibrate_gloo(ranks: int = 2, sizes=SIZES, reps: int = 10, burst_s: float = 0.002) -> dict[str, LinkTier]:
    """{kind: LinkTier} fitted to collectives measured on `ranks` local gloo processes (one thread each)."""
    if ranks < 2:
        raise ValueError(f"calibration needs >= 2 ranks, got {ranks}")
    timings = spawn(_calibration_rank, ranks, (tuple(sizes), reps, burst_s), backend="gloo", timeout_s=120)[0]
    return {kind: fit_tier(kind, timings[kind], ranks) for kind in KINDS}


LAYOUTS = {"fsdp_2d": ("1x{R}", "row"), "fsdp": ("1x{R}", "none"), "replicated": ("{R}x1", "none")}


def validation_config(preset: Preset, ranks: int, *, steps: int, warmup: int, batch_size: int,
                      layout: str = "fsdp_2d") -> TrainConfig:
    """jagged + fast kernel + load balance on a layout: fsdp_2d (FSDP 1xR, row-sharded tables),
    fsdp (FSDP 1xR, tables in the root unit) or replicated (Rx1)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; valid: {', '.join(LAYOUTS)}")
    mesh, sparse = LAYOUTS[layout]
    return override(preset.train, steps=warmup + steps, warmup_steps=warmup, batch_size=batch_size,
                    eval_every=0, eval_batches=1, jagged=True, kernel="auto", balance="kk",
                    mesh=mesh.format(R=ranks), sparse_sharding=sparse)


def _plans(preset: Preset, train: TrainConfig, ranks: int, steps: int):
    """Every rank's sample indices for the run's first `steps` steps (what the ranks' samplers yield),
    and the history length of every training sample."""
    from .distributed import batch_sampler
    from .train import dataset_dir
    from .data.loader import EventDataset
    from .data.shards import ensure_dataset, shard_paths

    folder = dataset_dir(preset)
    ensure_dataset(preset.model, preset.data, folder)
    lengths = EventDataset(shard_paths(folder, "train"), preset.model).lengths
    sampler = batch_sampler(lengths, preset, train, 0, ranks)
    plans = []
    for parts in sampler.plan():
        plans.append(parts)
        if len(plans) == steps:
            return plans, lengths
    raise ValueError(f"the dataset holds fewer than {steps} global batches of {train.batch_size}")


def _compute_rank(rank: int, world: int, preset: Preset, train: TrainConfig, parts: list[list[int]], reps: int):
    """Seconds of one training step on each index list, in a 1-rank process group (median of reps)."""
    from .train import setup, train_step

    s = setup(preset, train, device="cpu")
    batches = [s.train_set.__getitems__(p) for p in parts]
    for batch in batches[:3]:
        train_step(s, batch, train.batch_size)
    out = []
    for batch in batches:
        times = []
        for _ in range(reps):
            t0 = time.thread_time()
            train_step(s, batch, train.batch_size)
            times.append(time.thread_time() - t0)
        out.append(statistics.median(times))
    return out


def _stretch(seconds: float = 0.15) -> float:
    """Wall time per CPU second of this rank's one thread while every rank computes (1 = a core of its own)."""
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    dist.barrier()
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < seconds:
        for _ in range(20):
            a = torch.tanh(a @ b)
    ratio = (time.perf_counter() - w0) / (time.thread_time() - c0)
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, ratio)
    return statistics.median(out)


def _measured_rank(rank: int, world: int, preset: Preset, train: TrainConfig, kinds: tuple, sizes, reps: int,
                   burst_s: float):
    """Stretch probe, link calibration, the run, and both again; rank 0 returns them."""
    from .train import run

    stretch = [_stretch()]
    before = _time_collectives(world, sizes, reps, burst_s, kinds) if kinds else None
    stretch.append(_stretch())
    record = run(preset, train, device="cpu", progress=False, measure_memory=False)
    stretch.append(_stretch())
    after = _time_collectives(world, sizes, reps, burst_s, kinds) if kinds else None
    stretch.append(_stretch())
    timings = None if before is None else {      # the link before and after the run, averaged
        kind: [(b, (s0 + s1) / 2) for (b, s0), (_, s1) in zip(before[kind], after[kind])] for kind in before}
    if rank:
        return None
    timed = record["step_log"][record["warmup_steps"]:]
    return {"step_s": [s["seconds"] for s in timed], "calibration": timings, "stretch": stretch,
            "rank_cpu_s": [r["compute_cpu_s"] for r in record["ranks"]]}


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def validate(preset: str | Preset = "tiny", ranks=(2, 4), *, steps: int = 10, warmup: int = 4, batch_size: int = 64,
             calibration_ranks: int | None = None, compute_reps: int = 3, sizes=SIZES, calibration_reps: int = 10,
             layout: str = "fsdp_2d", cores: int | None = None, log=print) -> list[dict]:
    """Predicted vs measured median step time for each rank count (one row per R).

    calibration_ranks: None calibrates gloo inside each run's launch with its R ranks; an int
    calibrates once with that many processes (2 = the plain loopback link, see module doc).
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    ranks = list(ranks)
    if any(r < 2 for r in ranks) or steps < 3 or warmup < 1:
        raise ValueError(f"need ranks >= 2, steps >= 3, warmup >= 1; got {ranks}, {steps}, {warmup}")
    cores = cores or available_cores()
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    trains = {R: validation_config(preset, R, steps=steps, warmup=warmup, batch_size=batch_size, layout=layout)
              for R in ranks}
    plans = {}
    for R in ranks:
        plans[R], lengths = _plans(preset, trains[R], R, warmup + steps)
        plans[R] = plans[R][warmup:]
    parts = [p for R in ranks for step in plans[R] for p in step]
    log(f"timing {len(parts)} per-rank batches in one process, one thread ...")
    single = override(trains[ranks[0]], mesh="1x1")
    seconds = iter(spawn(_compute_rank, 1, (preset, single, parts, compute_reps), timeout_s=600)[0])
    times = {R: [[next(seconds) for _ in step] for step in plans[R]] for R in ranks}
    rhythm = {R: _rhythm(preset, trains[R], times[R], lengths, plans[R]) for R in ranks}
    shared = calibrate_gloo(calibration_ranks, sizes, calibration_reps, rhythm[ranks[0]]) if calibration_ranks else None
    rows = []
    for R in ranks:
        log(f"running {R} gloo ranks: {warmup} warm-up + {steps} timed steps ...")
        kinds = () if shared else _kinds(preset, trains[R])
        out = spawn(_measured_rank, R, (preset, trains[R], kinds, tuple(sizes), calibration_reps, rhythm[R]),
                    timeout_s=600)[0]
        tiers = shared or {kind: fit_tier(kind, out["calibration"][kind], R) for kind in kinds}
        share = statistics.median(out["stretch"])

        per_step = [_predict_step(preset, trains[R], tiers, cost, lengths, parts, t, batch_size, share)
                    for parts, t in zip(plans[R], times[R])]
        real = {k: statistics.median(s[k] for s in per_step) for k in per_step[0]}
        meas = statistics.median(out["step_s"])
        rows.append({"ranks": R, "cores": cores, "measured_s": meas, "predicted_s": real["step_s"],
                     "error": real["step_s"] / meas - 1, "compute_1proc_s": real["compute_s"], "time_sharing": share,
                     "time_sharing_formula": max(1.0, R / cores), "imbalance": real["imbalance"],
                     "comm_s": real["comm_s"], "imbalance_time": real["imbalance_time"],
                     "calibration_ranks": calibration_ranks or R, "calibration_burst_s": rhythm[R],
                     "rank_compute_cpu_s": statistics.median(out["rank_cpu_s"]),
                     "tiers": {k: {"alpha_us": v.alpha_s * 1e6, "bandwidth_gb_s": v.bandwidth_bytes_per_s / 1e9}
                               for k, v in tiers.items()}})
    return rows


def _kinds(preset: Preset, train: TrainConfig) -> tuple[str, ...]:
    """The collective kinds one step of this configuration runs."""
    mesh = parse_mesh(train.mesh)
    rows = step_collectives(preset.model, mesh, 1, 1, True, 4, train.sparse_sharding)
    return tuple(k for k in KINDS if any(r["kind"] == k for r in rows))


def _rhythm(preset: Preset, train: TrainConfig, seconds: list[list[float]], lengths: np.ndarray,
            plan: list[list[list[int]]]) -> float:
    """CPU seconds of compute between two collectives of a step: its one-process compute / its collectives."""
    ranks = len(plan[0])
    mesh = parse_mesh(train.mesh)
    tokens = statistics.median(sum(int(lengths[p].sum()) for p in parts) / ranks for parts in plan)
    calls = sum(r["count"] for r in step_collectives(preset.model, mesh, max(1, train.batch_size // ranks),
                                                      round(tokens), True, 4, train.sparse_sharding))
    compute = statistics.median(statistics.mean(t) for t in seconds)
    return min(0.005, max(0.0002, compute / max(calls, 1)))


def _predict_step(preset: Preset, train: TrainConfig, tiers: dict, cost: SampleCost, lengths: np.ndarray,
                  parts: list[list[int]], seconds: list[float], batch: int, share: float) -> dict:
    """One step: mean single-process compute x time-sharing x FLOP imbalance + alpha-beta comm (none hidden)."""
    ranks = len(parts)
    mesh = parse_mesh(train.mesh)
    loads = [float(cost.cost(lengths[p]).sum()) for p in parts]
    tokens = sum(int(lengths[p].sum()) for p in parts) / ranks
    coll = comm_rows(step_collectives(preset.model, mesh, max(1, round(batch / ranks)), round(tokens), True, 4,
                                      train.sparse_sharding), mesh, None, kind_tiers=tiers, algorithm="ring")
    result = predict_step(statistics.mean(seconds) * share, imbalance(loads),
                          [{**c, "overlappable_s": 0.0} for c in coll])
    return {"step_s": result["step_s"], "compute_s": statistics.mean(seconds), "imbalance": imbalance(loads),
            "comm_s": result["comm_s"], "imbalance_time": max(seconds) / statistics.mean(seconds)}
