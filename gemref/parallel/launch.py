"""Starting ranks, the one launcher: this process, local spawned ranks, or a torchrun job.

Every multi-rank run (`gemref train --ranks`, the waterfall, the validation runs, the benches
that measure on ranks) goes `preflight(...)` -> `launch(fn, args, plan)`:

  * `preflight` is the one check of a launch, before any process or process group exists:
    the device, one backend for every config (gemref/parallel/backend.py), the world size
    against every config's mesh, the local device count (GPUs, or one-thread ranks per CPU
    core: gemref/options.py), and the transport (NCCLX bootstraps from torchrun's
    variables only). A problem is a UsageError in the user's terms.
  * `launch` runs fn(rank, world, *args) in this process when the plan is one rank (no
    process group), as this process's rank of a torchrun job, or on spawned local ranks,
    and returns rank 0's result (None on the other torchrun ranks).

Two ways in, one process group at the end:
  * `torchrun --nproc-per-node N -m gemref train --mesh RxS ...` sets RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT; `init_from_env` reads them (`torchrun_world()` says
    whether they are there).
  * `gemref train --ranks N` (and the tests, benches and notebooks) call `spawn(fn, N)`:
    N processes on this host, each with one CPU thread (OMP_NUM_THREADS=1), a process group
    on a free TCP port, and a timeout on every collective and on the whole run.

Nothing may hang: a rank that raises fails the call with that rank's error (a UsageError
stays a UsageError, so the CLI exits 2 with one line; a ValueError stays a ValueError, with
the rank's traceback in its message); a rank that dies kills the
others; past `timeout_s` every rank is killed and TimeoutError raised. Backends are
checked before any process starts (gemref/parallel/backend.py). Nothing outlives the call: each
spawned rank leads its own process group and dies with its parent (gemref/runtime/interrupt.py),
and however the call ends (an error, Ctrl-C, SIGTERM) every rank's group is killed and reaped.

A rank's stderr goes to a file in the launch's folder, which this process copies to its own
stderr as it grows (so the rank's warnings still show) and quotes its last lines when the
rank dies without a Python error (a C++ `std::terminate`, a signal): the message names the cause.

How a spawned rank ends: its result is written, its process group destroyed (`shutdown`), its
output flushed, and then it leaves with os._exit, skipping the interpreter's finalizer. Torch's
DTensor caches (redistribute planners, strategy caches: private, no way to empty them all) keep
the meshes of FSDP's parameters, hence their process groups, alive past destroy_process_group,
and with the groups their gloo worker threads. A worker that has just finished a collective
drops the work's tensors, whose Python objects need the GIL; when the main thread is already in
Py_Finalize, Python ends that thread inside the C++ destructor (pthread_exit's forced unwind
through a noexcept frame): `terminate called without an active exception`, SIGABRT. It hit
about one 2-rank validation run in twenty on a 2-core machine, a core dump shows the worker
(ProcessGroupGloo::AsyncWork::~AsyncWork -> decref -> take_gil -> PyThread_exit_thread). Once
the result is on disk a rank has nothing left that the finalizer would do. A rank that raised
exits the usual way (its error is on disk first, and is what the launch reports).
"""
from __future__ import annotations

import codecs
import datetime
import json
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..env import resolve_device
from ..errors import UsageError, user_input
from .backend import finalize_ncclx, init_ncclx, resolve_backend
from .config import MeshShape
from ..runtime.files import atomic_write_text
from ..runtime.interrupt import kill_group, own_group, starting_children
from .mesh import check_world, local_device, release_meshes

DEFAULT_TIMEOUT_S = 300.0
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_world() -> int | None:
    """WORLD_SIZE when launched by torchrun (all of its variables set), else None."""
    if all(v in os.environ for v in TORCHRUN_VARS):
        text = os.environ["WORLD_SIZE"]
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"WORLD_SIZE={text!r} (torchrun's environment) must be an integer >= 1")
        return int(text)
    return None


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def init_from_env(backend: str, device: torch.device, mesh_shape, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join torchrun's job (env://). `backend` is resolved and checked already (resolve_backend).

    nccl / gloo: init_process_group. ncclx: torchcomms builds NCCLX communicators per mesh
    dim and the DeviceMesh over them (init_ncclx; mesh.build_mesh then returns it).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "ncclx":
        init_ncclx(mesh_shape.replicate, mesh_shape.shard, device)
        return
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method="env://", timeout=_timeout(timeout_s), **kwargs)


def shutdown() -> None:
    """Release communicators (NCCLX sub-communicators first), gemref's cached meshes, then the
    process group."""
    release_meshes()
    finalize_ncclx()
    if dist.is_initialized():
        dist.destroy_process_group()


