"""The training step and loop: the one place where the efficiency switches compose.

`run()` generates (or reuses) the synthetic data, builds the model with the switches of a
TrainConfig, trains with AdamW, times every step (gemref/mfu/meter.py), evaluates NE and AUC
on held-out shards, and returns the run record of DESIGN.md (also written as JSON).

Device and precision: by default CPU runs fp32 and CUDA runs bf16 autocast with fp32 master
weights; `precision` switches the Linear GEMMs to float8 / MXFP8 (gemref/precision.py).

Composition order in `build_model` (torchtitan's): precision conversion, then activation
checkpointing, then torch.compile, then sharding (tables, then FSDP); each wraps the model
from outside.

Several ranks (gemref/distributed.py): inside a process group `setup` builds the 2D mesh
and applies sparse sharding and FSDP LAST (after the model-level switches); batch_size is
the global batch, each rank takes its part (balanced by cost with `balance`), losses are
divided by the global batch size and gradients summed, so a step equals the single-process
step on the global batch. Rank 0 prints, evaluates for the record and writes it.
"""
from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function
from tqdm import tqdm

from . import __version__
from .ac_profile import auto_checkpoint, representative_batch
from .attention import resolve_kernel
from .autoac import ac_blocks, applied_plan, apply_plan, plan_record, recompute_flops
from .compile import compile_model, compile_stats, loss_function
from .config import Preset, TrainConfig, get_preset
from .data.jagged import JaggedBatch
from .data.loader import EventDataset, make_loader
from .data.shards import ensure_dataset, fingerprint_hash, shard_paths
from .distributed import (ParallelState, StepBatches, batch_sampler, measure_comm, parallel_state, parallelize,
                          rank_times)
from .metrics import normalized_entropy, roc_auc
from .mfu.flops import executed_flops, model_flops
from .mfu.memory import track_peak_memory
from .mfu.meter import Meter, StepRecord, stopwatch
from .mfu.peak import Peak, device_name, peak_flops
from .model import TASKS, GEMRef, ranking_loss
from .parallel.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .parallel.fsdp import reshard_all
from .parallel.memory import global_parameters, rank_bytes
from .precision import PrecisionReport, apply_precision
from .report import write_json
from .sampler import BalancedDistributedBatchSampler

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    return torch.device(name)


def default_data_root() -> Path:
    """$GEMREF_DATA_DIR, else data/generated in a source checkout, else ~/.cache/gemref/data."""
    if os.environ.get("GEMREF_DATA_DIR"):
        return Path(os.environ["GEMREF_DATA_DIR"])
    if (PROJECT_ROOT / "pyproject.toml").exists():
        return PROJECT_ROOT / "data" / "generated"
    return Path.home() / ".cache" / "gemref" / "data"


def dataset_dir(preset: Preset, data_root: str | Path | None = None) -> Path:
    root = Path(data_root) if data_root else default_data_root()
    return root / f"{preset.name}-{fingerprint_hash(preset.model, preset.data)}"


