"""The launcher's rank lifecycle: a rank's stderr reaches the caller, a rank that dies in C++ is
quoted with what it wrote, and the FSDP launch path ends without a rank death, run after run.

The regression case (gemref/parallel/launch.py, module doc): gloo worker threads that outlive
destroy_process_group were ended by Python's finalizer inside a C++ destructor, and the rank
died of SIGABRT about once in twenty 2-rank runs. These tests run under pytest's output capture,
where that was seen.
"""
import ctypes
from pathlib import Path

import pytest
import torch

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.parallel.launch import spawn
from gemref.parallel.mesh import _meshes, build_mesh, release_meshes

pytestmark = pytest.mark.multiproc
TINY = get_preset("tiny")
RUNS = 20


def _write_then_terminate(rank, world):
    import os
    import torch.distributed as dist

    if rank == 1:
        os.write(2, b"rank 1 about to call std::terminate\n")
        ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev()      # C++'s std::terminate(): prints, then aborts
    dist.barrier()                                             # rank 0 waits until the launcher stops it


def test_a_rank_dead_in_cpp_is_reported_with_its_last_stderr_lines():
    with pytest.raises(RuntimeError) as caught:
        spawn(_write_then_terminate, 2, timeout_s=60)
    message = str(caught.value)
    assert "rank 1 died with exit code -6 (no Python error)" in message
    assert "rank 1 about to call std::terminate" in message
    assert "terminate called without an active exception" in message      # libstdc++'s own words


def _say(rank, world):
    import sys

    print(f"a warning from rank {rank}", file=sys.stderr)
    return rank


def test_what_ranks_write_to_stderr_reaches_the_caller(capfd):
    assert spawn(_say, 2, timeout_s=60) == [0, 1]
    err = capfd.readouterr().err
    assert "a warning from rank 0" in err and "a warning from rank 1" in err


def test_a_rank_that_writes_nothing_is_reported_as_silent():
    from gemref.parallel.launch import _rank_failure

    class Dead:
        exitcode = -11             # SIGSEGV: not one of the launcher's own stops
    err = _rank_failure(Path("/nonexistent"), [Dead()], RuntimeError("x"))
    assert "rank 0 died with exit code -11" in str(err) and "wrote nothing to stderr" in str(err)


def test_a_rank_killed_while_recording_its_error_leaves_no_half_record(tmp_path):
    """The CI failure this guards: a peer died, the launcher SIGTERMed the rank mid-write, and
    the launcher read an empty rank0.err.json. A file-size limit of 0 stops the writer at its
    first byte (EFBIG; the old write_text left an empty file there): the record is then absent,
    never empty."""
    import subprocess
    import sys

    code = ("import resource, pathlib; from gemref.parallel.launch import _record_error; "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)); "
            f"_record_error(pathlib.Path({str(tmp_path)!r}), 0, ValueError('peer lost'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert b"File too large" in done.stderr, done.stderr
    assert not (tmp_path / "rank0.err.json").exists()


def test_a_recorded_error_is_what_the_launcher_reports(tmp_path):
    from gemref.parallel.launch import _rank_failure, _record_error

    class Stopped:
        exitcode = 1

    try:
        raise ValueError("bad rows in shard 3")
    except ValueError as e:
        _record_error(tmp_path, 0, e)
    err = _rank_failure(tmp_path, [Stopped()], RuntimeError("x"))
    assert isinstance(err, ValueError) and "rank 0: bad rows in shard 3" in str(err)


def _fsdp_steps_then_gather(rank, world):
    """The validation runs' ending: FSDP + row-sharded tables, steps, then an object all-gather
    (its gloo work is what a worker thread was still releasing when the rank died)."""
    import torch.distributed as dist

    from gemref.data.loader import make_loader
    from gemref.data.sampler import StepBatches
    from gemref.train import setup

    train = override(TINY.train, steps=2, warmup_steps=1, batch_size=32, mesh="1x2", sparse_sharding="row",
                     jagged=True, kernel="auto", balance="kk")
    s = setup(TINY, train, device="cpu")
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0)))
    losses = [float(s.step(next(batches))) for _ in range(train.steps)]
    gathered = [None] * world
    dist.all_gather_object(gathered, losses)
    return gathered


@pytest.mark.slow
def test_the_fsdp_launch_path_ends_cleanly_twenty_times_in_a_row(data_root):
    for run in range(RUNS):
        out = spawn(_fsdp_steps_then_gather, 2, timeout_s=120)       # a rank death raises RuntimeError
        assert out[0] == out[1] and len(out[0]) == 2, run              # both ranks saw every rank's losses
        assert all(torch.isfinite(torch.tensor(losses)).all() for losses in out[0]), run


def _mesh_after_a_new_group(rank, world):
    import torch.distributed as dist

    from gemref.parallel.config import MeshShape
    from gemref.parallel.launch import free_port, shutdown

    first = build_mesh(MeshShape(1, world), "cpu")
    port = [free_port()]
    dist.broadcast_object_list(port, src=0)            # the next group's address, agreed on
    shutdown()
    assert not _meshes, "shutdown forgets the cached meshes"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port[0]}", rank=rank, world_size=world)
    second = build_mesh(MeshShape(1, world), "cpu")
    dist.all_reduce(torch.ones(1), group=second.get_group("shard"))      # the new mesh's groups work
    return second is not first


def test_a_mesh_is_never_reused_over_a_destroyed_process_group():
    assert spawn(_mesh_after_a_new_group, 2, timeout_s=60) == [True, True]


def test_release_meshes_empties_the_cache_without_a_process_group():
    _meshes[("stale",)] = object()
    release_meshes()
    assert not _meshes


def _sleep(rank, world):
    import time

    time.sleep(120)


def test_an_interrupt_held_back_while_ranks_start_still_kills_them(monkeypatch):
    """SIGTERM sent while the ranks start (signals held back: a rank still reading large
    arguments) is raised as the start ends: the ranks must die with the call, not keep the parent
    waiting for them at exit (a CI hang of `bench balance --measure`)."""
    import os
    import signal

    from gemref.parallel import launch
    from gemref.runtime.interrupt import Interrupted, signals_raise

    started, real = [], launch.mp.start_processes

    def start_then_signal(*args, **kwargs):
        ctx = real(*args, **kwargs)
        started.append(ctx)
        os.kill(os.getpid(), signal.SIGTERM)        # held back until starting_children() ends
        return ctx

    monkeypatch.setattr(launch.mp, "start_processes", start_then_signal)
    with pytest.raises(Interrupted):
        with signals_raise():
            spawn(_sleep, 2, timeout_s=60)
    assert [p.exitcode for p in started[0].processes] == [-9, -9]
