"""The waterfall's measurement on each rank: every rung alive, interleaved windows, a profiled step.

Built from gemref.train's public pieces (setup, Setup.timed_step, measure_step_memory) rather
than measure.run: a rung here is a live Setup with its own batch iterator, so the rungs can
take turns window by window (gemref/waterfall/schedule.py). A window is `steps_per_window`
timed steps, each timed by the one step timer (gemref/mfu/timing.py, as `gemref train`
times its steps). Per rank the program is

    peaks (rank 0)  ->  which rungs are alive together (schedule.groups, from the training
    state bytes and the free memory)  ->  per group: build + warm up its rungs, run the
    interleaved rounds, profile one step and measure the step memory of each new rung

and rank 0 returns every rank's windows as plain data (gemref/waterfall/__init__.py turns
them into rows). A window's clock is the sum of its steps' (batch fetch + step), so it holds
only fetching batches and training steps (FLOPs are counted after each step's clock stops).
Before each window every rung takes `window_warmup` untimed steps (its caches were cold while
the other rungs ran) and, on several ranks, the ranks meet at a barrier so their windows
line up. The ranks start through the one launcher (gemref/parallel/launch.py).
"""
from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..train.presets import Preset
from ..train.config import TrainConfig
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..env import resolve_device
from ..interop.lib import quiet_torchrec
from ..mfu.meter import gemm_dtype
from ..mfu.op_classes import COMPUTE
from ..mfu.op_profile import OpProfile, account, profile_op_classes
from ..mfu.peak import peak_flops
from ..mfu.timing import StepRecord
from ..parallel import launch
from ..parallel.memory import projected_rank_bytes
from ..parallel.mesh import local_device
from ..report.records import precision_label
from ..train import Setup, resolve_precision, setup
from ..measure.run import measure_step_memory, plan_record
from . import schedule
from .schedule import Window


@dataclass(frozen=True)
class Settings:
    windows: int = 3             # timed windows per rung (rounds)
    steps_per_window: int = 4
    warmup: int = 2              # untimed steps per rung after it is built (compilation happens here)
    window_warmup: int = 1       # untimed steps of a rung right before each of its windows
    max_retries: int = 3         # re-measured rounds over the whole run (contention)
    profile_steps: int = 1       # profiled steps per rung for the breakdown (0: none)
    measure_memory: bool = True  # the peak memory of one step per rung (CPU: a slow tracking pass)


def run_delay_s() -> float | None:
    """This thread's run-queue wait so far (seconds, Linux schedstat), None where not exposed."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def free_bytes(device: torch.device) -> float:
    """Free memory for this rank: the GPU's free bytes, or the host's available bytes / local ranks."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return available / int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size() if dist.is_initialized() else 1))


def dtype_name(train: TrainConfig, device: torch.device) -> str:
    """The dtype whose peak a rung's MFU is measured against (gemref/mfu/meter.py `gemm_dtype`;
    float8/MXFP8 on a CPU are always emulated, in fp32)."""
    emulated = device.type == "cpu" or train.mixed_precision.kernel == "emulated"
    return gemm_dtype(resolve_precision(train, device), device.type, emulated)


def profile_seconds(profile: OpProfile) -> dict[str, float]:
    """A rung's seconds per step by op class for the breakdown (gemref/waterfall/stats.py): the
    one account of gemref/mfu/op_profile.py (the profiler's own cost out, the untraced time in
    "other"; `gemref bench step_profile` gives the same), with "compute_per_step_s", the sum of
    the compute classes (a GPU rank's compute seconds)."""
    seconds = account(profile).seconds
    return seconds | {"compute_per_step_s": sum(seconds[c] for c in COMPUTE)}