def versions() -> dict:
    """torch and gemref versions and the git sha of the checkout (None outside a git clone)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5)
        sha = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"torch": torch.__version__, "gemref": __version__, "git_sha": sha}


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


def resolve_precision(train: TrainConfig, device: torch.device) -> str:
    if train.precision != "auto":
        return train.precision
    return "bf16" if device.type == "cuda" else "fp32"


def build_model(preset: Preset, train: TrainConfig, device: torch.device,
                parallel: ParallelState | None = None) -> tuple[nn.Module, str, PrecisionReport]:
    """GEMRef with the switches applied; returns it, the concrete attention kernel and the
    precision report.

    Order (torchtitan's): model-level switches first, sharding (tables, then FSDP) last.
    """
    precision = resolve_precision(train, device)
    dtype = torch.bfloat16 if device.type == "cuda" and precision != "fp32" else torch.float32
    probe = torch.empty(0, preset.model.n_heads, preset.model.head_dim, device=device, dtype=dtype)
    kernel = resolve_kernel(train.kernel, probe, preset.model.activation, True, None) if train.jagged \
        else "reference"
    torch.manual_seed(train.seed)
    model = GEMRef(preset.model, jagged=train.jagged, kernel=kernel).to(device)
    report = apply_precision(model, precision, device=device, kernel=train.precision_kernel,
                             min_dim=train.precision_min_dim)
    if train.ac == "full":
        apply_plan(model, {name: "full" for name in ac_blocks(model)})
    elif train.ac == "auto":   # profiled eagerly on a batch shaped like the preset's data
        batch = representative_batch(preset, train.batch_size, device, seed=train.seed)
        auto_checkpoint(model, batch, train.ac_budget, options=("full",) if train.compile else
                        ("selective", "full"), autocast_dtype=report.autocast_dtype)
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


def forward_loss(s: Setup, batch: JaggedBatch, normalizer: int | None = None) -> torch.Tensor:
    """The loss; `normalizer` = the global batch size when ranks hold parts of it."""
    with s.precision.autocast():
        logits = s.model(batch)
    with record_function("loss"):
        return loss_function(s.model)(logits, batch.labels, normalizer)


def backward(s: Setup, loss: torch.Tensor) -> None:
    with record_function("backward"):
        loss.backward()
    if s.parallel:
        s.parallel.finish_backward(s.model)


def train_step(s: Setup, batch: JaggedBatch, normalizer: int | None = None) -> torch.Tensor:
    """One optimisation step; returns this rank's detached loss (no host sync)."""
    s.optimizer.zero_grad(set_to_none=True)
    loss = forward_loss(s, batch, normalizer)
    backward(s, loss)
    with record_function("optimizer"):
        s.optimizer.step()
        s.precision.after_optimizer_step(s.model)
    return loss.detach()


@torch.no_grad()
def evaluate(s: Setup, batches: int) -> dict:
    """NE and AUC per task on the first `batches` eval batches (deterministic order)."""
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
    out = {"eval_samples": labels_t.shape[0],
           "eval_loss": float(ranking_loss(logits_t, labels_t))}
    for t, task in enumerate(TASKS):
        out[f"ne_{task}"] = normalized_entropy(logits_t[:, t], labels_t[:, t])
        out[f"auc_{task}"] = roc_auc(logits_t[:, t], labels_t[:, t])
    return out


def measure_step_memory(s: Setup, batch: JaggedBatch, normalizer: int | None = None) -> dict:
    """Peak memory of one forward+backward (CPU: live tensor bytes, a separate slow pass)."""
    s.optimizer.zero_grad(set_to_none=True)
    with track_peak_memory(s.device) as peak:
        backward(s, forward_loss(s, batch, normalizer))
    s.optimizer.zero_grad(set_to_none=True)
    return {"peak_memory_bytes": peak.bytes, "peak_memory_method": peak.method}


def resume_step(s: Setup) -> int:
    """The step to start from: that of the newest complete checkpoint when resuming, else 0."""
    tc = s.train
    found = latest_checkpoint(tc.checkpoint_dir) if tc.resume else None
    if found is None:
        return 0
    step = load_checkpoint(found[1], s.model, s.optimizer, global_batch=tc.batch_size, seed=tc.seed)
    if step >= tc.steps:
        raise ValueError(f"{found[1]} is at step {step}, which is not below steps={tc.steps}: nothing to train")
    return step


def _parallel_record(s: Setup, batch: JaggedBatch, normalizer: int, step_s: list, cpu_s: list,
                     samples: list) -> dict:
    """Per-rank times, bytes per rank, and one measured step of communication (collective on all ranks)."""
    par, tc = s.parallel, s.train

    def fwd_bwd() -> None:
        s.optimizer.zero_grad(set_to_none=True)
        backward(s, forward_loss(s, batch, normalizer))

    reshard_all(s.model)    # evaluation leaves FSDP's root unit gathered
    memory = par.gather(rank_bytes(s.model, s.optimizer))
    comm = measure_comm(par, s.preset, s.model, batch, fwd_bwd)
    s.optimizer.zero_grad(set_to_none=True)
    return {"parallel": {"world": par.world, "mesh": tc.mesh, "backend": par.backend, "balance": tc.balance,
                         "sparse_sharding": tc.sparse_sharding, "reshard_after_forward": tc.reshard_after_forward},
            "ranks": rank_times(par, step_s, cpu_s, samples), "memory_per_rank": memory, "comm": comm}


def precision_label(report: PrecisionReport) -> str:
    """e.g. "fp32", "bf16-autocast", "mxfp8 (emulated)"."""
    if report.precision == "bf16":
        return "bf16-autocast"
    if report.precision == "fp32":
        return "fp32"
    return f"{report.precision} ({report.kernel})"


def mfu_basis(record: dict, s: Setup) -> dict:
    """What the MFU is measured against; for float8/MXFP8 also the fp8-peak utilisation."""
    precision = s.precision.precision
    out = {"mfu_basis": {"fp32": "fp32 peak", "bf16": "bf16 peak"}.get(precision, "bf16-equivalent")}
    if precision.startswith("float8") or precision == "mxfp8":
        fp8 = peak_flops(s.device, "mxfp8" if precision == "mxfp8" else "fp8")
        if s.device.type == "cuda" and fp8.flops:
            world = s.parallel.world if s.parallel else 1
            out["fp8_peak_utilization"] = record["model_tflops_per_s"] * 1e12 / (fp8.flops * world)
        out["speed_claim_valid"] = not s.precision.is_emulated
    return out


def run(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
        data_root: str | Path | None = None, json_path: str | Path | None = None,
        progress: bool = True, measure_memory: bool = True) -> dict:
    """Train and measure; return the run record (every rank returns it, rank 0 writes it)."""
    s = setup(preset, train, device=device, data_root=data_root, progress=progress)
    cfg, tc, par = s.preset.model, s.train, s.parallel
    world = par.world if par else 1
    normalizer = tc.batch_size if par else None        # the global batch (drop_last: always full)
    # float8/MXFP8 MFU is measured against the bf16 dense peak ("bf16-equivalent", DESIGN.md).
    dtype_name = "fp32" if s.precision.precision == "fp32" else "bf16"
    peak = peak_flops(s.device, dtype_name) if s.rank == 0 else Peak(None, "reported by rank 0", dtype_name)
    if world > 1:
        peak = Peak(peak.flops * world if peak.flops else None, f"{peak.source}, x {world} ranks", peak.dtype)
    start = resume_step(s)
    meter = Meter(peak, warmup_steps=min(tc.warmup_steps, tc.steps - start - 1))
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, start),
                               num_workers=tc.num_workers, device=s.device))
    losses, evals, step_s, cpu_s, samples = [], [], [], [], []
    bar = tqdm(range(start, tc.steps), desc=f"train {s.preset.name}", disable=not progress or s.rank != 0,
               unit="step")
    for step in bar:
        t0 = time.perf_counter()
        batch = next(batches)
        data_s = time.perf_counter() - t0
        lengths = batch.lengths
        cpu0 = time.thread_time()
        with stopwatch(s.device) as elapsed:
            loss = train_step(s, batch.to(s.device, non_blocking=True), normalizer)
        cpu_s.append(time.thread_time() - cpu0)
        step_s.append(elapsed[0])
        samples.append(batch.batch_size)
        work = [float(loss), batch.batch_size, batch.num_tokens, model_flops(cfg, lengths).total,
                executed_flops(cfg, lengths, jagged=tc.jagged, kernel=s.kernel, device=s.device).total
                + recompute_flops(cfg, lengths, applied_plan(s.model), jagged=tc.jagged, kernel=s.kernel)]
        work = par.sum(work) if par else work          # the global batch's loss, samples, tokens, FLOPs
        losses.append(work[0])
        meter.record(StepRecord(elapsed[0], data_s, *(int(w) for w in work[1:])))
        bar.set_postfix(loss=f"{losses[-1]:.4f}", step_s=f"{elapsed[0]:.3f}")
        if tc.checkpoint_every and (step + 1) % tc.checkpoint_every == 0:
            save_checkpoint(tc.checkpoint_dir, step + 1, s.model, s.optimizer, global_batch=tc.batch_size,
                            seed=tc.seed)
        if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.steps:
            evals.append({"step": step + 1, **evaluate(s, tc.eval_batches)})
    evals.append({"step": tc.steps, **evaluate(s, tc.eval_batches)})
    record = {
        "kind": "train",
        "preset": s.preset.name,
        "config": {"model": asdict(cfg), "data": asdict(s.preset.data), "train": asdict(tc)},
        "switches": {"jagged": tc.jagged, "kernel": tc.kernel, "kernel_resolved": s.kernel,
                     "compile": tc.compile, "ac": tc.ac, "ac_budget": tc.ac_budget,
                     "balance": tc.balance, "mesh": tc.mesh, "sparse_sharding": tc.sparse_sharding,
                     "precision": s.precision.precision},
        "compile": compile_stats(s.model).as_record() if compile_stats(s.model) else None,
        "ac_plan": plan_record(s.model),
        "hfu_counts_recompute": tc.ac != "pt2",   # PT2's partitioner recompute is not counted
        "device": {"type": s.device.type, "name": device_name(s.device),
                   "threads": torch.get_num_threads(), "ranks": world},
        "dtype": precision_label(s.precision),
        "precision": s.precision.as_record(),
        "versions": versions(),
        "parameters": global_parameters(s.model),
        "start_step": start,
        **meter.summary(),
        "loss_curve": losses,
        "step_log": [asdict(step) for step in meter.steps],   # warm-up steps first
        "eval": evals[-1],
        "eval_history": evals,
    }
    record.update(mfu_basis(record, s))
    device_batch = batch.to(s.device)
    if par:
        timed = slice(meter.warmup_steps, None)
        record.update(_parallel_record(s, device_batch, normalizer, step_s[timed], cpu_s[timed], samples[timed]))
    if measure_memory:
        record.update(measure_step_memory(s, device_batch, normalizer))
    if json_path and s.rank == 0:
        write_json(json_path, record)
    return record
