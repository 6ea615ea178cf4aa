"""A measured training run: the core loop (gemref/train/loop.py `train`) plus its run record.

`run` sets a TrainConfig up (gemref/train/compose.py), trains through the core loop, then
measures what a record holds beyond the loop's own figures, on this rank's part of the run's last
global batch: the peak memory of one forward+backward, and with several ranks the bytes per
rank and one step's collectives against the analytic volume. The compressed-activation counters
attach to the loop through a hook. The record (typed in gemref/report/records.py;
docs/design.md) is returned and, with `json_path`, written by rank 0. `launch_runs` runs configs
on ranks through the one launcher (gemref/parallel/launch.py); `training_step_breakdown` times
the named regions of one step; `halving_batch` runs something again at half the batch when the
GPU runs out of memory, and says so (the chapters under notebooks/params/gpu.yaml, the GPU check).
"""
from __future__ import annotations

import contextlib
import gc
import json
from collections import Counter
from pathlib import Path
from typing import Callable, TypeVar

import torch

from ..autoac import applied_plan, saved_compression
from ..autoac.plan import wrappers
from ..compile import compile_stats
from ..train.presets import Preset
from ..train.config import TrainConfig
from ..data.jagged import JaggedBatch
from ..data.sampler import StepBatches
from ..env import resolve_device
from ..interop.lib import quiet_torchrec
from ..interop.tables import engine_record
from .comm import measure_comm, rank_times, reshard_all
from ..mfu.memory import track_peak_memory
from ..mfu.profile import time_breakdown
from ..parallel import launch
from ..parallel.memory import global_parameters, rank_bytes
from ..report.records import MemoryRecord, ParallelRecord, RunRecord, run_record
from ..runtime.files import to_jsonable, write_json
from ..train import LoopHooks, Setup, StepResult, TrainResult, sample_batch, setup, train

T = TypeVar("T")


def halving_batch(run_at: Callable[[int], T], batch: int, *, smallest: int = 1,
                  log: Callable[[str], None] = print) -> tuple[T, list[int]]:
    """run_at(batch); when it runs out of GPU memory (torch.OutOfMemoryError), free the cache and
    run_at(batch // 2), and so on down to `smallest`, logging each fallback. Returns (its result,
    every batch tried: the last one ran). Other errors, and out of memory at `smallest`, propagate."""
    if batch < 1 or smallest < 1:
        raise ValueError(f"batch and smallest must be >= 1, got {batch} and {smallest}")
    tried = []
    while True:
        tried.append(batch)
        try:
            return run_at(batch), tried
        except torch.OutOfMemoryError:
            if batch // 2 < smallest:
                raise
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        log(f"out of GPU memory at batch {batch}: running again at batch {batch // 2}")
        batch //= 2


def batch_that_fits(preset: Preset, train: TrainConfig, device: str, *, log: Callable[[str], None] = print
                    ) -> TrainConfig:
    """`train` at the largest batch, halving from its own (`halving_batch`, down to 1), at which one
    training step of its padded, materialised-attention twin (the costliest layout: what a
    chapter's baseline runs) fits on `device`, saying so when it falls back; `train` itself off
    CUDA (host memory does not raise out of memory). Costs one setup and one step per batch tried."""
    from ..train.override import override

    if resolve_device(device).type != "cuda":
        return train

    def one_step(batch: int) -> int:
        s = setup(preset, override(train, batch_size=batch, jagged=False, kernel="reference"), device=device,
                  progress=False)
        try:
            s.step(sample_batch(s))
            torch.cuda.synchronize()
        finally:
            del s
        return batch

    batch, tried = halving_batch(one_step, train.batch_size, log=log)
    if len(tried) > 1:
        log(f"this chapter runs batch {batch}: out of GPU memory at batch {train.batch_size} ({torch.cuda.get_device_name()})")
    return override(train, batch_size=batch)


COMPRESSION_COUNTS = ("tensors", "bytes", "compressed", "compressed_bytes", "stored_bytes", "kept_bytes")


def plan_record(model) -> dict | None:
    """The run-record entry of the AutoAC plan applied to the model (None when nothing is): the
    solver's Plan when one made it, else the choices read off the model."""
    choices = applied_plan(model)
    counts = dict(Counter(choices.values()))
    plan = next((m.plan for m in wrappers(model).values() if m.plan is not None), None)
    if plan is not None and plan.choices == choices:
        return {"choices": dict(choices), "counts": counts, "summary": plan.summary(),
                "budget_bytes": plan.budget_bytes, "predicted_bytes": plan.predicted_bytes,
                "recompute_flops": plan.recompute_flops, "recompute_seconds": plan.recompute_seconds,
                "objective": plan.objective}
    return {"choices": choices, "counts": counts} if choices else None


class CompressionCounts(LoopHooks):
    """What the saved-activation hooks did per training step (bytes; mean over the run's steps),
    with the format; `record` stays None when nothing is compressed."""

    def __init__(self):
        self.before: dict = {}
        self.record: dict | None = None

    def on_start(self, s: Setup, start_step: int) -> None:
        compression = saved_compression(s.model)
        self.before = dict(compression.stats) if compression else {}

    def on_end(self, s: Setup, result: TrainResult) -> None:
        compression, steps = saved_compression(s.model), len(result.steps)
        if compression is None or steps == 0:
            return
        self.record = {"format": compression.spec.format, "block": compression.spec.block,
                       "bytes_per_value": compression.spec.bytes_per_value(),
                       "per_step": {k: (compression.stats[k] - self.before.get(k, 0)) / steps
                                    for k in COMPRESSION_COUNTS}}


