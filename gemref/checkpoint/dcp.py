"""Distributed checkpoints: model, optimizer, data position and RNG, saved atomically with DCP,
owned by one run, and verified before anything in them is read.

TRUST: a checkpoint is code-equivalent input. torch.distributed.checkpoint's reader unpickles
`.metadata`, and unpickling can run arbitrary code, so resume only from checkpoints that you
(or someone you trust) wrote. The manifest below catches truncation, corruption, swapped
files and checkpoints of another run; it does not stop someone who can write the folder,
since they can write a matching manifest too.

Layout under a checkpoint folder D:

    D/owner.json             the run that owns D (its identity, below)
    D/step-00000020/         a complete checkpoint: DCP files (.metadata, *.distcp) + checkpoint.json
    D/.tmp-step-00000030/    a save in progress or one that crashed: never read, removed by the next save

A run's identity is its world size, global batch, seed, the names/shapes/dtypes of its model's
tensors and the caller's run description (gemref/train/loop.py `run_description`: preset, model and data configs,
the training fields that shape the trajectory). A run refuses a folder that another identity
owns, or that already holds this run's checkpoints at or past the step it would write (which a
fresh run would otherwise prune or shadow), unless told to `overwrite` (which deletes them).

Save (collective): every rank writes its shards into the temp folder; after a barrier rank 0
hashes every file and writes checkpoint.json (the step, the identity, each file's bytes and
sha256) atomically and last, then renames the temp folder to `step-N` (one atomic rename) and
fsyncs D. A crash at any point before the rename leaves only a temp folder; `latest_checkpoint`
sees only `step-N` folders that hold checkpoint.json.

Load (collective): rank 0 compares checkpoint.json's identity with this run's and every file's
size and sha256 with checkpoint.json (an unlisted or missing file fails too), and only then does
DCP read `.metadata` and the shards. Every mismatch is a one-line ValueError naming the file,
raised on every rank. Costs one read of every file on rank 0 per save and per load.

Resuming reproduces the uninterrupted run exactly: parameters, AdamW state and the tables'
row-wise optimizer state (gemref/parallel/rowwise.py `row_state_dict`, saved under "row_optim",
placed and resharded like the weights, with its step count) come back bit for bit, the data
position is the global step (the batch samplers are deterministic functions of seed, epoch and
step), and each rank's torch CPU RNG state is restored. No CUDA RNG state is kept: the model
draws no random numbers while training (no dropout).
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict

from ..errors import UsageError
from ..parallel.rowwise import load_row_state_dict, row_state_dict
from .folder import (checkpoint_path, claim_folder, complete_checkpoints, fsync_dir, latest_checkpoint,
                     remove_checkpoint, resume_checkpoint, verify_checkpoint, write_manifest)

__all__ = ["save_checkpoint", "load_checkpoint", "start_from_checkpoint", "claim_checkpoint_dir", "run_identity",
           "latest_checkpoint", "resume_checkpoint", "checkpoint_path", "verify_checkpoint"]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _on_rank0(fn: Callable[[], None]) -> None:
    """Run fn on rank 0; a ValueError there is raised on every rank as a UsageError (a bad checkpoint
    folder is the user's input), so no rank waits forever."""
    error = None
    if _rank() == 0:
        try:
            fn()
        except ValueError as e:
            error = str(e)
    if dist.is_initialized():
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise UsageError(error)


@contextmanager
def _dcp_single_process_ok():
    """DCP warns whenever it runs without a process group; one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def run_identity(model: nn.Module, *, global_batch: int, seed: int, run: dict | None = None) -> dict:
    """What a checkpoint folder belongs to (JSON): world, global batch, seed, tensors, run description."""
    tensors = {name: [list(t.shape), str(t.dtype).removeprefix("torch.")]
               for name, t in get_model_state_dict(model).items() if isinstance(t, torch.Tensor)}
    return json.loads(json.dumps({"world_size": _world(), "global_batch": global_batch, "seed": seed,
                                  "run": run or {}, "tensors": tensors}))


def claim_checkpoint_dir(root: str | Path, model: nn.Module, *, global_batch: int, seed: int,
                         run: dict | None = None, overwrite: bool = False) -> None:
    """Collective, before a fresh run trains: take `root` for this run (see the module docstring)."""
    identity = run_identity(model, global_batch=global_batch, seed=seed, run=run)
    _on_rank0(lambda: claim_folder(Path(root), identity, overwrite, step=0))
    _barrier()


def save_checkpoint(root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    global_batch: int, seed: int, keep: int = 2, run: dict | None = None,
                    overwrite: bool = False) -> Path:
    """Collective: every rank calls it after `step` optimizer steps. Returns the final folder."""
    root = Path(root)
    tmp, final = root / f".tmp-step-{step:08d}", checkpoint_path(root, step)
    identity = run_identity(model, global_batch=global_batch, seed=seed, run=run)
    _on_rank0(lambda: claim_folder(root, identity, overwrite, step))
    if _rank() == 0:
        for stale in [*root.glob(".tmp-step-*"), *root.glob(".trash-*")]:
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step),
             f"rng.rank{_rank()}": torch.get_rng_state()} | _row_optim(model)
    with _dcp_single_process_ok():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True), no_dist=not dist.is_initialized())
    _barrier()
    if _rank() == 0:
        write_manifest(tmp, step, identity)      # last: its presence marks the checkpoint complete
        os.replace(tmp, final)
        fsync_dir(root)
        complete = complete_checkpoints(root)
        for _, old in complete[:-keep] if keep > 0 else []:
            remove_checkpoint(old)
    _barrier()
    return final


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    global_batch: int, seed: int, run: dict | None = None) -> int:
    """Collective: verify a checkpoint folder, then load it into model and optimizer (in place);
    return its step."""
    path = Path(path)
    identity = run_identity(model, global_batch=global_batch, seed=seed, run=run)
    _on_rank0(lambda: verify_checkpoint(path, identity))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rng_key = f"rng.rank{_rank()}"
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0), rng_key: torch.get_rng_state()}
    state |= _row_optim(model)
    with _dcp_single_process_ok():
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if "row_optim" in state:
        load_row_state_dict(model, state["row_optim"])
    torch.set_rng_state(state[rng_key])
    return int(state["step"])


def _row_optim(model: nn.Module) -> dict:
    """{"row_optim": the tables' row-wise optimizer state} when the model has any, else {} (a model
    trained by AdamW alone writes the same checkpoint as before)."""
    rows = row_state_dict(model)
    return {"row_optim": rows} if rows else {}


def start_from_checkpoint(root: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                          global_batch: int, seed: int, resume: bool, run: dict | None = None,
                          overwrite: bool = False) -> int:
    """Collective, before the first step: when resuming, load the newest complete checkpoint under
    `root` and return its step; else claim `root` for this run and return 0."""
    if resume and overwrite:
        raise UsageError("resume and overwrite contradict each other: resuming keeps the checkpoints")
    if not resume:
        claim_checkpoint_dir(root, model, global_batch=global_batch, seed=seed, run=run, overwrite=overwrite)
        return 0
    _, path = resume_checkpoint(root)
    return load_checkpoint(path, model, optimizer, global_batch=global_batch, seed=seed, run=run)