TRACKER_NOTICE = "ignore:resource_tracker:UserWarning"   # a PYTHONWARNINGS entry


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (a process the first spawn starts, with this
    environment) warns at exit about semaphores of children that were killed, which is every
    Ctrl-C/SIGTERM here (the ranks' process group is killed on purpose; the tracker then frees
    them itself): that one notice is turned off through PYTHONWARNINGS, which the tracker and
    the ranks read at start. Every other warning passes."""
    current = os.environ.get("PYTHONWARNINGS", "")
    if TRACKER_NOTICE not in current.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [current, TRACKER_NOTICE]))


def _rank_entry(rank: int, fn: Callable, world: int, port: int, backend: str, timeout_s: float,
                out_dir: str, args: tuple, parent: int) -> None:
    own_group(parent)
    out = Path(out_dir)
    _stderr_to(out / f"rank{rank}.stderr")
    os.environ.update(OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=_timeout(timeout_s))
        torch.save(fn(rank, world, *args), out / f"rank{rank}.pt")
    except BaseException as e:      # written before the group goes down, so the cause is first in time
        _record_error(out, rank, e)
        shutdown()
        raise
    shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)                     # the module doc: no finalizer beside gloo threads that outlive the group


def _record_error(out: Path, rank: int, e: BaseException) -> None:
    """Write rank `rank`'s error to `out`/rank<r>.err.json whole or not at all: the launcher may
    SIGTERM this rank mid-write (a peer died first), and a half-written record must never stand
    in for the peer's cause."""
    atomic_write_text(out / f"rank{rank}.err.json", json.dumps(
        {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc(), "time": time.time()}))


def _stderr_to(path: Path) -> None:
    """Point this process's fd 2 (Python's and C++'s stderr) at `path`, which the launcher relays."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


class _StderrRelay:
    """Copies what the ranks write to their stderr files onto this process's stderr, as it comes."""

    def __init__(self, out_dir: Path, world: int):
        self.paths = [out_dir / f"rank{r}.stderr" for r in range(world)]
        self.offsets = [0] * world
        # one decoder per rank: a character split across two reads is decoded whole
        self.decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(world)]

    def pump(self) -> None:
        for r, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[r])
                    data = f.read()
            except FileNotFoundError:          # the rank has not started yet
                continue
            if data:
                self.offsets[r] += len(data)
                sys.stderr.write(self.decoders[r].decode(data))
                sys.stderr.flush()

    def tail(self, rank: int, lines: int = 12) -> str:
        """The last `lines` lines rank `rank` wrote to stderr ('' if none)."""
        try:
            text = self.paths[rank].read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


def _rank_failure(out_dir: Path, processes: list, fallback: BaseException,
                  stderr_tail: Callable[[int], str] = lambda r: "") -> BaseException:
    """The cause of a failed launch: a rank that died without a Python error (killed, crashed,
    os._exit; quoted with the last lines it wrote to stderr), else the error raised first (later
    ones are ranks losing their peer). A UsageError stays a UsageError; a ValueError stays a
    ValueError carrying the rank's traceback."""
    errors = {r: json.loads(path.read_text()) for r in range(len(processes))
              if (path := out_dir / f"rank{r}.err.json").exists()}
    stopped_by_us = (0, None, -signal.SIGTERM, -signal.SIGKILL)
    died = [(r, p.exitcode) for r, p in enumerate(processes) if r not in errors and p.exitcode not in stopped_by_us]
    if died:
        r, code = died[0]
        tail = stderr_tail(r)
        said = f"; its last stderr lines:\n{tail}" if tail else "; it wrote nothing to stderr"
        return RuntimeError(f"rank {r} died with exit code {code} (no Python error); "
                            f"{len(errors)} other rank(s) then failed{said}")
    if not errors:
        return RuntimeError(f"a rank died: {fallback}")
    r, err = min(errors.items(), key=lambda item: (item[1]["time"], item[0]))
    if err["type"] == "UsageError":
        return UsageError(err["message"])
    if err["type"] == "ValueError":
        return ValueError(f"rank {r}: {err['message']}\n{err['traceback']}")
    return RuntimeError(f"rank {r} failed with {err['type']}: {err['message']}\n{err['traceback']}")


