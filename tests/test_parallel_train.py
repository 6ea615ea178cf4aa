"""Multi-rank training on gloo: parity with one process, bytes per rank, bytes on the wire,
load-balanced gradients, checkpoints that survive a crash, and errors that never hang."""
import json
import os
from pathlib import Path

import pytest
import torch

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.checkpoint import latest_checkpoint
from gemref.parallel.launch import spawn
from gemref.runtime.files import to_jsonable

pytestmark = pytest.mark.multiproc
TINY = get_preset("tiny")
TRAIN = override(TINY.train, steps=5, warmup_steps=1, eval_batches=1)
CONFIGS = {"fsdp_1x4": {"mesh": "1x4"}, "hsdp_2x2": {"mesh": "2x2"},
           "sparse_2x2": {"mesh": "2x2", "sparse_sharding": "row"},
           "replicated_4x1": {"mesh": "4x1"}}          # DDP's bucketed all-reduce (parallel/replicate.py)
SHARDS = {"fsdp_1x4": 4, "hsdp_2x2": 2, "sparse_2x2": 2, "replicated_4x1": 1}


def _jsonable(x):
    return json.loads(json.dumps(to_jsonable(x)))


def _train_configs(rank, world):
    from gemref.measure.run import run

    out = {}
    for name, changes in CONFIGS.items():
        r = run(TINY, override(TRAIN, **changes), device="cpu", progress=False, measure_memory=False)
        out[name] = _jsonable({k: r[k] for k in ("loss_curve", "memory_per_rank", "comm", "ranks", "parallel",
                                                         "mfu_basis_dtype")})
    return out if rank == 0 else None


@pytest.fixture(scope="module")
def four_ranks(data_root):
    """One spawn of 4 gloo ranks running every config for 5 steps; rank 0's records."""
    return spawn(_train_configs, 4, timeout_s=240)[0]


