"""Does the scale projection predict runs it did not see? Predicted vs measured steps of CPU gloo ranks.

The projection's step-time model (gemref/simulate/step_model.py), fed with inputs measured on this machine:

    predicted step = (compute + host work) x time-sharing x imbalance + comm (alpha-beta, none hidden)

* compute: the run's per-rank batches (the same global batches, split by the same sampler),
  each timed in ONE process with one thread: a 1-rank process group with the run's switches;
  thread CPU seconds, median of `compute_reps` passes over all batches.
* host work: what a rank's thread does per step beyond that one-process step (FSDP2 skips
  its all-gather machinery on one rank; the sharded tables' bookkeeping and the collective
  calls run on the ranks' threads): the ranks' thread CPU seconds minus the one-process
  seconds of the same batches, over the late warm-up steps (never the timed ones).
* CPU speed: compute and host work are kept in units of a fixed probe computation, timed
  next to them, and converted back with the probe timed next to each step of the run, so a
  busy neighbour (CI runs tests side by side) slows prediction and measurement alike.
* time-sharing: R one-thread ranks on C cores run at most C at a time: max(1, R / C) on an
  otherwise idle machine. It is measured: wall per CPU second of the probe that all ranks
  run at once before and after each step (`time_sharing_formula` shows R / C beside it).
* imbalance: max/mean of the one-process seconds of the step's parts (the ranks wait for
  the slowest); the model-FLOP imbalance the projection uses is reported beside it.
* comm: every collective of the step (volume.py, the all-to-alls per table lookup as gemref's
  own sharded tables issue them: not fused) priced with a gloo "link" per collective kind
  (gloo's algorithms differ by kind; priced as GLOO_ALGORITHMS, a ring, and one peer after
  another for the all-to-all): alpha and beta fitted to four payload sizes,
  each collective timed once after every step of the run on its R ranks (medians), so the
  link is sampled under the load the steps see: with more ranks than cores each message
  step waits for the scheduler, so the latency depends on R and on the load, as an
  nccl-tests calibration depends on the job's scale. `calibration_ranks=2` calibrates once
  on 2 idle processes instead (the plain loopback link; it underestimates 4 ranks on 2
  cores). Nothing is assumed hidden: on CPUs gloo's threads need the cores of the compute.
* measured: the median wall time of train_step (as the training loop times it) over the timed steps.

Reported beside the error: the error without the host work, the model-FLOP imbalance, and
the CPU seconds per step of the ranks' other threads (gloo's), which the formula does not
charge beyond the collectives' own times. Measured on the 2-core CI machine next to other
jobs, the prediction ran 2-24% below the measurement at 2 ranks (sync points wait for the
peer's per-layer work, which the step-level imbalance misses) and within about +-12% at 4.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from ..balance import SampleCost
from ..train.presets import Preset, get_preset
from ..train.config import TrainConfig
from ..train.override import override
from ..mfu.flops import sample_cost_coefficients
from .collectives import LinkTier, collective_time
from ..measure.balance_compare import imbalance
from ..parallel.launch import cpu_ranks, launch
from .step_model import comm_rows, exposed_only, predict_step, step_collectives

KINDS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
GLOO_ALGORITHMS = {"all_gather": "ring", "reduce_scatter": "ring", "all_to_all": "pairwise", "all_reduce": "ring"}
SIZES = (4 << 10, 32 << 10, 256 << 10, 1 << 20)   # payload bytes (volume.py's convention)
# CPU seconds of compute before each calibration collective: long enough for gloo's threads to
# fall asleep (a collective that follows compute costs ~3x one that follows another collective:
# its threads must wake up), short enough not to add time-sharing skew a chain of lookups lacks.
GAP_S = 1e-4


# torch 2.13 renamed the flat-tensor collectives (the old names warn); older torch has only those.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _run_collective(kind: str, nbytes: int, world: int) -> None:
    n = max(world, nbytes // 4 // world * world)           # fp32 elements of the payload
    if kind == "all_gather":
        _ALL_GATHER(torch.empty(n), torch.ones(n // world))
    elif kind == "reduce_scatter":
        _REDUCE_SCATTER(torch.empty(n // world), torch.ones(n))
    elif kind == "all_to_all":
        dist.all_to_all_single(torch.empty(n), torch.ones(n))
    else:
        dist.all_reduce(torch.ones(n))


def _busy(seconds: float) -> None:
    """Compute on this thread for `seconds` of its CPU time."""
    a = torch.full((32, 32), 0.1)
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        a = torch.tanh(a @ a)


def _payload(nbytes: int, world: int) -> int:
    """Payload bytes of the fp32 tensor _run_collective uses for a nominal size."""
    return 4 * max(world, nbytes // 4 // world * world)


def _time_collectives(world: int, sizes, reps: int, kinds=KINDS) -> dict:
    """{kind: [(payload bytes, median seconds)]}: each collective run `reps` times, after GAP_S of compute."""
    out = {}
    for kind in kinds:
        out[kind] = []
        for nbytes in sizes:
            dist.barrier()
            times = []
            for _ in range(reps + 2):
                _busy(GAP_S)
                t0 = time.perf_counter()
                _run_collective(kind, nbytes, world)
                times.append(time.perf_counter() - t0)
            out[kind].append((_payload(nbytes, world), statistics.median(times[2:])))
    return out


def _calibration_rank(rank: int, world: int, sizes, reps: int):
    timings = _time_collectives(world, sizes, reps)
    return timings if rank == 0 else None


def fit_tier(kind: str, samples: list[tuple[float, float]], world: int) -> LinkTier:
    """alpha, beta of `kind` on `world` ranks from (payload bytes, seconds): least relative error, both >= 0."""
    alg = GLOO_ALGORITHMS[kind]
    hops = collective_time(kind, 0.0, world, LinkTier("unit", 1.0, 1.0, ""), alg)      # seconds per alpha
    share = collective_time(kind, 1.0, world, LinkTier("unit", 0.0, 1.0, ""), alg)     # bytes on the wire per byte
    t = np.array([s for _, s in samples])
    A = np.array([[hops, share * b] for b, _ in samples]) / t[:, None]      # rows scaled: relative error
    ones = np.ones(len(t))
    x = np.linalg.lstsq(A, ones, rcond=None)[0]
    if (x < 0).any():                 # the non-negative optimum then uses one column only
        singles = [np.where(np.arange(2) == c, max(0.0, A[:, c] @ ones / (A[:, c] @ A[:, c])), 0.0) for c in (0, 1)]
        x = min(singles, key=lambda v: float(np.sum((A @ v - ones) ** 2)))
    alpha, inv_bw = x
    return LinkTier(f"gloo_{kind}", float(alpha), float(1 / inv_bw) if inv_bw > 0 else float("inf"),
                    f"calibrated: {kind} on {world} gloo processes over loopback, sizes {[int(b) for b, _ in samples]}")


def calibrate_gloo(ranks: int = 2, sizes=SIZES, reps: int = 10) -> dict[str, LinkTier]:
    """{kind: LinkTier} fitted to collectives measured on `ranks` local gloo processes (one thread each)."""
    if ranks < 2:
        raise ValueError(f"calibration needs >= 2 ranks, got {ranks}")
    timings = launch(_calibration_rank, (tuple(sizes), reps), cpu_ranks(ranks), timeout_s=120)
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
    from ..train import batch_sampler
    from ..data.shards import dataset_dir
    from ..data.loader import EventDataset
    from ..data.shards import ensure_dataset, shard_paths

    folder = dataset_dir(preset.name, preset.model, preset.data)
    ensure_dataset(preset.model, preset.data, folder)
    lengths = EventDataset(shard_paths(folder, "train"), preset.model).lengths
    sampler = batch_sampler(lengths, preset, train, 0, ranks)
    plans = []
    for parts in sampler.plan():
        plans.append(parts)
        if len(plans) == steps:
            return plans, lengths
    raise ValueError(f"the dataset holds fewer than {steps} global batches of {train.batch_size}")


def _probe(iters: int = 1200) -> tuple[float, float]:
    """A fixed amount of compute on this thread (small matmuls): (wall seconds, CPU seconds).

    CPU seconds per probe say how fast this core runs right now (a busy neighbour slows it);
    wall / CPU says how much of a core this thread gets (time-sharing)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 96, generator=g) / 10, torch.randn(96, 96, generator=g) / 10
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(iters):             # ~20 ms of one core; values stay O(0.1) (no denormals)
        a = torch.tanh(a @ b)
    return time.perf_counter() - w0, time.thread_time() - c0


