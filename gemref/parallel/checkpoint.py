"""Distributed checkpoints: model, optimizer, data position and RNG, saved atomically with DCP.

Layout under a checkpoint folder D:

    D/step-00000020/     a complete checkpoint (torch.distributed.checkpoint files + .metadata)
    D/.tmp-step-00000030/ a save in progress (or one that crashed): never read

Every rank writes its own shards (FSDP's parameter and optimizer shards, the sharded
tables as DTensors, its RNG state) into the temp folder; after a barrier rank 0 renames it
to `step-N` (one atomic rename) and fsyncs the folder. A crash at any point before the
rename leaves only a temp folder, so `latest_checkpoint` still finds the previous one.

Resuming reproduces the uninterrupted run exactly: parameters and AdamW state come back
bit for bit, the data position is the global step (the batch samplers are deterministic
functions of seed, epoch and step, so the run continues with the same batches), and each
rank's torch RNG state is restored. The checkpoint also stores (world size, global batch,
seed); resuming with different values is a ValueError. Loading goes through DCP only
(no unpickling of arbitrary objects: every stored value is a tensor).
"""
from __future__ import annotations

import os
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

_STEP_DIR = re.compile(r"^step-(\d{8})$")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextmanager
def _dcp_single_process_ok():
    """DCP warns whenever it runs without a process group; one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def latest_checkpoint(root: str | Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint under `root`, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / ".metadata").exists()]
    return max(found) if found else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _run_key(global_batch: int, seed: int) -> torch.Tensor:
    return torch.tensor([_world(), global_batch, seed], dtype=torch.int64)


def save_checkpoint(root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    global_batch: int, seed: int, keep: int = 2) -> Path:
    """Collective: every rank calls it after `step` optimizer steps. Returns the final folder."""
    root = Path(root)
    tmp, final = root / f".tmp-step-{step:08d}", checkpoint_path(root, step)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step),
             "run": _run_key(global_batch, seed), f"rng.rank{_rank()}": torch.get_rng_state()}
    with _dcp_single_process_ok():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True), no_dist=not dist.is_initialized())
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        complete = sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name))
        for old in complete[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    global_batch: int, seed: int) -> int:
    """Collective: load a checkpoint folder into model and optimizer (in place); return its step."""
    path = Path(path)
    if not (path / ".metadata").exists():
        raise ValueError(f"{path}: not a complete checkpoint (no .metadata)")
    run = {"run": torch.zeros(3, dtype=torch.int64)}
    with _dcp_single_process_ok():   # who wrote it, before touching the model
        dcp.load(run, checkpoint_id=path, no_dist=not dist.is_initialized())
    expected = _run_key(global_batch, seed)
    if not torch.equal(run["run"], expected):
        names = ("world_size", "global_batch", "seed")
        raise ValueError(f"{path} was written by a run with {dict(zip(names, run['run'].tolist()))}; this run has "
                         f"{dict(zip(names, expected.tolist()))}: resuming needs the same")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rng_key = f"rng.rank{_rank()}"
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0), rng_key: torch.get_rng_state()}
    with _dcp_single_process_ok():
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.set_rng_state(state[rng_key])
    return int(state["step"])