class Rung:
    """One live rung on this rank: its Setup and its endless batch iterator."""

    def __init__(self, preset: Preset, train: TrainConfig, device: str):
        self.s: Setup = setup(preset, train, device=device)
        self.batches = iter(make_loader(self.s.train_set, batch_sampler=StepBatches(self.s.sampler, 0),
                                        num_workers=train.num_workers, device=self.s.device))

    def step(self) -> StepRecord:
        """One timed training step (gemref/mfu/timing.py timed_step)."""
        return self.s.timed_step(lambda: next(self.batches))[0]

    def window(self, rung: int, k: int, attempt: int, settings: Settings) -> Window:
        for _ in range(settings.window_warmup):
            self.step()
        if self.s.parallel:
            dist.barrier()
        delay0 = run_delay_s()
        steps = [self.step() for _ in range(settings.steps_per_window)]
        delay = run_delay_s()
        return Window(rung, k, attempt, steps, None if delay0 is None or delay is None else delay - delay0,
                      self.s.device.type, torch.get_num_threads(), self.s.world)

    def profile(self, steps: int) -> dict[str, float]:
        """Seconds per step by op class of `steps` profiled steps on one batch (profile_seconds)."""
        batch = next(self.batches).to(self.s.device)
        return profile_seconds(profile_op_classes(lambda: self.s.step(batch), steps, self.s.device))

    def memory(self) -> dict:
        return measure_step_memory(self.s, next(self.batches).to(self.s.device))

    def info(self) -> dict:
        """What the rung's config resolved to on this rank: kernel, precision, the applied AC plan, the mesh."""
        s = self.s
        return {"resolved": {"kernel": s.kernel, "precision": s.precision.precision},
                "dtype": precision_label(s.precision), "ac_plan": plan_record(s.model),
                "mesh": s.train.parallelism.mesh}


def _everyone(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def measure(preset: Preset, trains: list[TrainConfig], device: str, settings: Settings) -> dict | None:
    """The rank program (module doc); rank 0 returns plain data, the other ranks None."""
    dev = resolve_device(device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    peaks = {d: asdict(peak_flops(dev, d)) for d in sorted({dtype_name(t, dev) for t in trains})} if rank == 0 else {}
    state = [projected_rank_bytes(preset.model, t.parallelism.shape, t.parallelism.sparse_sharding,
                                  table_optimizer=t.parallelism.table_optimizer)["total"] for t in trains]
    free = min(_everyone(free_bytes(local_device(dev.type))))
    plan = schedule.groups(state, free)
    alive: dict[int, Rung] = {}
    rounds, profiles, memory, info, retries = [], {}, {}, {}, [settings.max_retries]
    for g, members in enumerate(plan):
        for i in [i for i in alive if i not in members]:
            del alive[i]
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        for i in members:
            if i not in alive:
                alive[i] = Rung(preset, trains[i], device)
                info[i] = alive[i].info()
                for _ in range(settings.warmup):
                    alive[i].step()
        for r in schedule.run_rounds(members, settings.windows,
                                     lambda i, k, a: alive[i].window(i, k, a, settings),
                                     _everyone, retries, g):
            rounds.append({"group": r.group, "index": r.index, "attempt": r.attempt, "kept": r.kept,
                           "windows": [[asdict(w) for w in ranks] for ranks in r.windows]})
        for i in members:
            if i not in profiles:
                profiles[i] = _everyone(alive[i].profile(settings.profile_steps)) if settings.profile_steps else None
                memory[i] = _everyone(alive[i].memory()) if settings.measure_memory else None
    alive.clear()
    if rank != 0:
        return None
    return {"peaks": peaks, "groups": plan, "state_bytes": state, "free_bytes": free, "rounds": rounds,
            "profiles": [profiles[i] for i in range(len(trains))], "memory": [memory[i] for i in range(len(trains))],
            "info": [info[i] for i in range(len(trains))],
            "retries_used": settings.max_retries - retries[0], "schedstat": run_delay_s() is not None,
            "world": dist.get_world_size() if dist.is_initialized() else 1, "threads_per_rank": torch.get_num_threads()}


def _rank(rank: int, world: int, preset: Preset, trains: list[TrainConfig], device: str, settings: Settings):
    with quiet_torchrec() if any(t.embedding_tables.engine == "torchrec" for t in trains) else contextlib.nullcontext():
        return measure(preset, trains, device, settings)


def launch_measure(preset: Preset, trains: list[TrainConfig], *, ranks: int, device: str, settings: Settings,
                   timeout_s: float) -> dict | None:
    """`measure` on the ranks of the one launcher (gemref/parallel/launch.py: in this process for
    one rank, as one torchrun rank, or on `ranks` spawned local ranks), checked before any
    process group exists. Rank 0's result; None on other torchrun ranks."""
    plan = launch.preflight(device, [t.parallelism.backend for t in trains], [t.parallelism.shape for t in trains], ranks)
    return launch.launch(_rank, (preset, trains, plan.device.type, settings), plan, timeout_s=timeout_s)