def spawn(fn: Callable[..., Any], world: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = DEFAULT_TIMEOUT_S) -> list:
    """Run fn(rank, world, *args) on `world` local ranks in a process group; return their results.

    `fn` must be importable (module level); its result must load with
    torch.load(weights_only=True) (tensors, numbers, strings, lists, dicts). Each rank has
    one CPU thread. `timeout_s` bounds every collective and the whole call.
    """
    if world < 1:
        raise ValueError(f"ranks must be >= 1, got {world}")
    with tempfile.TemporaryDirectory(prefix="gemref-ranks-") as tmp:
        out = Path(tmp)
        _quiet_resource_tracker()
        relay = _StderrRelay(out, world)
        ctx = None
        try:
            # A SIGINT/SIGTERM held back while the ranks start is raised as this block ends, after
            # `ctx` is bound, so the `finally` below kills the ranks: started outside this `try`,
            # they outlived an interrupt that came while a rank read its (large) arguments.
            with starting_children():
                ctx = mp.start_processes(_rank_entry, args=(fn, world, free_port(), backend, timeout_s, tmp, args,
                                                            os.getpid()), nprocs=world, join=False,
                                         start_method="spawn")
            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=0.5):
                relay.pump()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} ranks did not finish within {timeout_s:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            for p in ctx.processes:
                p.join(timeout=10)
            relay.pump()
            raise _rank_failure(out, ctx.processes, e, relay.tail) from None
        finally:
            for p in ctx.processes if ctx is not None else ():
                if p.exitcode is None:      # alive, not reaped: its pid (and group) is still its own
                    kill_group(p.pid)       # the group too: what the rank started (data workers)
            for p in ctx.processes if ctx is not None else ():
                p.join(timeout=10)
            relay.pump()
        return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch starts (checked by `preflight`)."""

    device: torch.device      # the device type every rank runs on (CUDA: each rank its LOCAL_RANK's GPU)
    backend: str              # resolved: gloo, nccl or ncclx
    world: int                # ranks
    torchrun: bool            # this process is one rank of a torchrun job
    mesh: MeshShape           # the first config's mesh (NCCLX builds its communicators from it)
    group: bool = False       # even one rank runs in a spawned process group (measurements on ranks)

    @property
    def in_process(self) -> bool:
        """One rank outside torchrun, no process group asked for: run in this process."""
        return self.world == 1 and not self.torchrun and not self.group


def preflight(device: str, backends: Sequence[str], meshes: Sequence[MeshShape], ranks: int | None = None, *,
              group: bool = False) -> LaunchPlan:
    """The one check of every launch (module doc). `ranks`: local ranks to spawn (None: the
    first mesh's R*S); under torchrun its WORLD_SIZE decides. `group`: spawn a process group
    even for one rank (its own process, one thread, as every spawned rank)."""
    if not meshes or len(backends) != len(meshes):
        raise ValueError("preflight needs one backend and one mesh per config, at least one")
    torchrun = torchrun_world()
    with user_input():      # every check here is about what the user asked for
        dev = resolve_device(device)
        resolved = {resolve_backend(b, dev) for b in backends}
        if len(resolved) > 1:
            raise ValueError(f"one launch runs one backend; these configs ask for {sorted(resolved)}")
        backend = resolved.pop()
        world = torchrun if torchrun is not None else meshes[0].world if ranks is None else ranks
        for shape in meshes:
            check_world(shape, world)
        if torchrun is None and (world > 1 or group):
            from ..options import check_local_ranks   # options loads the presets: only when spawning
            check_local_ranks(world, dev.type)
        if torchrun is None and backend == "ncclx":
            raise ValueError("backend 'ncclx' is launched with torchrun (torchcomms bootstraps from its variables)")
    return LaunchPlan(dev, backend, world, torchrun is not None, meshes[0], group)


def launch(fn: Callable[..., Any], args: tuple, plan: LaunchPlan, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """fn(rank, world, *args) as the plan says (module doc); rank 0's result, None on other
    torchrun ranks. `fn` must be importable (module level) when ranks are spawned."""
    if plan.in_process:
        return fn(0, 1, *args)
    if plan.torchrun:
        init_from_env(plan.backend, local_device(plan.device.type), plan.mesh, timeout_s)
        rank = int(os.environ["RANK"])
        try:
            out = fn(rank, plan.world, *args)
        finally:
            shutdown()
        return out if rank == 0 else None
    return spawn(fn, plan.world, args, backend=plan.backend, timeout_s=timeout_s)[0]


def cpu_ranks(ranks: int) -> LaunchPlan:
    """The plan of a measurement on `ranks` local one-thread gloo CPU ranks, each its own
    process in a process group, one rank included (the benches and validation runs that
    measure steps on ranks), through the same pre-flight check."""
    return preflight("cpu", ["gloo"], [MeshShape(1, ranks)], ranks, group=True)


def to_rank0(obj) -> list | None:
    """Every rank's `obj` on rank 0 (a list, by rank), None on the others; [obj] without a group."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out if dist.get_rank() == 0 else None
