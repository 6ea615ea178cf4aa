"""The training loop: train, time, evaluate, record; on one process or on ranks.

`run()` sets the run up with the switches of a TrainConfig (gemref/train/compose.py), trains
with AdamW, times every step, evaluates NE and AUC on held-out shards and returns the run
record (typed in gemref/report/records.py; docs/design.md), also written as JSON.

Each step, `measure_step` times training's step (gemref/step.py) with the one step timer,
gemref/mfu/timing.py `timed_step`, which the waterfall and the benches use too. Host syncs
per step: the stopwatch's (CUDA: synchronize at both ends) and, right after it, one read of
(loss, non-finite flag) from the idle device; on CUDA the executed-FLOP count then copies the
batch's lengths to the device and back (a kernel's tiles depend on it), still on the idle
device, outside the timed step. A NaN/inf loss or gradient stops the run (`NonFiniteError`,
naming the step and the newest checkpoint of a good state; a bad state is never saved).

Several ranks (gemref/parallel/parallelize.py; started by `launch_runs` through the one
launcher, gemref/parallel/launch.py): batch_size is the global batch, each rank takes its
part, losses are divided by the global batch size and gradients summed, so a step equals the
single-process step on the global batch; the ranks all-reduce (loss, flag) every step, so all
stop at the same step. After the loop every rank's step records reach every rank, and the
summary is gemref/mfu/meter.py's: E2E MFU = local MFU x scaling ratio, as in the waterfall.
Rank 0 evaluates for the record and writes it.
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..autoac import plan_record, saved_compression
from ..compile import compile_stats
from ..interop.lib import quiet_torchrec
from ..config import Preset, TrainConfig
from ..data.jagged import JaggedBatch
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..errors import UsageError
from ..runtime.files import to_jsonable, write_json
from ..interop.tables import engine_record
from ..mfu.memory import track_peak_memory
from ..mfu.meter import run_peak, summary
from ..mfu.timing import StepRecord
from ..model import TASKS, ranking_loss
from ..parallel import launch
from ..checkpoint import checkpoint_path, run_description, save_checkpoint, start_from_checkpoint
from ..parallel.fsdp import reshard_all
from ..parallel.memory import global_parameters, rank_bytes
from ..parallel.parallelize import measure_comm, rank_times
from ..report.metrics import normalized_entropy, roc_auc
from ..report.records import EvalResult, MemoryRecord, ParallelRecord, RunRecord, run_record
from ..step import NonFiniteError, nonfinite

from .compose import Setup, setup

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """One training step as the loop sees it (this rank's view; loss and flag are global)."""

    step: int                 # steps completed with this one (1-based, as checkpoints count)
    loss: float               # the global batch's loss
    nonfinite: bool           # the loss or a gradient held a NaN/inf, on some rank
    work: StepRecord          # this rank's seconds, data wait, CPU, samples, tokens, FLOPs


@torch.no_grad()
def evaluate(s: Setup, batches: int, step: int) -> EvalResult:
    """NE and AUC per task on the first `batches` eval batches (deterministic order), after `step` steps."""
    s.model.eval()
    loader = make_loader(s.eval_set, s.train.batch_size, shuffle=False, drop_last=False)
    logits, labels = [], []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        batch = batch.to(s.device)
        with s.precision.autocast():
            logits.append(s.model(batch).float().cpu())
        labels.append(batch.labels.cpu())
    s.model.train()
    logits_t, labels_t = torch.cat(logits), torch.cat(labels)
    out = {"step": step, "eval_samples": labels_t.shape[0], "eval_loss": float(ranking_loss(logits_t, labels_t))}
    for t, task in enumerate(TASKS):
        out[f"ne_{task}"] = normalized_entropy(logits_t[:, t], labels_t[:, t])
        out[f"auc_{task}"] = roc_auc(logits_t[:, t], labels_t[:, t])
    return out


def measure_step_memory(s: Setup, batch: JaggedBatch) -> MemoryRecord:
    """Peak memory of one forward+backward (CPU: live tensor bytes, a separate slow pass)."""
    s.optimizer.zero_grad(set_to_none=True)
    with track_peak_memory(s.device) as peak:
        s.gradients(batch)
    s.optimizer.zero_grad(set_to_none=True)
    return {"peak_memory_bytes": peak.bytes, "peak_memory_method": peak.method}


def resume_step(s: Setup) -> int:
    """The step to start from: when resuming, that of the newest complete checkpoint (verified
    against this run before anything is unpickled); else 0, after claiming the checkpoint
    folder for this run (a folder another run owns is refused before any training)."""
    tc = s.train
    if not (tc.checkpoint.every or tc.checkpoint.resume):
        return 0
    step = start_from_checkpoint(tc.checkpoint.folder, s.model, s.optimizer, global_batch=tc.batch_size,
                                 seed=tc.seed, resume=tc.checkpoint.resume, run=run_description(s.preset, tc),
                                 overwrite=tc.checkpoint.overwrite)
    if step >= tc.steps:
        raise UsageError(f"{tc.checkpoint.folder} is at step {step}, which is not below steps={tc.steps}: "
                         "nothing to train")
    return step


def measure_step(s: Setup, batches: Iterator[JaggedBatch], step: int) -> StepResult:
    """Training step `step` (1-based) on the next batch, timed (Setup.timed_step), then checked.

    Not timed as the step: the FLOP count, the non-finite check and, with several ranks, the
    all-reduce of (loss, flag)."""
    work, loss, _ = s.timed_step(lambda: next(batches))
    health = torch.stack([loss.float(), nonfinite(loss, s.model)])
    if s.parallel:
        dist.all_reduce(health)           # the global loss (parts divided by the global batch); flagged ranks
    loss_value, flagged = health.tolist()
    return StepResult(step, loss_value, flagged > 0, work)


COMPRESSION_COUNTS = ("tensors", "bytes", "compressed", "compressed_bytes", "stored_bytes", "kept_bytes")


def compression_record(s: Setup, before: dict, steps: int) -> dict | None:
    """What the saved-activation hooks did per training step (bytes; mean over `steps` steps since
    the counters read `before`), with the format; None when nothing is compressed."""
    compression = saved_compression(s.model)
    if compression is None or steps == 0:
        return None
    return {"format": compression.spec.format, "block": compression.spec.block,
            "bytes_per_value": compression.spec.bytes_per_value(),
            "per_step": {k: (compression.stats[k] - before.get(k, 0)) / steps for k in COMPRESSION_COUNTS}}


def every_rank(s: Setup, records: list[StepRecord]) -> list[list[StepRecord]]:
    """Every rank's step records (one all-gather after the loop; [records] in one process)."""
    if s.parallel is None:
        return [records]
    return [[StepRecord(**r) for r in rank] for rank in s.parallel.gather([asdict(r) for r in records])]


def parallel_record(s: Setup, batch: JaggedBatch, timed: list[StepResult]) -> ParallelRecord:
    """Per-rank times, bytes per rank, and one measured step of communication (collective on all ranks)."""
    par, tc = s.parallel, s.train
    reshard_all(s.model)    # evaluation leaves FSDP's root unit gathered
    memory = par.gather(rank_bytes(s.model, s.optimizer))
    comm = measure_comm(par, s.preset, s.model, batch, lambda: s.gradients(batch))
    s.optimizer.zero_grad(set_to_none=True)
    times = rank_times(par, [r.work.wall_s for r in timed], [r.work.cpu_s for r in timed],
                       [r.work.samples for r in timed])
    layout = tc.parallelism
    return {"parallel": {"world": par.world, "mesh": layout.mesh, "backend": par.backend, "balance": tc.balancing.policy,
                         "sparse_sharding": layout.sparse_sharding, "reshard_after_forward": layout.reshard_after_forward},
            "ranks": times, "memory_per_rank": memory, "comm": comm}


def run(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
        data_root: str | Path | None = None, json_path: str | Path | None = None,
        progress: bool = True, measure_memory: bool = True) -> RunRecord:
    """Train and measure; return the run record (every rank returns it, rank 0 writes it).
    Raises NonFiniteError at the first step whose loss or gradient is NaN/inf."""
    s = setup(preset, train, device=device, data_root=data_root, progress=progress)
    tc = s.train
    start = resume_step(s)
    warmup = max(0, min(tc.warmup_steps, tc.steps - start - 1))   # at least one timed step
    if warmup < tc.warmup_steps and s.rank == 0:
        log.warning("timing after %d warm-up step(s), not warmup_steps=%d: this run has %d step(s) to time",
                    warmup, tc.warmup_steps, tc.steps - start)
    peak = run_peak(s.device, s.precision.precision, s.rank, s.precision.is_emulated)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, start),
                               num_workers=tc.num_workers, device=s.device))
    good = checkpoint_path(tc.checkpoint.folder, start) if start else None   # newest checkpoint of a good state
    compression = saved_compression(s.model)
    counts_before = dict(compression.stats) if compression else {}
    results: list[StepResult] = []
    evals: list[EvalResult] = []
    bar = tqdm(range(start + 1, tc.steps + 1), desc=f"train {s.preset.name}", unit="step",
               disable=not progress or s.rank != 0)
    for step in bar:
        result = measure_step(s, batches, step)
        if result.nonfinite:
            raise NonFiniteError(step, result.loss, good, bool(tc.checkpoint.folder and tc.checkpoint.every))
        results.append(result)
        bar.set_postfix(loss=f"{result.loss:.4f}", step_s=f"{result.work.step_s:.3f}")
        if tc.checkpoint.every and step % tc.checkpoint.every == 0:
            good = save_checkpoint(tc.checkpoint.folder, step, s.model, s.optimizer, global_batch=tc.batch_size,
                                   seed=tc.seed, run=run_description(s.preset, tc))
        if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
            evals.append(evaluate(s, tc.eval_batches, step))
    evals.append(evaluate(s, tc.eval_batches, tc.steps))
    ac_compression = compression_record(s, counts_before, len(results))
    ranks = every_rank(s, [r.work for r in results])
    # one-off measurements on this rank's part of the run's last global batch
    last = s.train_set.__getitems__(next(iter(StepBatches(s.sampler, tc.steps - 1)))).to(s.device)
    parallel = parallel_record(s, last, results[warmup:]) if s.parallel else None
    memory = measure_step_memory(s, last) if measure_memory else None
    stats = compile_stats(s.model)
    record = run_record(s.preset, tc, kernel=s.kernel, precision=s.precision, device=s.device,
                        ranks=s.world,
                        compile=stats.as_record() if stats else None, ac_plan=plan_record(s.model),
                        parameters=global_parameters(s.model), start_step=start,
                        summary=summary(ranks, peak, warmup, device_type=s.device.type,
                                        threads=torch.get_num_threads()),
                        steps=ranks[0], losses=[r.loss for r in results], evals=evals,
                        parallel=parallel, memory=memory, ac_compression=ac_compression,
                        embeddings=engine_record(s.model))
    if json_path and s.rank == 0:
        write_json(json_path, record)
    return record


def _run_on_rank(rank: int, world: int, preset: Preset, trains: list[TrainConfig], kwargs: dict):
    with quiet_torchrec() if any(t.embedding_tables.engine == "torchrec" for t in trains) else contextlib.nullcontext():
        records = [run(preset, train, **kwargs) for train in trains]
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
