"""The training step and loop: the one place where the efficiency switches compose.

`run()` generates (or reuses) the synthetic data, builds the model with the switches of a
TrainConfig, trains with AdamW, times every step (gemref/mfu/meter.py), evaluates NE and AUC
on held-out shards, and returns the run record of DESIGN.md (also written as JSON).

Device and precision: CPU runs fp32; CUDA runs bf16 autocast with fp32 master weights.
"""
from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
from torch.profiler import record_function
from tqdm import tqdm

from . import __version__
from .ac_profile import auto_checkpoint, representative_batch
from .attention import resolve_kernel
from .autoac import ac_blocks, applied_plan, apply_plan, plan_record, recompute_flops
from .compile import compile_model, compile_stats, loss_function
from .config import Preset, TrainConfig, get_preset, override
from .data.jagged import JaggedBatch
from .data.loader import EventDataset, make_loader
from .data.shards import ensure_dataset, fingerprint_hash, shard_paths
from .metrics import normalized_entropy, roc_auc
from .mfu.flops import executed_flops, model_flops
from .mfu.memory import track_peak_memory
from .mfu.meter import Meter, StepRecord, stopwatch
from .mfu.peak import DTYPE_NAMES, device_name, peak_flops
from .model import TASKS, GEMRef, ranking_loss
from .report import write_json

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


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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
    autocast_dtype: torch.dtype | None


def build_model(preset: Preset, train: TrainConfig, device: torch.device) -> tuple[nn.Module, str]:
    """GEMRef with the switches applied; returns it and the concrete attention kernel.

    Composition order: precision -> activation checkpointing -> compile -> FSDP.
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    probe = torch.empty(0, preset.model.n_heads, preset.model.head_dim, device=device, dtype=dtype)
    kernel = resolve_kernel(train.kernel, probe, preset.model.activation, True, None) if train.jagged \
        else "reference"
    torch.manual_seed(train.seed)
    model = GEMRef(preset.model, jagged=train.jagged, kernel=kernel).to(device)
    if train.ac == "full":
        apply_plan(model, {name: "full" for name in ac_blocks(model)})
    elif train.ac == "auto":   # profiled eagerly on a batch shaped like the preset's data
        batch = representative_batch(preset, train.batch_size, device, seed=train.seed)
        auto_checkpoint(model, batch, train.ac_budget, options=("full",) if train.compile else
                        ("selective", "full"), autocast_dtype=torch.bfloat16 if device.type == "cuda" else None)
    if train.compile:
        compile_model(model, activation_memory_budget=train.ac_budget if train.ac == "pt2" else None)
    return model, kernel


def make_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; embedding tables get no weight decay (rows a batch does not touch keep their values)."""
    tables = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    return torch.optim.AdamW([{"params": dense, "weight_decay": train.weight_decay},
                              {"params": tables, "weight_decay": 0.0}], lr=train.lr)


def setup(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
          data_root: str | Path | None = None, progress: bool = False) -> Setup:
    preset = get_preset(preset) if isinstance(preset, str) else preset
    train = train or preset.train
    dev = resolve_device(device)
    folder = dataset_dir(preset, data_root)
    ensure_dataset(preset.model, preset.data, folder, progress=progress)
    train_set = EventDataset(shard_paths(folder, "train"), preset.model)
    eval_set = EventDataset(shard_paths(folder, "eval"), preset.model)
    model, kernel = build_model(preset, train, dev)
    return Setup(preset, train, dev, model, make_optimizer(model, train), train_set, eval_set,
                 kernel, torch.bfloat16 if dev.type == "cuda" else None)


def forward_loss(s: Setup, batch: JaggedBatch) -> torch.Tensor:
    with torch.autocast(s.device.type, dtype=s.autocast_dtype, enabled=s.autocast_dtype is not None):
        logits = s.model(batch)
    with record_function("loss"):
        return loss_function(s.model)(logits, batch.labels)