def _compute_rank(rank: int, world: int, preset: Preset, train: TrainConfig, parts: list[list[int]], reps: int):
    """Thread CPU seconds of one training step (the one step timer) on each index list in a 1-rank
    process group, in units of the CPU seconds of a _probe run just before (median of `reps`
    passes over all lists)."""
    from ..train import setup

    s = setup(preset, train, device="cpu")
    batches = [s.train_set.__getitems__(p) for p in parts]
    for batch in batches[:3]:
        s.step(batch)
    units, probes = [[] for _ in batches], []
    for _ in range(reps):                 # whole passes: a burst of load hits one pass, not every rep of a list
        for i, batch in enumerate(batches):
            if i % 8 == 0:
                probes.append(_probe()[1])
            units[i].append(s.timed_step(lambda: batch)[0].cpu_s / probes[-1])
    return {"units": [statistics.median(u) for u in units], "probe_cpu_s": statistics.median(probes)}


def _stretch() -> tuple[float, float]:
    """(time-sharing: wall per CPU second, probe CPU seconds) of a _probe all ranks run at once (medians)."""
    dist.barrier()
    wall, cpu = _probe()
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, (wall / cpu, cpu))
    return statistics.median(o[0] for o in out), statistics.median(o[1] for o in out)


def _measured_rank(rank: int, world: int, preset: Preset, train: TrainConfig, kinds: tuple, sizes):
    """The run on R ranks, each step timed as the training loop times it (train_step alone), framed by
    time-sharing probes and followed by one timing of each calibration collective, so the link
    is sampled under the same load as the steps. Rank 0 returns it all."""
    from ..data.loader import make_loader
    from ..data.sampler import StepBatches
    from ..train import setup

    s = setup(preset, train, device="cpu")
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0)))
    steps, link = [], {(kind, nbytes): [] for kind in kinds for nbytes in sizes}
    for _ in range(train.steps):
        batch = next(batches)
        before = _stretch()
        record = s.timed_step(lambda: batch)[0]          # the one step timer, as the training loop times its steps
        after = _stretch()
        steps.append({"step_s": record.step_s, "cpu_s": record.cpu_s, "process_cpu_s": record.process_cpu_s,
                      "stretch": (before[0] + after[0]) / 2, "probe_cpu_s": (before[1] + after[1]) / 2})
        for (kind, nbytes), times in link.items():
            _busy(GAP_S)                       # gloo's threads fall asleep, as between a step's ops
            t0 = time.perf_counter()
            _run_collective(kind, nbytes, world)
            times.append(time.perf_counter() - t0)
    skip = min(2, train.steps - 1)
    timings = {kind: [(_payload(nbytes, world), statistics.median(link[(kind, nbytes)][skip:])) for nbytes in sizes]
               for kind in kinds}
    cpu = [None] * world
    dist.all_gather_object(cpu, [step["cpu_s"] for step in steps])
    return {"steps": steps, "calibration": timings, "rank_cpu_s": cpu} if rank == 0 else None


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def validate(preset: str | Preset = "tiny", ranks=(2, 4), *, steps: int = 10, warmup: int = 8, batch_size: int = 64,
             calibration_ranks: int | None = None, compute_reps: int = 3, sizes=SIZES, layout: str = "fsdp_2d",
             cores: int | None = None, log=print) -> list[dict]:
    """Predicted vs measured median step time for each rank count (one row per R).

    calibration_ranks: None samples the gloo link inside each run, on its R ranks; an int
    calibrates it once, before, on that many otherwise idle processes.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    ranks = list(ranks)
    if any(r < 2 for r in ranks) or steps < 3 or warmup < 3:
        raise ValueError(f"need ranks >= 2, steps >= 3, warmup >= 3; got {ranks}, {steps}, {warmup}")
    cores = cores or available_cores()
    trains = {R: validation_config(preset, R, steps=steps, warmup=warmup, batch_size=batch_size, layout=layout)
              for R in ranks}
    plans = {}
    for R in ranks:
        plans[R], lengths = _plans(preset, trains[R], R, warmup + steps)
    late = range(2, warmup)           # warm-up steps that measure the host work
    parts = [p for R in ranks for step in plans[R][late.start:] for p in step]
    log(f"timing {len(parts)} per-rank batches in one process, one thread ...")
    single = launch(_compute_rank, (preset, override(trains[ranks[0]], mesh="1x1"), parts, compute_reps),
                    cpu_ranks(1), timeout_s=600)
    units = iter(single["units"])
    shared = calibrate_gloo(calibration_ranks, sizes) if calibration_ranks else None
    rows = []
    for R in ranks:
        per_part = [[next(units) for _ in step] for step in plans[R][late.start:]]   # late warm-up, then timed
        log(f"running {R} gloo ranks: {warmup} warm-up + {steps} timed steps ...")
        kinds = () if shared else _kinds(preset, trains[R])
        out = launch(_measured_rank, (preset, trains[R], kinds, tuple(sizes)), cpu_ranks(R), timeout_s=600)
        tiers = shared or {kind: fit_tier(kind, out["calibration"][kind], R) for kind in kinds}
        rows.append(_compare(preset, trains[R], plans[R], lengths, per_part, out, tiers, late, single, cores))
        rows[-1]["calibration_ranks"] = calibration_ranks or R
    return rows


def _compare(preset: Preset, train: TrainConfig, plan, lengths, per_part, out: dict, tiers: dict, late: range,
             single: dict, cores: int) -> dict:
    """Predict every timed step of a run from its inputs; medians of prediction and measurement."""
    R, warmup, steps = len(plan[0]), train.warmup_steps, out["steps"]
    # host work, in probe units: the ranks' thread CPU minus the one-process CPU of the same parts
    host = max(0.0, statistics.median(out["rank_cpu_s"][r][i] / steps[i]["probe_cpu_s"] - per_part[i - late.start][r]
                                      for i in late for r in range(R)))
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    timed = steps[warmup:]
    predicted = [_predict_step(preset, train, tiers, cost, lengths, parts, [u * m["probe_cpu_s"] for u in units],
                               m["stretch"], host * m["probe_cpu_s"])
                 for parts, units, m in zip(plan[warmup:], per_part[warmup - late.start:], timed)]
    pred = {k: statistics.median(p[k] for p in predicted) for k in predicted[0]}
    meas = statistics.median(m["step_s"] for m in timed)
    probe = statistics.median(m["probe_cpu_s"] for m in timed)
    return {"ranks": R, "cores": cores, "measured_s": meas, "predicted_s": pred["step_s"],
            "error": pred["step_s"] / meas - 1, "compute_1proc_s": pred["compute_s"], "host_work_s": host * probe,
            "time_sharing": statistics.median(m["stretch"] for m in timed),
            "time_sharing_formula": max(1.0, R / cores), "imbalance": pred["imbalance"],
            "flop_imbalance": pred["flop_imbalance"], "comm_s": pred["comm_s"],
            "without_host_work_error": pred["no_host_s"] / meas - 1,
            "core_speed_run_vs_1proc": single["probe_cpu_s"] / probe,
            "other_threads_cpu_s": statistics.median(m["process_cpu_s"] - m["cpu_s"] for m in timed),
            "tiers": {k: {"alpha_us": v.alpha_s * 1e6, "bandwidth_gb_s": v.bandwidth_bytes_per_s / 1e9}
                      for k, v in tiers.items()}}


def _kinds(preset: Preset, train: TrainConfig) -> tuple[str, ...]:
    """The collective kinds one step of this configuration runs."""
    mesh = train.parallelism.shape
    rows = step_collectives(preset.model, mesh, 1, 1, True, 4, train.parallelism.sparse_sharding, fuse_all_to_alls=False)
    return tuple(k for k in KINDS if any(r["kind"] == k for r in rows))


def _predict_step(preset: Preset, train: TrainConfig, tiers: dict, cost: SampleCost, lengths: np.ndarray,
                  parts: list[list[int]], seconds: list[float], share: float, host: float) -> dict:
    """One step: (mean one-process compute + host work) x time-sharing x imbalance + comm (none hidden).

    The imbalance is that of the measured one-process seconds of the ranks' parts (the cost the
    ranks really wait for); the model-FLOP imbalance the projection uses is returned next to it."""
    ranks = len(parts)
    mesh = train.parallelism.shape
    tokens = sum(int(lengths[p].sum()) for p in parts) / ranks
    coll = comm_rows(step_collectives(preset.model, mesh, max(1, round(train.batch_size / ranks)), round(tokens), True, 4,
                                      train.parallelism.sparse_sharding, fuse_all_to_alls=False), mesh, None,
                     kind_tiers=tiers, algorithm=GLOO_ALGORITHMS)
    coll = exposed_only(coll)
    compute, imb = statistics.mean(seconds), imbalance(seconds)
    result = predict_step((compute + host) * share, imb, coll)
    return {"step_s": result["step_s"], "compute_s": compute, "imbalance": imb, "comm_s": result["comm_s"],
            "flop_imbalance": imbalance([float(cost.cost(lengths[p]).sum()) for p in parts]),
            "no_host_s": predict_step(compute * share, imb, coll)["step_s"]}
