"""gemref.parallel without process groups: mesh specs, plans, analytic volume, cost model, errors."""
import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.sampler import StepBatches
from gemref.train import batch_sampler
from gemref.model.gem import GEMRef
from gemref.measure import comm
from gemref.parallel import backend
from gemref.simulate.collectives import LinkTier, collective_time
from gemref.simulate.cost_model import HARDWARE, get_profile, group_tier
from gemref.parallel.config import MeshShape, parse_mesh
from gemref.parallel.mesh import check_world
from gemref.parallel.sparse import plan_tables
from gemref.parallel.volume import lookups, model_units, padded_numel, step_volume, table_shapes

TINY = get_preset("tiny")
SETTINGS = settings(max_examples=30, deadline=None)


# ----------------------------------------------------------------------------- mesh and config


@pytest.mark.parametrize("spec, shape", [("1x4", (1, 4)), ("2x2", (2, 2)), (" 4 X 1 ", (4, 1))])
def test_parse_mesh(spec, shape):
    m = parse_mesh(spec)
    assert (m.replicate, m.shard) == shape and m.world == shape[0] * shape[1]
    assert [m.coordinates(r) for r in range(m.world)] == [(r // shape[1], r % shape[1]) for r in range(m.world)]


@pytest.mark.parametrize("spec", ["2x", "0x4", "2*2", "x", "-1x2", "2x2x2"])
def test_bad_mesh_specs_are_value_errors(spec):
    with pytest.raises(ValueError, match="mesh=.* must look like RxS"):
        parse_mesh(spec)
    with pytest.raises(ValueError, match="must look like RxS"):
        override(TINY.train, mesh=spec)


def test_mesh_must_match_world_size():
    check_world(MeshShape(2, 2), 4)
    with pytest.raises(ValueError, match=r"mesh=2x2 needs R\*S = 4 ranks, but the world size is 3"):
        check_world(MeshShape(2, 2), 3)


@pytest.mark.parametrize("field, value, valid", [("balance", "greedy", "none, lpt, kk, local"),
                                                 ("sparse_sharding", "column", "none, row, table"),
                                                 ("backend", "mpi", "auto, gloo, nccl, ncclx")])
def test_bad_switch_values_list_the_valid_ones(field, value, valid):
    with pytest.raises(ValueError, match=f"{field}='{value}'; valid: {valid}"):
        override(TINY.train, **{field: value})


def test_checkpoint_switches_need_a_folder():
    with pytest.raises(ValueError, match="need checkpoint_dir"):
        override(TINY.train, checkpoint_every=2)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0"):
        override(TINY.train, checkpoint_every=-1, checkpoint_dir="x")


# ----------------------------------------------------------------------------- backends


def test_backend_choice_before_any_process_group():
    assert backend.resolve_backend("auto", "cpu") == "gloo"
    assert backend.resolve_backend("gloo", "cpu") == "gloo"
    with pytest.raises(ValueError, match="backend='tcp'; valid: auto, gloo, nccl, ncclx"):
        backend.resolve_backend("tcp", "cpu")
    with pytest.raises(ValueError, match="backend 'nccl' needs --device cuda"):
        backend.resolve_backend("nccl", "cpu")
    with pytest.raises(ValueError, match="backend 'ncclx' needs --device cuda"):
        backend.resolve_backend("ncclx", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPUs")
def test_cuda_backends_without_gpus_say_why():
    with pytest.raises(ValueError, match="torch.cuda.is_available\\(\\) is False"):
        backend.resolve_backend("nccl", "cuda")


def test_ncclx_without_torchcomms_says_how_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="needs the torchcomms package.*pip install --pre torchcomms"):
        backend.resolve_backend("ncclx", "cuda")


def gemref(*args):
    return subprocess.run([sys.executable, "-m", "gemref", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--ranks", "3", "--mesh", "2x2"], "mesh=2x2 needs R*S = 4 ranks, but the world size is 3"),
    (["--mesh", "2x2"], "--mesh 2x2 needs 4 ranks: add --ranks 4"),
    (["--ranks", "2", "--backend", "ncclx"], "backend 'ncclx' needs --device cuda"),
    (["--ranks", "2", "--device", "cpu", "--backend", "nccl"], "backend 'nccl' needs --device cuda"),
])
def test_cli_bad_launch_exits_2_before_spawning(args, message, data_root):
    r = gemref("train", "--preset", "tiny", "--steps", "2", "--quiet", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- sparse plans


@SETTINGS
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.tuples(st.integers(1, 300), st.sampled_from([4, 8])),
                       min_size=1), st.integers(1, 6), st.sampled_from(["row", "table"]))
def test_plans_cover_every_row_exactly_once(tables, shards, mode):
    plans = plan_tables(tables, shards, mode)
    assert list(plans) == list(tables)
    for name, plan in plans.items():
        ranges = [plan.row_range(s, shards) for s in range(shards)]
        held = sorted(r for a, b in ranges for r in range(a, b))
        assert held == list(range(tables[name][0])), (name, ranges)
        ids = torch.arange(tables[name][0])
        owners = plan.owner_of(ids, shards)
        for s, (a, b) in enumerate(ranges):
            assert bool((owners[a:b] == s).all())
    if mode == "table":
        loads = [sum(p.local_bytes(s, shards) for p in plans.values()) for s in range(shards)]
        biggest = max(r * d * 4 for r, d in tables.values())
        assert max(loads) <= sum(loads) / shards + biggest       # LPT: within one table of the mean


def test_row_plan_matches_dtensor_chunks():
    plan = plan_tables({"t": (10, 4)}, 4, "row")["t"]
    chunks = [c.shape[0] for c in torch.arange(10).chunk(4)] + [0]
    assert [b - a for a, b in (plan.row_range(s, 4) for s in range(4))] == chunks[:4]
    with pytest.raises(ValueError, match="sparse_sharding='none' has no plan"):
        plan_tables({"t": (10, 4)}, 4, "none")


# ----------------------------------------------------------------------------- analytic volume


def test_padded_numel():
    assert padded_numel((10, 3), 4) == 12 * 3
    assert padded_numel((8,), 4) == 8


def test_volume_of_fsdp_counts_units_and_gathers():
    units = model_units(TINY.model)
    assert set(units) == {"root", "layers.0", "layers.1"}
    rows = {(r["kind"], r["dim"]): r for r in step_volume(TINY.model, MeshShape(1, 4), batch=16, tokens=200,
                                                          jagged=True)}
    assert set(rows) == {("all_gather", "shard"), ("reduce_scatter", "shard")}
    assert rows[("all_gather", "shard")]["count"] == 3 + 2          # forward: 3 units; backward: 2 layers again
    assert rows[("reduce_scatter", "shard")]["count"] == 3
    no_reshard = step_volume(TINY.model, MeshShape(1, 4), batch=16, tokens=200, jagged=True,
                             reshard_after_forward=False)
    assert next(r for r in no_reshard if r["kind"] == "all_gather")["count"] == 3
    params = sum(p.numel() for p in GEMRef(TINY.model).parameters())
    assert rows[("reduce_scatter", "shard")]["bytes"] == pytest.approx(4 * params, rel=0.01)


def test_volume_of_hsdp_and_sparse():
    rows = step_volume(TINY.model, MeshShape(2, 2), batch=16, tokens=200, jagged=True, sparse_sharding="row")
    kinds = {(r["kind"], r["dim"]) for r in rows}
    assert kinds == {("all_gather", "shard"), ("reduce_scatter", "shard"), ("all_reduce", "replicate"),
                     ("all_to_all", "shard")}
    a2a = next(r for r in rows if r["kind"] == "all_to_all")
    calls = lookups(TINY.model, 16, 200, True)
    assert a2a["count"] == 4                      # one fused exchange: counts, ids, rows; row grads
    d = TINY.model.d_model
    assert a2a["bytes"] == 2 * len(calls) * 8 + sum(8 * n + 2 * n * d * 4 for _, n in calls)
    synced = {r["kind"]: r for r in step_volume(TINY.model, MeshShape(2, 2), batch=16, tokens=200, jagged=True,
                                                sparse_sharding="row")}["all_reduce"]["bytes"]
    held = sum(p.local_bytes(0, 2) for p in plan_tables(table_shapes(TINY.model), 2, "row").values())
    for interval, (optimizer, state) in itertools.product((1, 10), (("rowwise_adagrad", 1), ("rowwise_adam", d + 1))):
        rowwise = {r["kind"]: r for r in step_volume(TINY.model, MeshShape(2, 2), batch=16, tokens=200, jagged=True,
                                                     sparse_sharding="row", table_optimizer=optimizer,
                                                     table_sync_interval=interval)}["all_reduce"]
        assert rowwise["bytes"] == pytest.approx(synced - held + held * (d + state) / d / interval)   # weights + state
    replicated = step_volume(TINY.model, MeshShape(4, 1), batch=16, tokens=200, jagged=True)
    assert [(r["kind"], r["dim"]) for r in replicated] == [("all_reduce", "replicate")]   # Wx1 = DDP
    assert set(table_shapes(TINY.model)) == set(dict(calls))


# ----------------------------------------------------------------------------- cost model

LINK = LinkTier("test", alpha_s=1e-5, bandwidth_bytes_per_s=1e9, source="test")


def test_collective_formulas():
    B = 1e8
    assert collective_time("all_gather", B, 1, LINK) == 0.0
    assert collective_time("all_gather", B, 4, LINK) == pytest.approx(3e-5 + 0.75 * 0.1)
    assert collective_time("reduce_scatter", B, 4, LINK) == collective_time("all_gather", B, 4, LINK)
    assert collective_time("all_reduce", B, 4, LINK, "ring") == pytest.approx(6e-5 + 1.5 * 0.1)
    assert collective_time("all_reduce", B, 4, LINK, "tree") == pytest.approx(4e-5 + 0.2)
    small = 1e3    # latency-bound: the tree's log2(n) hops beat the ring's n-1 at large n
    assert collective_time("all_reduce", small, 1024, LINK, "auto") == collective_time("all_reduce", small, 1024,
                                                                                         LINK, "tree")
    with pytest.raises(ValueError, match="unknown collective kind"):
        collective_time("gossip", B, 4, LINK)
    with pytest.raises(ValueError, match="algorithm='mesh'"):
        collective_time("all_reduce", B, 4, LINK, "mesh")


def test_tiers_follow_the_mesh_layout():
    hw = get_profile("h100_ib_ndr")
    assert group_tier("shard", MeshShape(16, 8), hw) is hw.intra
    assert group_tier("replicate", MeshShape(16, 8), hw) is hw.inter
    assert group_tier("shard", MeshShape(1, 64), hw) is hw.inter
    assert group_tier("replicate", MeshShape(2, 4), hw) is hw.intra
    assert all(t.source for p in HARDWARE.values() for t in (p.intra, p.inter))
    with pytest.raises(ValueError, match="unknown hardware profile"):
        get_profile("tpu")


# ----------------------------------------------------------------------------- overlap and batches


class _Ev:
    def __init__(self, name, start, end, thread, shapes=()):
        from torch.autograd import DeviceType
        self.name, self.thread, self.input_shapes, self.device_type = name, thread, list(shapes), DeviceType.CPU
        self.time_range = type("R", (), {"start": start, "end": end})()


class _Prof:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_overlap_counts_comm_that_no_compute_covers():
    prof = _Prof([_Ev("aten::mm", 0, 100, 1), _Ev("aten::add", 150, 200, 1),
                  _Ev("gloo:all_gather", 50, 150, 2, [[10]]), _Ev("gloo:all_reduce", 180, 260, 3, [[40]])])
    out = comm.comm_overlap(prof)
    assert out["comm_s"] == pytest.approx(180e-6)        # union of [50, 150] and [180, 260]
    assert out["exposed_comm_s"] == pytest.approx(110e-6)  # [100, 150] and [200, 260]
    assert out["overlapped_share"] == pytest.approx(70 / 180)
    recorded = [comm.Collective("reduce_scatter", "shard", 2, 160, 40, 0.0),
                comm.Collective("all_gather", "shard", 2, 80, 10, 0.0)]
    assert comm.attach_times(recorded, prof) == 2
    assert recorded[0].seconds == pytest.approx(80e-6) and recorded[1].seconds == pytest.approx(100e-6)


def test_step_batches_resume_where_they_stopped(tiny_dataset):
    train = override(TINY.train, batch_size=48, balance="kk")
    parts = [batch_sampler(tiny_dataset.lengths, TINY, train, r, 2) for r in range(2)]
    epoch_steps = len(parts[0])
    for r, sampler in enumerate(parts):
        it = iter(StepBatches(sampler, 0))
        full = [next(it) for _ in range(epoch_steps + 3)]
        resumed = iter(StepBatches(batch_sampler(tiny_dataset.lengths, TINY, train, r, 2), epoch_steps - 1))
        assert [next(resumed) for _ in range(4)] == full[epoch_steps - 1:]
    first = [next(iter(StepBatches(s, 0))) for s in parts]
    assert sorted(first[0] + first[1]) == sorted(np.concatenate(first).tolist())
    assert len(first[0]) + len(first[1]) == 48 and not set(first[0]) & set(first[1])
    assert parts[0].global_size(0) == 48


def test_single_process_resume_is_exact(data_root, tmp_path):
    from gemref.checkpoint import latest_checkpoint
    from gemref.measure.run import run

    train = override(TINY.train, steps=4, warmup_steps=1, eval_batches=1, balance="kk")
    kwargs = dict(device="cpu", progress=False, measure_memory=False)
    full = run(TINY, train, **kwargs)["loss_curve"]
    run(TINY, override(train, steps=2, checkpoint_dir=str(tmp_path), checkpoint_every=2), **kwargs)
    assert latest_checkpoint(tmp_path)[0] == 2
    resumed = run(TINY, override(train, checkpoint_dir=str(tmp_path), resume=True), **kwargs)
    assert resumed["start_step"] == 2 and resumed["loss_curve"] == full[2:]
    run(TINY, override(train, checkpoint_dir=str(tmp_path), checkpoint_every=2, resume=True), **kwargs)
    assert latest_checkpoint(tmp_path)[0] == 4
    with pytest.raises(ValueError, match="is at step 4, which is not below steps=4: nothing to train"):
        run(TINY, override(train, checkpoint_dir=str(tmp_path), resume=True), **kwargs)
