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

    from gemref.config import MeshShape
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import ShardedEmbedding, shard_tables, sync_replica_grads

    mesh = build_mesh(MeshShape(2, 2), "cpu")
    out = {}
    for mode in modes:
        holder = nn.Module()
        holder.tables = _dense_tables()
        shard_tables(holder, mesh, mode)
        assert all(isinstance(t, ShardedEmbedding) for t in holder.tables.values())
        errors = []
        for case in range(CASES):
            ids, weights = _case(case, rank)
            holder.zero_grad(set_to_none=True)
            reference = _dense_tables()
            loss = sum((holder.tables[n](ids[n]) * weights[n]).sum() for n in TABLES)
            loss.backward()
            sync_replica_grads(holder, mesh)
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
