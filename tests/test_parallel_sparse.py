"""2D-sharded embedding tables against a plain nn.Embedding, forward and backward, on 4 gloo ranks.

Each rank looks up its own random ids (Zipf-skewed, with sizes from 0 up, some ranks empty)
in a 2x2 mesh; the outputs must equal the dense table's rows, and each rank's local table
gradient (after the replica all-reduce) must equal the matching rows of the gradient of
the sum of every rank's loss on the dense table. float64, so the match is exact to rounding.
"""
import numpy as np
import pytest
import torch
from torch import nn

from gemref.parallel.launch import spawn

TABLES = {"big": 37, "tiny": 1, "mid": 5}   # rows; "tiny" has fewer rows than shard ranks
DIM, CASES = 3, 8


def _case(case: int, rank: int):
    rng = np.random.default_rng(1000 * case + rank)
    n = int(rng.choice([0, 1, 2, 7, 40]))                 # skewed sizes, some ranks look up nothing
    ids = {name: torch.as_tensor(np.minimum(rng.zipf(1.3, size=n) - 1, rows - 1)) for name, rows in TABLES.items()}
    weights = {name: torch.as_tensor(rng.standard_normal((n, DIM))) for name in TABLES}
    return ids, weights


def _err(a, b) -> float:
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def _dense_tables():
    torch.manual_seed(0)
    return nn.ModuleDict({n: nn.Embedding(r, DIM, dtype=torch.float64) for n, r in TABLES.items()})


def _rank(rank, world, modes):
    import torch.distributed as dist

    from gemref.parallel.config import MeshShape
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import ShardedEmbedding, shard_tables, sync_replica_grads

    mesh = build_mesh(MeshShape(2, 2), "cpu")
    out = {}
    for mode in modes:
        holder = nn.Module()
        holder.tables = _dense_tables()
        sharded = shard_tables(holder, mesh, [f"tables.{n}" for n in TABLES], mode)
        assert all(isinstance(t, ShardedEmbedding) for t in holder.tables.values())
        assert list(sharded.values()) == list(holder.tables.values())
        errors = []
        for case in range(CASES):
            ids, weights = _case(case, rank)
            holder.zero_grad(set_to_none=True)
            reference = _dense_tables()
            loss = sum((holder.tables[n](ids[n]) * weights[n]).sum() for n in TABLES)
            loss.backward()
            sync_replica_grads(sharded, mesh)
            everyone = [None] * world
            dist.all_gather_object(everyone, (ids, weights))
            sum((reference[n](i[n]) * w[n]).sum() for i, w in everyone for n in TABLES).backward()
            for n in TABLES:
                t = holder.tables[n]
                errors.append(_err(t(ids[n]), reference[n](ids[n])))
                if t.weight is not None:
                    start, stop = t.plan.row_range(t.shard_index, t.shards)
                    grad = t.weight.grad.to_local() if hasattr(t.weight.grad, "to_local") else t.weight.grad
                    errors.append(_err(grad, reference[n].weight.grad[start:stop]))
        out[mode] = torch.tensor(errors)
    return out


@pytest.mark.multiproc
def test_sharded_tables_match_dense_tables_forward_and_backward():
    results = spawn(_rank, 4, (("row", "table"),), timeout_s=120)
    for mode in ("row", "table"):
        worst = max(float(r[mode].max()) for r in results)
        assert worst < 1e-12, (mode, worst)
    assert sum(len(r["table"]) for r in results) < sum(len(r["row"]) for r in results)  # non-owners hold no grads


# ----------------------------------------------------------------------------- nn.EmbeddingBag

BAGS = [  # (mode, include_last_offset, per-sample weights, 2D fixed-size bags)
    ("sum", False, False, False), ("mean", False, False, False), ("sum", True, True, False),
    ("mean", True, False, False), ("sum", False, False, True), ("mean", False, False, True)]


