"""The training loop: the one place where the efficiency switches compose.

`run()` generates (or reuses) the synthetic data, builds the model with the switches of a
TrainConfig (`build_model`, torchtitan's order: precision, activation checkpointing,
compile, then sharding: tables, then FSDP), trains with AdamW, times every step
(gemref/mfu/meter.py), evaluates NE and AUC on held-out shards and returns the run record
(typed in gemref/report/records.py; docs/design.md), also written as JSON. Default dtype:
fp32 on CPU, bf16 autocast with fp32 master weights on CUDA; `precision` selects float8/MXFP8.

Each step, `measure_step` fetches a batch, runs training's step (gemref/step.py, which the
benches and the AC profiler run too) under the stopwatch and returns a typed `StepResult`.
Host syncs per step: the stopwatch's (CUDA: synchronize at both ends) and, right after it,
one read of (loss, non-finite flag) from the idle device; on CUDA the executed-FLOP count
then copies the batch's lengths to the device and back (a kernel's tiles depend on it),
still on the idle device, outside the timed step. A NaN/inf loss or gradient stops
the run (`NonFiniteError`, naming the step and the newest checkpoint of a good state; a bad
state is never saved). Several ranks (gemref/parallel/parallelize.py): batch_size is the
global batch, each rank takes its part, losses are divided by the global batch size and
gradients summed, so a step equals the single-process step on the global batch; the ranks
all-reduce (loss, flag) every step, so all stop at the same step, and their work counts
(samples, tokens, FLOPs) once, after the loop. Rank 0 evaluates for the record and writes it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm import tqdm

from .autoac.compress import CompressionSpec
from .autoac.profile import auto_checkpoint
from .attention import resolve_kernel
from .autoac.regions import auto_checkpoint_regions
from .autoac.solver import ac_blocks, applied_plan, apply_plan, plan_record, recompute_flops, saved_compression
from .compile import compile_model, compile_stats
from .config import Preset, TrainConfig, get_preset
from .data.batches import representative_batch
from .data.jagged import JaggedBatch
from .data.loader import EventDataset, make_loader
from .data.sampler import BalancedDistributedBatchSampler, StepBatches
from .errors import UsageError
from .env import resolve_device
from .data.shards import dataset_dir, ensure_dataset, shard_paths
from .balance import SampleCost
from .parallel.parallelize import ParallelState, measure_comm, parallel_state, parallelize, rank_times
from .report.metrics import normalized_entropy, roc_auc
from .mfu.flops import executed_flops, model_flops, sample_cost_coefficients
from .mfu.memory import track_peak_memory
from .mfu.meter import Meter, StepRecord, run_peak, stopwatch
from .mfu.profile import time_breakdown
from .model import TASKS, GEMRef, ranking_loss
from .parallel.checkpoint import checkpoint_path, run_description, save_checkpoint, start_from_checkpoint
from .parallel.fsdp import reshard_all
from .parallel.memory import global_parameters, rank_bytes
from .precision.apply import PrecisionReport, apply_precision
from .precision.fast_linear import use_fastest_cpu_gemms
from .report import write_json
from .report.records import EvalResult, MemoryRecord, ParallelRecord, RunRecord, run_record
from .step import NonFiniteError, backward, forward_loss, nonfinite, train_step  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """What a run needs besides the loop: model, optimizer, data, device facts."""

    preset: Preset
    train: TrainConfig
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_set: EventDataset
    eval_set: EventDataset
    kernel: str                   # the concrete gdpa kernel (auto resolved)
    precision: PrecisionReport    # what the precision switch converted, autocast dtype
    sampler: BalancedDistributedBatchSampler   # this rank's part of every global batch
    parallel: ParallelState | None = None   # mesh and rank; None in one plain process

    @property
    def rank(self) -> int:
        return self.parallel.rank if self.parallel else 0

    @property
    def world(self) -> int:
        return self.parallel.world if self.parallel else 1

    @property
    def normalizer(self) -> int | None:
        """The loss divisor: the global batch when ranks hold parts of it, else None (the batch's size)."""
        return self.train.batch_size if self.parallel else None

    def loss(self, batch: JaggedBatch) -> Tensor:
        """This run's forward loss on a batch (on the run's device)."""
        return forward_loss(self.model, batch, self.precision.autocast_dtype, self.normalizer)

    def gradients(self, batch: JaggedBatch) -> None:
        """Forward and backward only, gradients left in place (to measure memory or communication)."""
        self.optimizer.zero_grad(set_to_none=True)
        backward(self.model, self.loss(batch), self.parallel.finish_backward if self.parallel else None)

    def step(self, batch: JaggedBatch) -> Tensor:
        """One training step of this run (gemref/step.py); the detached loss, on the device."""
        return train_step(self.model, self.optimizer, batch, autocast_dtype=self.precision.autocast_dtype,
                          normalizer=self.normalizer,
                          finish_backward=self.parallel.finish_backward if self.parallel else None,
                          after_optimizer_step=self.precision.after_optimizer_step)


@dataclass
class StepResult:
    """One training step as the loop sees it (this rank's view; loss and flag are global)."""

    step: int                 # steps completed with this one (1-based, as checkpoints count)
    loss: float               # the global batch's loss
    nonfinite: bool           # the loss or a gradient held a NaN/inf, on some rank
    cpu_seconds: float        # this thread's CPU time in the step (per-rank compute: rank_times)
    work: StepRecord          # this rank's seconds, data wait, samples, tokens, model/executed FLOPs


def resolve_precision(train: TrainConfig, device: torch.device) -> str:
    """The precision a run uses: `auto` is fp32 on CPU and bf16 autocast on CUDA."""
    return train.precision if train.precision != "auto" else "bf16" if device.type == "cuda" else "fp32"


def build_model(preset: Preset, train: TrainConfig, device: torch.device,
                parallel: ParallelState | None = None) -> tuple[nn.Module, str, PrecisionReport]:
    """GEMRef with the switches applied (model-level switches first, sharding last); returns
    it, the concrete attention kernel and the precision report."""
    precision = resolve_precision(train, device)
    dtype = torch.bfloat16 if device.type == "cuda" and precision != "fp32" else torch.float32
    probe = torch.empty(0, preset.model.n_heads, preset.model.head_dim, device=device, dtype=dtype)
    kernel = resolve_kernel(train.kernel, probe, preset.model.activation, True, None) if train.jagged \
        else "reference"
    torch.manual_seed(train.seed)
    model = GEMRef(preset.model, jagged=train.jagged, kernel=kernel).to(device)
    report = apply_precision(model, precision, device=device, kernel=train.precision_kernel,
                             min_dim=train.precision_min_dim)
    use_fastest_cpu_gemms(model, device)   # CPU fp32: each Linear GEMM on the fastest measured path
    compression = CompressionSpec(train.ac_compress) if train.ac_compress != "none" else None
    if train.ac == "full":
        apply_plan(model, {name: "full" for name in ac_blocks(model)})
    elif train.ac == "auto":   # profiled eagerly on a batch shaped like the preset's data
        batch = representative_batch(preset, train.batch_size, device, seed=train.seed)
        options = ("full",) if train.compile else ("selective", "full")
        if compression is None:
            auto_checkpoint(model, batch, train.ac_budget, options=options, autocast_dtype=report.autocast_dtype)
        else:                  # one budget per block, "compressed" one more option for each
            auto_checkpoint_regions(model, batch, train.ac_budget, compression, options=options,
                                    autocast_dtype=report.autocast_dtype)
    elif compression is not None:   # no checkpointing: every block keeps its saved activations compressed
        apply_plan(model, {name: "compressed" for name in ac_blocks(model)}, compression=compression)
    if train.compile:
        compile_model(model, activation_memory_budget=train.ac_budget if train.ac == "pt2" else None)
    if parallel is not None:
        parallelize(model, train, parallel, device)
    return model, kernel, report


def make_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; embedding tables get no weight decay (rows a batch does not touch keep their values).

    The fused implementation (one kernel over all parameters of a group) where every
    parameter is floating point on CPU or CUDA: on CPU torch's default is a Python loop of
    ~10 ops per parameter, and fused matches it within fp32 rounding (tests/test_optimizer.py;
    `gemref bench step_profile` shows the optimizer's share of a step). Elsewhere torch's default."""
    params = list(model.named_parameters())
    tables = [p for n, p in params if n.startswith("tables.")]
    dense = [p for n, p in params if not n.startswith("tables.")]
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for _, p in params)
    return torch.optim.AdamW([{"params": dense, "weight_decay": train.weight_decay},
                              {"params": tables, "weight_decay": 0.0}], lr=train.lr, fused=fused or None)


def batch_sampler(lengths, preset: Preset, train: TrainConfig, rank: int, world: int) -> BalancedDistributedBatchSampler:
    """This rank's part of every global batch (drop_last: every step has the full global batch)."""
    policy = "round_robin" if train.balance == "none" else train.balance
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    return BalancedDistributedBatchSampler(lengths, train.batch_size, cost, rank=rank, world_size=world,
                                           seed=train.seed, policy=policy, drop_last=True)


def setup(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
          data_root: str | Path | None = None, progress: bool = False) -> Setup:
    preset = get_preset(preset) if isinstance(preset, str) else preset
    train = train or preset.train
    parallel, dev = parallel_state(train, resolve_device(device))
    folder = dataset_dir(preset, data_root)
    ensure_dataset(preset.model, preset.data, folder, progress=progress)
    train_set = EventDataset(shard_paths(folder, "train"), preset.model)
    eval_set = EventDataset(shard_paths(folder, "eval"), preset.model)
    model, kernel, precision = build_model(preset, train, dev, parallel)
    rank, world = (parallel.rank, parallel.world) if parallel else (0, 1)
    return Setup(preset, train, dev, model, make_optimizer(model, train), train_set, eval_set,
                 kernel, precision, batch_sampler(train_set.lengths, preset, train, rank, world), parallel)


def sample_batch(s: Setup) -> JaggedBatch:
    """The first training batch of the run's seed, on the run's device (for one-off measurements)."""
    return next(iter(make_loader(s.train_set, s.train.batch_size, seed=s.train.seed))).to(s.device)


def training_step_breakdown(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
                            repeats: int = 3) -> list[dict]:
    """Seconds per step in each named region (gemref/mfu/profile.py) of one real training step."""
    s = setup(preset, train, device=device)
    batch = sample_batch(s)
    return time_breakdown(lambda: s.step(batch), s.device.type, repeats)


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
    if not (tc.checkpoint_every or tc.resume):
        return 0
    step = start_from_checkpoint(tc.checkpoint_dir, s.model, s.optimizer, global_batch=tc.batch_size,
                                 seed=tc.seed, resume=tc.resume, run=run_description(s.preset, tc),
                                 overwrite=tc.checkpoint_overwrite)
    if step >= tc.steps:
        raise UsageError(f"{tc.checkpoint_dir} is at step {step}, which is not below steps={tc.steps}: "
                         "nothing to train")
    return step


def measure_step(s: Setup, batches: Iterator[JaggedBatch], step: int) -> StepResult:
    """Fetch the next batch, run training step `step` (1-based) under the stopwatch, check it.

    Not timed as the step: the data wait (timed apart), the non-finite check and, with
    several ranks, the all-reduce of (loss, flag)."""
    cfg, tc = s.preset.model, s.train
    t0 = time.perf_counter()
    batch = next(batches)
    data_s = time.perf_counter() - t0
    cpu0 = time.thread_time()
    with stopwatch(s.device) as elapsed:
        loss = s.step(batch.to(s.device, non_blocking=True))
    cpu_s = time.thread_time() - cpu0
    health = torch.stack([loss.float(), nonfinite(loss, s.model)])
    if s.parallel:
        dist.all_reduce(health)           # the global loss (parts divided by the global batch); flagged ranks
    loss_value, flagged = health.tolist()
    lengths = batch.lengths
    executed = executed_flops(cfg, lengths, jagged=tc.jagged, kernel=s.kernel, device=s.device).total \
        + recompute_flops(cfg, lengths, applied_plan(s.model), jagged=tc.jagged, kernel=s.kernel)
    work = StepRecord(elapsed[0], data_s, batch.batch_size, batch.num_tokens, model_flops(cfg, lengths).total,
                      executed)
    return StepResult(step, loss_value, flagged > 0, cpu_s, work)


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


def global_work(s: Setup, results: list[StepResult]) -> list[StepRecord]:
    """Each step's record for the meter: this rank's times, the global batch's work (one all-reduce)."""
    if s.parallel is None:
        return [r.work for r in results]
    fields = ("samples", "tokens", "model_flops", "executed_flops")
    sums = iter(int(x) for x in s.parallel.sum([float(getattr(r.work, f)) for r in results for f in fields]))
    return [replace(r.work, **{f: next(sums) for f in fields}) for r in results]


def parallel_record(s: Setup, batch: JaggedBatch, timed: list[StepResult]) -> ParallelRecord:
    """Per-rank times, bytes per rank, and one measured step of communication (collective on all ranks)."""
    par, tc = s.parallel, s.train
    reshard_all(s.model)    # evaluation leaves FSDP's root unit gathered
    memory = par.gather(rank_bytes(s.model, s.optimizer))
    comm = measure_comm(par, s.preset, s.model, batch, lambda: s.gradients(batch))
    s.optimizer.zero_grad(set_to_none=True)
    times = rank_times(par, [r.work.seconds for r in timed], [r.cpu_seconds for r in timed],
                       [r.work.samples for r in timed])
    return {"parallel": {"world": par.world, "mesh": tc.mesh, "backend": par.backend, "balance": tc.balance,
                         "sparse_sharding": tc.sparse_sharding, "reshard_after_forward": tc.reshard_after_forward},
            "ranks": times, "memory_per_rank": memory, "comm": comm}


def run(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
        data_root: str | Path | None = None, json_path: str | Path | None = None,
        progress: bool = True, measure_memory: bool = True) -> RunRecord:
    """Train and measure; return the run record (every rank returns it, rank 0 writes it).
    Raises NonFiniteError at the first step whose loss or gradient is NaN/inf."""
    s = setup(preset, train, device=device, data_root=data_root, progress=progress)
    tc = s.train
    start = resume_step(s)
    warmup = min(tc.warmup_steps, tc.steps - start - 1)   # at least one timed step
    if warmup < tc.warmup_steps and s.rank == 0:
        log.warning("timing after %d warm-up step(s), not warmup_steps=%d: this run has %d step(s) to time",
                    max(warmup, 0), tc.warmup_steps, tc.steps - start)
    meter = Meter(run_peak(s.device, s.precision.precision, s.rank, s.world), warmup_steps=warmup)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, start),
                               num_workers=tc.num_workers, device=s.device))
    good = checkpoint_path(tc.checkpoint_dir, start) if start else None   # newest checkpoint of a good state
    compression = saved_compression(s.model)
    counts_before = dict(compression.stats) if compression else {}
    results: list[StepResult] = []
    evals: list[EvalResult] = []
    bar = tqdm(range(start + 1, tc.steps + 1), desc=f"train {s.preset.name}", unit="step",
               disable=not progress or s.rank != 0)
    for step in bar:
        result = measure_step(s, batches, step)
        if result.nonfinite:
            raise NonFiniteError(step, result.loss, good, bool(tc.checkpoint_dir and tc.checkpoint_every))
        results.append(result)
        bar.set_postfix(loss=f"{result.loss:.4f}", step_s=f"{result.work.seconds:.3f}")
        if tc.checkpoint_every and step % tc.checkpoint_every == 0:
            good = save_checkpoint(tc.checkpoint_dir, step, s.model, s.optimizer, global_batch=tc.batch_size,
                                   seed=tc.seed, run=run_description(s.preset, tc))
        if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
            evals.append(evaluate(s, tc.eval_batches, step))
    evals.append(evaluate(s, tc.eval_batches, tc.steps))
    ac_compression = compression_record(s, counts_before, len(results))
    for work in global_work(s, results):
        meter.record(work)
    # one-off measurements on this rank's part of the run's last global batch
    last = s.train_set.__getitems__(next(iter(StepBatches(s.sampler, tc.steps - 1)))).to(s.device)
    parallel = parallel_record(s, last, results[meter.warmup_steps:]) if s.parallel else None
    memory = measure_step_memory(s, last) if measure_memory else None
    stats = compile_stats(s.model)
    record = run_record(s.preset, tc, kernel=s.kernel, precision=s.precision, device=s.device,
                        ranks=s.world,
                        compile=stats.as_record() if stats else None, ac_plan=plan_record(s.model),
                        parameters=global_parameters(s.model), start_step=start, summary=meter.summary(),
                        steps=meter.steps, losses=[r.loss for r in results], evals=evals,
                        parallel=parallel, memory=memory, ac_compression=ac_compression)
    if json_path and s.rank == 0:
        write_json(json_path, record)
    return record