@pytest.fixture(scope="module")
def one_process(data_root):
    from gemref.measure.run import run
    return run(TINY, TRAIN, device="cpu", progress=False, measure_memory=False)["loss_curve"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_loss_trajectory_matches_one_process(four_ranks, one_process, config):
    losses = four_ranks[config]["loss_curve"]
    assert len(losses) == len(one_process) == 5
    for step, (a, b) in enumerate(zip(losses, one_process)):
        assert abs(a - b) <= 1e-5 * abs(b), (config, step, a, b)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_bytes_per_rank_are_one_over_s(four_ranks, config):
    from gemref.parallel.memory import projected_rank_bytes
    from gemref.parallel.config import parse_mesh

    S = SHARDS[config]
    projected = projected_rank_bytes(TINY.model, parse_mesh(CONFIGS[config]["mesh"]),
                                     CONFIGS[config].get("sparse_sharding", "none"))
    assert four_ranks[config]["memory_per_rank"][0]["params"] == projected["params"]   # rank 0 is the fullest
    for m in four_ranks[config]["memory_per_rank"]:
        placement = "sharded" if S > 1 else "replicated"
        assert all(part["placement"] == placement for part in m["parts"]), m["parts"]
        held = m["params"] + m["optimizer"]
        ideal = (m["unsharded_params"] + m["unsharded_optimizer"]) / S
        assert abs(held - ideal) <= 0.05 * ideal, (config, held, ideal)
        assert m["grads"] == m["params"]
        assert 0 < m["optimizer_scalars"] < 0.01 * held      # AdamW step counters: replicated, itemised


@pytest.mark.parametrize("config", list(CONFIGS))
def test_recorded_collective_bytes_match_analytic(four_ranks, config):
    comm = four_ranks[config]["comm"]
    kinds = {(row["kind"], row["dim"]) for row in comm["by_kind"]}
    expected = {("all_gather", "shard"), ("reduce_scatter", "shard")} if SHARDS[config] > 1 else set()
    expected |= {("all_reduce", "replicate")} if config != "fsdp_1x4" else set()
    expected |= {("all_to_all", "shard")} if config == "sparse_2x2" else set()
    assert kinds == expected
    for row in comm["by_kind"]:
        assert row["recorded_count"] > 0 and abs(row["ratio"] - 1) <= 0.05, row
        assert row["seconds"] > 0
    overlap = comm["overlap_per_rank"][0]
    assert 0 <= overlap["exposed_comm_s"] <= overlap["comm_s"]        # a part of the measured comm, never more


def test_rank_times_are_recorded(four_ranks):
    ranks = four_ranks["sparse_2x2"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["step_s"] > 0 and 0 < r["compute_cpu_s"] and r["wait_s"] >= 0 for r in ranks)
    assert sum(r["samples"] for r in ranks) == TRAIN.batch_size


def test_an_fp32_run_records_fp32_fsdp_parameters(four_ranks):
    """The record names the dtype FSDP gathered parameters in, the GEMMs' dtype its MFU divides by."""
    for name in CONFIGS:
        record = four_ranks[name]
        assert record["mfu_basis_dtype"] == "fp32", name
        assert record["parallel"]["fsdp_param_dtype"] == (None if name == "replicated_4x1" else "float32"), name


# ----------------------------------------------------------------------------- load balancing

BALANCED = override(TINY.train, batch_size=40, mesh="1x2", balance="kk")   # kk splits it 21 + 19


def _balanced_grads(rank, world):
    from gemref.data.sampler import StepBatches
    from gemref.train import backward, forward_loss, setup

    s = setup(TINY, BALANCED, device="cpu")
    indices = next(iter(StepBatches(s.sampler, 0)))
    batch = s.train_set.__getitems__(indices)
    out = {"indices": torch.tensor(indices)}
    for name, normalizer in (("global", s.normalizer), ("naive", len(indices))):   # training's loss_divisor
        s.optimizer.zero_grad(set_to_none=True)
        backward(s.model, forward_loss(s.model, batch, normalizer=normalizer), s.parallel.finish_backward)
        out[name] = torch.cat([p.grad.full_tensor().flatten() for _, p in s.model.named_parameters()])
    return out


def test_balanced_two_ranks_give_the_single_process_gradient(data_root):
    from gemref.train import setup

    results = spawn(_balanced_grads, 2, timeout_s=120)
    counts = [len(r["indices"]) for r in results]
    assert counts[0] != counts[1] and sum(counts) == 40, "kk should split this batch unequally"
    s = setup(TINY, override(BALANCED, mesh="1x1", balance="none"), device="cpu")
    whole = torch.cat([r["indices"] for r in results]).tolist()
    s.loss(s.train_set.__getitems__(whole)).backward()
    reference = torch.cat([p.grad.flatten() for _, p in s.model.named_parameters()])

    def rel(g):
        return float((g - reference).norm() / reference.norm())
    for r in results:
        assert rel(r["global"]) < 1e-5
        assert rel(r["naive"]) > 1e-3, "per-rank means must differ, else the test proves nothing"


# ----------------------------------------------------------------------------- checkpoints

CKPT = override(TINY.train, steps=6, warmup_steps=1, eval_batches=1, mesh="1x2", sparse_sharding="row", balance="kk")


def _run_then_crash_mid_save(rank, world, folder, dying_rank):
    """The uninterrupted run (checkpoints in full/), then a run whose `dying_rank` is killed inside
    the step-4 save, after writing its shards (rank 0 would next write checkpoint.json)."""
    from torch.distributed.checkpoint import FileSystemWriter

    from gemref.measure.run import run

    full = run(TINY, override(CKPT, checkpoint_dir=f"{folder}/full", checkpoint_every=2), device="cpu",
               progress=False, measure_memory=False)
    if rank == 0:
        (Path(folder) / "full.json").write_text(json.dumps(full["loss_curve"]))
    if rank == dying_rank:
        write = FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            done = write(self, plan, planner)
            done.wait()
            if "step-00000004" in str(self.path):
                os._exit(17)             # this rank's shard files are written, the save is not complete
            return done
        FileSystemWriter.write_data = write_then_die
    run(TINY, override(CKPT, checkpoint_dir=f"{folder}/ckpt", checkpoint_every=2), device="cpu",
        progress=False, measure_memory=False)


def _resume(rank, world, folder):
    from gemref.measure.run import run

    r = run(TINY, override(CKPT, checkpoint_dir=f"{folder}/ckpt", checkpoint_every=2, resume=True),
            device="cpu", progress=False, measure_memory=False)
    return {"start": r["start_step"], "losses": torch.tensor(r["loss_curve"], dtype=torch.float64)}


def _checkpoint_tensors(folder: Path, tmp: Path) -> dict:
    """Every tensor of a DCP checkpoint, read by DCP's own converter (not by gemref's loader)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.utils._pytree import tree_flatten_with_path, keystr

    dcp_to_torch_save(folder, tmp / f"{folder.parent.name}-{folder.name}.pt")
    state = torch.load(tmp / f"{folder.parent.name}-{folder.name}.pt", weights_only=True)
    leaves, _ = tree_flatten_with_path(state)
    return {keystr(path): leaf for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


@pytest.mark.parametrize("dying_rank", [0, 1])
def test_a_rank_killed_mid_save_keeps_the_last_checkpoint_and_resume_is_bit_exact(data_root, tmp_path, dying_rank):
    """Resume continues from step 2 and ends in exactly the uninterrupted run's state: every
    parameter, AdamW moment and step count, and both ranks' RNG states, bit for bit. Also:
    checkpoints of 2 ranks are not resumed by a different world (here 1 process)."""
    from gemref.measure.run import run

    with pytest.raises(RuntimeError, match=f"rank {dying_rank} died with exit code 17"):
        spawn(_run_then_crash_mid_save, 2, (str(tmp_path), dying_rank), timeout_s=240)
    ckpt = tmp_path / "ckpt"
    assert latest_checkpoint(ckpt)[0] == 2
    assert (ckpt / ".tmp-step-00000004").is_dir() and not (ckpt / "step-00000004").exists()
    full = json.loads((tmp_path / "full.json").read_text())
    resumed = spawn(_resume, 2, (str(tmp_path),), timeout_s=180)
    assert resumed[0]["start"] == 2
    assert resumed[0]["losses"].tolist() == full[2:], "resuming must reproduce the run exactly"
    assert latest_checkpoint(ckpt)[0] == 6 and not list(ckpt.glob(".tmp-*"))

    uninterrupted = _checkpoint_tensors(tmp_path / "full" / "step-00000006", tmp_path)
    after_resume = _checkpoint_tensors(ckpt / "step-00000006", tmp_path)
    assert uninterrupted.keys() == after_resume.keys()
    kinds = {k.split("]")[0] for k in uninterrupted}
    assert kinds == {"['model'", "['optim'", "['step'", "['rng.rank0'", "['rng.rank1'"}, kinds
    assert sum("exp_avg_sq" in k for k in uninterrupted) == sum(1 for k in uninterrupted if k.startswith("['model'"))
    for key, value in uninterrupted.items():
        assert torch.equal(value, after_resume[key]), key
    earlier = _checkpoint_tensors(tmp_path / "full" / "step-00000004", tmp_path)
    assert any(not torch.equal(v, earlier[k]) for k, v in uninterrupted.items() if k.startswith("['model'")), \
        "sanity: two more steps change the parameters, so equality above is not vacuous"
    with pytest.raises(ValueError, match=r"world_size: 2 in the checkpoint, 1 in this run"):
        run(TINY, override(CKPT, mesh="1x1", sparse_sharding="none", steps=8, checkpoint_dir=str(ckpt), resume=True),
            device="cpu", progress=False, measure_memory=False)


# ----------------------------------------------------------------------------- parameter parity

PARITY = override(TINY.train, steps=3, batch_size=32, lr=1e-2)
PARITY_MESHES = ("2x1", "1x2")   # 2 replicas of the whole model; 2-way FSDP sharding


def _final_parameters(train, world: int) -> dict:
    """Train `train.steps` steps through the run's own step function; each rank's parameters
    (its local copy for a replicated mesh, the gathered tensor for a sharded one)."""
    from torch.distributed.tensor import DTensor

    from gemref.data.loader import make_loader
    from gemref.data.sampler import StepBatches
    from gemref.train import setup

    s = setup(TINY, train, device="cpu")
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0)))
    for _ in range(train.steps):
        s.step(next(batches))
    out = {}
    for name, p in s.model.named_parameters():
        if isinstance(p, DTensor):
            shard_dims = [i for i, pl in enumerate(p.placements) if pl.is_shard()]
            sharded = any(p.device_mesh.size(i) > 1 for i in shard_dims)
            p = p.full_tensor() if sharded else p.to_local()
        out[name] = p.detach().clone()
    return out


def _parity_ranks(rank, world):
    return {mesh: _final_parameters(override(PARITY, mesh=mesh), world) for mesh in PARITY_MESHES}


def test_final_parameters_agree_across_ranks_and_with_one_process(data_root):
    ranks = spawn(_parity_ranks, 2, timeout_s=240)
    single = _final_parameters(PARITY, 1)
    after_one = _final_parameters(override(PARITY, steps=1), 1)
    moved = max(float((single[n] - after_one[n]).abs().max()) for n in single)
    assert moved > 0.5 * PARITY.lr, "training must move the parameters, else parity proves nothing"
    for mesh in PARITY_MESHES:
        a, b = ranks[0][mesh], ranks[1][mesh]
        assert a.keys() == b.keys() == single.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (mesh, name)     # replicas never drift apart
            # one process sums the same gradients in another order (float32 rounding): allow 1%
            # of the furthest AdamW can move a parameter in these steps (lr per step)
            assert torch.allclose(a[name], single[name], rtol=0, atol=0.01 * PARITY.lr * PARITY.steps), \
                (mesh, name, float((a[name] - single[name]).abs().max()))


# ----------------------------------------------------------------------------- errors never hang


def _one_rank_fails(rank, world):
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("rank 1 saw a bad input")
    dist.barrier()             # rank 0 would wait here forever if the launcher did not stop it


def _mesh_mismatch(rank, world):
    from gemref.train import setup
    setup(TINY, override(TINY.train, mesh="2x2"), device="cpu")


def test_a_failing_rank_fails_the_launch_with_its_error():
    with pytest.raises(ValueError, match="rank 1 saw a bad input"):
        spawn(_one_rank_fails, 2, timeout_s=60)


def test_mesh_not_matching_the_world_is_a_value_error_in_every_rank(data_root):
    with pytest.raises(ValueError, match=r"mesh=2x2 needs R\*S = 4 ranks, but the world size is 2"):
        spawn(_mesh_mismatch, 2, timeout_s=60)