def _bag_inputs(rank: int, include_last: bool, weighted: bool, fixed: bool):
    g = torch.Generator().manual_seed(rank)
    if fixed:
        return torch.randint(0, 11, (3 + rank, 4), generator=g), None, None
    lengths = torch.tensor([2, 0, 3, 1][: 2 + 2 * rank])       # an empty bag among them
    ids = torch.randint(0, 11, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    weights = torch.rand(ids.numel(), generator=g, dtype=torch.float64) if weighted else None
    return ids, offsets if include_last else offsets[:-1], weights


def _bags_rank(rank, world):
    import torch.distributed as dist

    from gemref.parallel.config import MeshShape
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import shard_tables, sync_replica_grads

    mesh = build_mesh(MeshShape(1, 2), "cpu")
    errors = []
    for mode, include_last, weighted, fixed in BAGS:
        for sharding in ("row", "table"):
            torch.manual_seed(0)
            dense = nn.EmbeddingBag(11, DIM, mode=mode, include_last_offset=include_last, dtype=torch.float64)
            holder = nn.Module()
            holder.bag = nn.EmbeddingBag(11, DIM, mode=mode, include_last_offset=include_last, dtype=torch.float64)
            holder.bag.load_state_dict(dense.state_dict())
            tables = shard_tables(holder, mesh, ["bag"], sharding)
            ids, offsets, weights = _bag_inputs(rank, include_last, weighted, fixed)
            out = holder.bag(ids, offsets, weights)
            errors.append(_err(out, dense(ids, offsets, weights)))
            out.sum().backward()
            sync_replica_grads(tables, mesh)
            everyone = [None] * world
            dist.all_gather_object(everyone, (ids, offsets, weights))
            sum(dense(*args).sum() for args in everyone).backward()
            t = holder.bag
            if t.weight is not None:
                start, stop = t.plan.row_range(t.shard_index, t.shards)
                grad = t.weight.grad.to_local() if hasattr(t.weight.grad, "to_local") else t.weight.grad
                errors.append(_err(grad, dense.weight.grad[start:stop]))
    return torch.tensor(errors)


@pytest.mark.multiproc
def test_sharded_embedding_bags_match_nn_embedding_bag_forward_and_backward():
    """sum and mean pooling, offsets with and without the last one, per-sample weights, 2D bags."""
    results = spawn(_bags_rank, 2, timeout_s=120)
    assert all(len(r) >= len(BAGS) * 2 for r in results)
    assert max(float(r.max()) for r in results) < 1e-12


# ----------------------------------------------------------------------------- host syncs

# Ops whose result the host must wait for on a GPU (a scalar read, or an output sized by the data).
SYNC_OPS = ("aten._local_scalar_dense", "aten.equal", "aten.nonzero", "aten.masked_select", "aten.bincount",
            "aten.repeat_interleave.Tensor", "aten._unique", "aten.unique", "aten.is_nonzero")


def _count_syncs(fn):
    """Run fn() and count its host syncs: `.tolist()` calls and the SYNC_OPS it dispatches (CPU has no
    sync to catch, so the ops that would be one on a GPU are counted by name)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict[str, int] = {}

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith(SYNC_OPS) and not (name.startswith("aten.repeat_interleave")
                                                  and (kwargs or {}).get("output_size") is not None):
                counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    original = torch.Tensor.tolist

    def tolist(self):
        counts["tolist"] = counts.get("tolist", 0) + 1
        return original(self)

    torch.Tensor.tolist = tolist
    try:
        with Counter():
            fn()
    finally:
        torch.Tensor.tolist = original
    return counts


def _syncs_rank(rank, world):
    from gemref.parallel.config import MeshShape
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import fuse_lookups, shard_tables

    mesh = build_mesh(MeshShape(1, 2), "cpu")
    out = {}
    for mode in ("row", "table"):
        holder = nn.Module()
        holder.tables = _dense_tables()
        torch.manual_seed(0)
        holder.bag = nn.EmbeddingBag(11, DIM, mode="mean", dtype=torch.float64)
        ids, weights = _case(4, rank)
        bag_ids, bag_offsets, _ = _bag_inputs(rank, False, False, False)

        def forward(ids, bag_ids, bag_offsets):
            x = sum((holder.tables[n](ids[n]) * weights[n]).sum() for n in TABLES)
            return x + holder.tables["big"](ids["mid"]).sum() + holder.bag(bag_ids, bag_offsets).sum()

        holder.forward = forward
        tables = shard_tables(holder, mesh, [f"tables.{n}" for n in TABLES] + ["bag"], mode)
        fuse_lookups(holder, tables, lambda ids, bag_ids, bag_offsets: {f"tables.{n}": [i] for n, i in ids.items()}
                     | {"tables.big": [ids["big"], ids["mid"]], "bag": [bag_ids]})
        out[mode] = _count_syncs(lambda: holder(ids, bag_ids, bag_offsets).backward())
    return out


@pytest.mark.multiproc
def test_a_fused_lookup_step_has_one_host_sync():
    """Forward and backward of a fused lookup of five tables (one looked up twice, one an
    EmbeddingBag), row- and table-wise: one host sync, the `.tolist()` of the all-to-all's split
    sizes; no scalar read, no data-sized op (nonzero, bincount, repeat_interleave), no torch.equal."""
    for r in spawn(_syncs_rank, 2, timeout_s=120):
        assert r["row"] == {"tolist": 1}, r["row"]
        assert r["table"] == {"tolist": 1}, r["table"]


def _bad_ids_rank(rank, world):
    from gemref.parallel.config import MeshShape
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import shard_tables

    mesh = build_mesh(MeshShape(1, 2), "cpu")
    holder = nn.Module()
    holder.tables = _dense_tables()
    shard_tables(holder, mesh, [f"tables.{n}" for n in TABLES], "row")
    ids = torch.tensor([0, 36] if rank == 0 else [3, 37, 40])      # rank 1 asks for rows "big" lacks
    try:
        holder.tables["big"](ids)
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.multiproc
def test_out_of_range_ids_are_refused_on_every_rank_of_the_group():
    """The rank with bad ids names the table and their range; the others name that rank, and none
    is left waiting in an all-to-all (the bad count travels with the split sizes)."""
    first, second = spawn(_bad_ids_rank, 2, timeout_s=60)
    assert "shard rank(s) [1]" in first, first
    assert "table 'tables.big': ids must lie in [0, 37), got 3..40" in second, second
