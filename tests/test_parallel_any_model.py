"""gemref's parallelism on a model gemref did not define (tests/my_rec.py's MyRec), through the
public API: `shard_tables(model, mesh, ["item", "user"], mode)`, `apply_fsdp(model, mesh,
["stack.0", "stack.1"], device)`, `sync_replica_grads(tables, mesh)` after every backward.

Parity: 3 SGD steps (momentum) on gloo ranks against one process on the global batch, fp32, loss and
every parameter. Each rank runs its own slice of the global batch (uneven sizes) and divides
its SUMMED BCE by the GLOBAL batch size B; gradients are summed over ranks, so the step is
the one-process step of the mean BCE over the B samples. Meshes 1x2 (FSDP over 2 ranks, row-
and table-wise tables), 2x1 and 2x2 (a replicate dim: the tables' replica sync). Every rank
holding a parameter (replicas included) must hold the one-process value. (SGD, not Adam: the
keys' bias has a zero gradient in exact arithmetic, and Adam turns its rounding noise, which
differs with the summation order, into steps of up to lr.)
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from my_rec import MyRec, RecBatch, make_batch
from gemref.parallel.fsdp import apply_fsdp
from gemref.parallel.launch import spawn
from gemref.parallel.sparse import shard_tables, sync_replica_grads

LAYERS, TABLES = ["stack.0", "stack.1"], ["item", "user"]
LENGTHS = [3, 0, 5, 2, 4, 1, 6, 2]          # the global batch: B = 8 histories, one empty
STEPS, LR, MOMENTUM = 3, 0.1, 0.9
CUTS = {2: [0, 3, 8], 4: [0, 1, 4, 4, 8]}   # uneven rank slices (a 4-rank run has an empty rank)


def _model(bag_mode: str) -> MyRec:
    torch.manual_seed(0)
    model = MyRec()
    model.user.mode = bag_mode
    return model


def _global_batch(step: int) -> RecBatch:
    return make_batch(LENGTHS, seed=step)


def _slice(b: RecBatch, lo: int, hi: int) -> RecBatch:
    """Samples [lo, hi) of a batch, offsets rebased."""
    s, e = int(b.offsets[lo]), int(b.offsets[hi])
    us, ue = int(b.user_offsets[lo]), int(b.user_offsets[hi])
    return RecBatch(b.items[s:e], b.offsets[lo:hi + 1] - s, b.users[us:ue], b.user_offsets[lo:hi + 1] - us,
                    b.labels[lo:hi])


def _loss(model: nn.Module, b: RecBatch, global_batch: int):
    return F.binary_cross_entropy_with_logits(model(b), b.labels, reduction="sum") / global_batch


def _one_process(bag_mode: str):
    model = _model(bag_mode)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, _global_batch(step), len(LENGTHS))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _full(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def _train(rank, world, configs):
    import torch.distributed as dist

    from gemref.parallel.config import parse_mesh
    from gemref.parallel.mesh import build_mesh

    out = {}
    for mesh_spec, mode, bag_mode in configs:
        mesh = build_mesh(parse_mesh(mesh_spec), "cpu")
        model = _model(bag_mode)
        tables = shard_tables(model, mesh, TABLES, mode)
        apply_fsdp(model, mesh, LAYERS, torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        losses = []
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = _loss(model, _slice(_global_batch(step), CUTS[world][rank], CUTS[world][rank + 1]), len(LENGTHS))
            loss.backward()
            sync_replica_grads(tables, mesh)
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total))
        out[f"{mesh_spec} {mode} {bag_mode}"] = (losses, {n: _full(p).clone() for n, p in model.named_parameters()})
    return out


def _check(results, configs):
    for mesh_spec, mode, bag_mode in configs:
        key = f"{mesh_spec} {mode} {bag_mode}"
        ref_losses, ref_params = _one_process(bag_mode)
        held = set()
        for rank, r in enumerate(results):
            losses, params = r[key]
            assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), (key, rank, losses, ref_losses)
            for name, value in params.items():
                err = float((value - ref_params[name]).abs().max())
                assert err < 1e-5, (key, rank, name, err)
            held |= set(params)
        assert held == set(ref_params), (key, set(ref_params) - held)   # every parameter checked somewhere


CONFIGS_2 = [("1x2", "row", "sum"), ("1x2", "table", "mean"), ("2x1", "row", "sum")]
CONFIGS_4 = [("2x2", "row", "mean"), ("2x2", "table", "sum")]


@pytest.mark.multiproc
def test_two_ranks_match_one_process_fsdp_1x2_and_replicas_2x1():
    _check(spawn(_train, 2, (CONFIGS_2,), timeout_s=180), CONFIGS_2)


@pytest.mark.multiproc
def test_four_ranks_2x2_match_one_process():
    _check(spawn(_train, 4, (CONFIGS_4,), timeout_s=180), CONFIGS_4)


# ----------------------------------------------------------------------------- failing loudly


def _forgotten_sync(rank, world):
    from gemref.parallel.config import parse_mesh
    from gemref.parallel.mesh import build_mesh

    mesh = build_mesh(parse_mesh("2x1"), "cpu")
    errors = []
    plain = _model("sum")             # no sharded table: nothing the sync could sync
    try:
        sync_replica_grads(plain, mesh)
    except ValueError as e:
        errors.append(str(e))
    model = _model("sum")
    shard_tables(model, mesh, TABLES, "row")
    apply_fsdp(model, mesh, LAYERS, torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    try:
        for step in range(2):           # the sync is never called
            opt.zero_grad(set_to_none=True)
            _loss(model, _slice(_global_batch(step), CUTS[2][rank], CUTS[2][rank + 1]), len(LENGTHS)).backward()
            opt.step()
    except ValueError as e:
        errors.append(str(e))
    return errors


@pytest.mark.multiproc
def test_replicas_without_table_sync_raise():
    for errors in spawn(_forgotten_sync, 2, timeout_s=120):
        assert len(errors) == 2, errors
        assert "R > 1 replicas but no sharded table" in errors[0]
        assert "never summed over the mesh's 'replicate' dim" in errors[1] and "sync_replica_grads" in errors[1]


def test_missing_or_wrong_modules_are_named():
    model = MyRec()
    with pytest.raises(ValueError, match="table 'itme': no such module in MyRec"):
        shard_tables(model, None, ["item", "itme"], "row")
    with pytest.raises(ValueError, match="table 'head.0' is a Linear"):
        shard_tables(model, None, ["head.0"], "table")
    with pytest.raises(ValueError, match="needs the names of the tables"):
        shard_tables(model, None, [], "row")
    model.user.mode = "max"
    with pytest.raises(ValueError, match="table 'user' uses mode='max'"):
        shard_tables(model, None, ["user"], "row")
    with pytest.raises(ValueError, match="layer 'stack.2': no such module in MyRec"):
        apply_fsdp(model, None, ["stack.0", "stack.2"], torch.device("cpu"))
    with pytest.raises(ValueError, match="needs the names of the layers"):
        apply_fsdp(model, None, [], torch.device("cpu"))


# ----------------------------------------------------------------------------- FSDP's dtype follows the run


def test_mixed_precision_policy_follows_the_gemm_dtype():
    """An fp32 run gathers fp32 parameters (no mixed precision), on any device; bf16 gathers bf16
    and reduces gradients in fp32; a dtype that is not floating point is refused."""
    from gemref.parallel.fsdp import mixed_precision_policy

    for fp32 in (None, torch.float32):
        policy = mixed_precision_policy(fp32)
        assert policy.param_dtype is None and policy.reduce_dtype is None
    policy = mixed_precision_policy(torch.bfloat16)
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    with pytest.raises(ValueError, match="floating-point"):
        mixed_precision_policy(torch.int64)


def test_a_runs_fsdp_dtype_is_its_gemm_dtype_on_cuda():
    """fp32 -> fp32 (an fp32 run with a mesh computed in bf16 on CUDA before, its MFU divided by the
    fp32 peak); bf16 and float8 (bf16 autocast around the float8 GEMMs) -> bf16; CPU -> fp32."""
    from gemref.precision.apply import apply_precision
    from gemref.train.compose import fsdp_param_dtype

    cuda = torch.device("cuda")        # only the device's type is read: no GPU needed
    for precision, expected in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        report = apply_precision(nn.Sequential(), precision, device=cuda)
        assert fsdp_param_dtype(report, cuda) == expected, precision
        assert fsdp_param_dtype(report, torch.device("cpu")) == torch.float32, precision
    float8 = apply_precision(nn.Sequential(), "float8_rowwise", device=cuda, kernel="emulated")
    assert fsdp_param_dtype(float8, cuda) == torch.bfloat16


def _gathered_dtypes(rank, world):
    from gemref.parallel.config import parse_mesh
    from gemref.parallel.mesh import build_mesh

    mesh = build_mesh(parse_mesh("1x2"), "cpu")
    out = {}
    for dtype in (None, torch.bfloat16):
        model = _model("sum")
        shard_tables(model, mesh, TABLES, "row")
        apply_fsdp(model, mesh, LAYERS, torch.device("cpu"), param_dtype=dtype)
        seen = []
        model.get_submodule(LAYERS[0]).register_forward_pre_hook(
            lambda m, _: seen.append({str(p.dtype) for p in m.parameters()}))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):   # as a bf16 run computes
            loss = _loss(model, _slice(_global_batch(0), CUTS[2][rank], CUTS[2][rank + 1]), len(LENGTHS))
        loss.backward()
        out[str(dtype)] = (seen[0], {str(p.grad.dtype) for p in model.get_submodule(LAYERS[0]).parameters()},
                           {str(p.dtype) for p in model.get_submodule(LAYERS[0]).parameters()})
    return out


@pytest.mark.multiproc
def test_fsdp_computes_in_the_runs_dtype():
    """An fp32 run's layers compute with fp32 parameters (before: bf16 on every CUDA run); a bf16
    run's with bf16 ones; both keep fp32 shards and fp32 gradients for the optimizer."""
    for r in spawn(_gathered_dtypes, 2, timeout_s=120):
        assert r["None"] == ({"torch.float32"}, {"torch.float32"}, {"torch.float32"}), r["None"]
        assert r["torch.bfloat16"] == ({"torch.bfloat16"}, {"torch.float32"}, {"torch.float32"}), r["torch.bfloat16"]