def measure_step_memory(s: Setup, batch: JaggedBatch) -> MemoryRecord:
    """Peak memory of one forward+backward (CPU: live tensor bytes, a separate slow pass)."""
    s.optimizer.zero_grad(set_to_none=True)
    with track_peak_memory(s.device) as peak:
        s.gradients(batch)
    s.optimizer.zero_grad(set_to_none=True)
    return {"peak_memory_bytes": peak.bytes, "peak_memory_method": peak.method}


def parallel_record(s: Setup, batch: JaggedBatch, timed: list[StepResult]) -> ParallelRecord:
    """Per-rank times, bytes per rank, and one measured step of communication (collective on all ranks)."""
    par, tc = s.parallel, s.train
    reshard_all(s.model)    # evaluation leaves FSDP's root unit gathered
    memory = par.gather(rank_bytes(s.model, s.optimizer))
    comm = measure_comm(par, s.preset, s.model, batch, lambda: s.gradients(batch), jagged=tc.attention.jagged)
    s.optimizer.zero_grad(set_to_none=True)
    times = rank_times(par, [r.work.wall_s for r in timed], [r.work.cpu_s for r in timed],
                       [r.work.samples for r in timed])
    layout = tc.parallelism
    return {"parallel": {"world": par.world, "mesh": layout.mesh, "backend": par.backend, "balance": tc.balancing.policy,
                         "sparse_sharding": layout.sparse_sharding,
                         "reshard_after_forward": layout.reshard_after_forward,
                         "fsdp_param_dtype": str(par.fsdp_param_dtype).removeprefix("torch.")
                         if par.fsdp_param_dtype else None},
            "ranks": times, "memory_per_rank": memory, "comm": comm}


def run(preset: Preset | str, train_config: TrainConfig | None = None, *, device: str = "auto",
        data_root: str | Path | None = None, json_path: str | Path | None = None,
        progress: bool = True, measure_memory: bool = True) -> RunRecord:
    """Train and measure; return the run record (every rank returns it, rank 0 writes it).
    Raises NonFiniteError at the first step whose loss or gradient is NaN/inf."""
    s = setup(preset, train_config, device=device, data_root=data_root, progress=progress)
    tc = s.train
    compression = CompressionCounts()
    result = train(s, hooks=[compression], progress=progress)
    # one-off measurements on this rank's part of the run's last global batch
    last = s.train_set.__getitems__(next(iter(StepBatches(s.sampler, tc.steps - 1)))).to(s.device)
    parallel = parallel_record(s, last, result.steps[result.warmup_steps:]) if s.parallel else None
    memory = measure_step_memory(s, last) if measure_memory else None
    stats = compile_stats(s.model)
    record = run_record(s.preset, tc, kernel=s.kernel, precision=s.precision, device=s.device, ranks=s.world,
                        compile=stats.as_record() if stats else None, ac_plan=plan_record(s.model),
                        parameters=global_parameters(s.model), start_step=result.start_step,
                        summary=result.summary, steps=result.ranks[0], losses=[r.loss for r in result.steps],
                        evals=result.evals, parallel=parallel, memory=memory, ac_compression=compression.record,
                        embeddings=engine_record(s.model))
    if json_path and s.rank == 0:
        write_json(json_path, record)
    return record


def _run_on_rank(rank: int, world: int, preset: Preset, trains: list[TrainConfig], kwargs: dict):
    with quiet_torchrec() if any(t.embedding_tables.engine == "torchrec" for t in trains) else contextlib.nullcontext():
        records = [run(preset, train_config, **kwargs) for train_config in trains]
    return [json.loads(json.dumps(to_jsonable(r))) for r in records] if rank == 0 else None


def launch_runs(preset: Preset, trains: list[TrainConfig], *, ranks: int | None = None, device: str = "auto",
                timeout_s: float = launch.DEFAULT_TIMEOUT_S, **run_kwargs) -> list[RunRecord] | None:
    """`run` for each config in turn on the same ranks (one start-up for several configs);
    rank 0's records, None on torchrun ranks other than 0.

    Under torchrun (its variables set) this process is one rank; otherwise `ranks` local
    processes are spawned (default: R*S of the first mesh), e.g. `gemref train --ranks 4 --mesh
    2x2`, or `torchrun --nproc-per-node 8 -m gemref train --device cuda --mesh 1x8 ...`. Every
    input is checked by the one pre-flight check (gemref/parallel/launch.py) first."""
    if not trains:
        raise ValueError("launch_runs needs at least one TrainConfig")
    plan = launch.preflight(device, [t.parallelism.backend for t in trains], [t.parallelism.shape for t in trains], ranks)
    return launch.launch(_run_on_rank, (preset, list(trains), {"device": plan.device.type, **run_kwargs}), plan,
                         timeout_s=timeout_s)


def training_step_breakdown(preset: Preset | str, train_config: TrainConfig | None = None, *, device: str = "auto",
                            repeats: int = 3) -> list[dict]:
    """Seconds per step in each named region (gemref/mfu/profile.py) of one real training step."""
    s = setup(preset, train_config, device=device)
    batch = sample_batch(s)
    return time_breakdown(lambda: s.step(batch), s.device.type, repeats)
