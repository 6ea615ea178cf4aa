"""Running `train.run` on several ranks: local spawned gloo/NCCL ranks, or this process as one
torchrun rank. The CLI, the waterfall, the benches and the notebooks start ranks through here.

    gemref train --ranks 4 --mesh 2x2 --sparse-sharding row --balance kk   (local gloo ranks)
    torchrun --nproc-per-node 8 -m gemref train --preset base --device cuda --jagged --kernel auto \
        --mesh 1x8 --sparse-sharding row --balance kk                      (one node of 8 GPUs)
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        -m gemref train --preset large --device cuda --jagged --kernel auto \
        --mesh 4x8 --sparse-sharding row --balance kk                      (HSDP: 4 nodes x 8 GPUs)
    add --backend ncclx to run the collectives on NCCLX (needs torchcomms)
"""
from __future__ import annotations

import json
import os

import torch

from .config import Preset, TrainConfig, parse_mesh
from .env import resolve_device
from .errors import user_input
from .parallel import comm, launch
from .parallel.mesh import check_world, local_device
from .report import to_jsonable
from .train import run


def _train_ranks(rank: int, world: int, preset: Preset, trains: list[TrainConfig], kwargs: dict):
    records = [run(preset, train, **kwargs) for train in trains]
    return [json.loads(json.dumps(to_jsonable(r))) for r in records] if rank == 0 else None


def launch_runs(preset: Preset, trains: list[TrainConfig], *, ranks: int | None = None, device: str = "auto",
                timeout_s: float = launch.DEFAULT_TIMEOUT_S, **run_kwargs) -> list[dict] | None:
    """Run `train.run` for each config in turn on the same ranks; return rank 0's records
    (None on torchrun ranks other than 0). One launch for several configs saves the start-up.

    Under torchrun (its variables set) this process is one rank; otherwise `ranks` local
    processes are spawned (default R*S of the first mesh). Meshes, world size and backend are
    all checked before any process group exists, so a bad input fails fast instead of hanging.
    """
    if not trains:
        raise ValueError("launch_runs needs at least one TrainConfig")
    with user_input():      # device, backend, mesh and world checks: a ValueError here is the user's
        dev = resolve_device(device)
        backends = {comm.resolve_backend(t.backend, dev) for t in trains}
        if len(backends) > 1:
            raise ValueError(f"one launch runs one backend; these configs ask for {sorted(backends)}")
        backend = backends.pop()
        shapes = [parse_mesh(t.mesh) for t in trains]
        torchrun = launch.torchrun_world()
        world = torchrun if torchrun is not None else shapes[0].world if ranks is None else ranks
        for shape in shapes:
            check_world(shape, world)
        if torchrun is None and dev.type == "cuda" and world > torch.cuda.device_count():
            raise ValueError(f"--ranks {world} needs {world} GPUs, this host has {torch.cuda.device_count()}")
        if torchrun is None and backend == "ncclx":
            raise ValueError("backend 'ncclx' is launched with torchrun (torchcomms bootstraps from its variables)")
    if torchrun is not None:
        launch.init_from_env(backend, local_device(dev.type), shapes[0], timeout_s)
        try:
            records = [run(preset, t, device=dev.type, **run_kwargs) for t in trains]
        finally:
            launch.shutdown()
        return records if int(os.environ["RANK"]) == 0 else None
    kwargs = {"device": dev.type, **run_kwargs}
    return launch.spawn(_train_ranks, world, (preset, list(trains), kwargs), backend=backend, timeout_s=timeout_s)[0]


def launch_train(preset: Preset, train: TrainConfig, **kwargs) -> dict | None:
    """`launch_runs` for one config: rank 0's record (None on other torchrun ranks)."""
    records = launch_runs(preset, [train], **kwargs)
    return records[0] if records is not None else None