def train_step(s: Setup, batch: JaggedBatch) -> torch.Tensor:
    """One optimisation step; returns the detached loss (no host sync)."""
    s.optimizer.zero_grad(set_to_none=True)
    loss = forward_loss(s, batch)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        s.optimizer.step()
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
        with torch.autocast(s.device.type, dtype=s.autocast_dtype, enabled=s.autocast_dtype is not None):
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


def _forever(loader) -> Iterator[JaggedBatch]:
    while True:
        yield from loader


def measure_step_memory(s: Setup, batch: JaggedBatch) -> dict:
    """Peak memory of one forward+backward (CPU: live tensor bytes, a separate slow pass)."""
    s.optimizer.zero_grad(set_to_none=True)
    with track_peak_memory(s.device) as peak:
        forward_loss(s, batch).backward()
    s.optimizer.zero_grad(set_to_none=True)
    return {"peak_memory_bytes": peak.bytes, "peak_memory_method": peak.method}


def run(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
        data_root: str | Path | None = None, json_path: str | Path | None = None,
        progress: bool = True, measure_memory: bool = True) -> dict:
    """Train and measure; return (and optionally write) the run record."""
    s = setup(preset, train, device=device, data_root=data_root, progress=progress)
    cfg, tc = s.preset.model, s.train
    dtype_name = "bf16" if s.autocast_dtype == torch.bfloat16 else DTYPE_NAMES[torch.float32]
    meter = Meter(peak_flops(s.device, dtype_name), warmup_steps=min(tc.warmup_steps, tc.steps - 1))
    loader = make_loader(s.train_set, tc.batch_size, seed=tc.seed, num_workers=tc.num_workers,
                         device=s.device)
    batches = _forever(loader)
    losses, evals = [], []
    bar = tqdm(range(tc.steps), desc=f"train {s.preset.name}", disable=not progress, unit="step")
    for step in bar:
        t0 = time.perf_counter()
        batch = next(batches)
        data_s = time.perf_counter() - t0
        lengths = batch.lengths
        with stopwatch(s.device) as elapsed:
            loss = train_step(s, batch.to(s.device, non_blocking=True))
        losses.append(float(loss))
        meter.record(StepRecord(elapsed[0], data_s, batch.batch_size, batch.num_tokens,
                                model_flops(cfg, lengths).total,
                                executed_flops(cfg, lengths, jagged=tc.jagged, kernel=s.kernel).total
                                + recompute_flops(cfg, lengths, applied_plan(s.model), jagged=tc.jagged,
                                                  kernel=s.kernel)))
        bar.set_postfix(loss=f"{losses[-1]:.4f}", step_s=f"{elapsed[0]:.3f}")
        if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.steps:
            evals.append({"step": step + 1, **evaluate(s, tc.eval_batches)})
    evals.append({"step": tc.steps, **evaluate(s, tc.eval_batches)})
    record = {
        "kind": "train",
        "preset": s.preset.name,
        "config": {"model": asdict(cfg), "data": asdict(s.preset.data), "train": asdict(tc)},
        "switches": {"jagged": tc.jagged, "kernel": tc.kernel, "kernel_resolved": s.kernel,
                     "compile": tc.compile, "ac": tc.ac, "ac_budget": tc.ac_budget},
        "compile": compile_stats(s.model).as_record() if compile_stats(s.model) else None,
        "ac_plan": plan_record(s.model),
        "hfu_counts_recompute": tc.ac != "pt2",   # PT2's partitioner recompute is not counted
        "device": {"type": s.device.type, "name": device_name(s.device),
                   "threads": torch.get_num_threads()},
        "dtype": "bf16-autocast" if s.autocast_dtype == torch.bfloat16 else "fp32",
        "versions": {"torch": torch.__version__, "gemref": __version__, "git_sha": git_sha()},
        "parameters": sum(p.numel() for p in s.model.parameters()),
        **meter.summary(),
        "loss_curve": losses,
        "eval": evals[-1],
        "eval_history": evals,
    }
    if measure_memory:
        record.update(measure_step_memory(s, batch.to(s.device)))
    if json_path:
        write_json(json_path, record)
    return record
