"""2D sparse parallelism: embedding tables sharded across "shard", replicated across "replicate".

Embedding tables are most of a ranking model's bytes and few of its FLOPs, so they are
never all-gathered: each rank keeps a slice of every table (row-wise) or whole tables
(table-wise), and a lookup sends the ids to the rank that owns their rows and the rows back:

    ids --bucket by owner--> all-to-all (counts, ids) --> local lookup --> all-to-all (rows)
                                                                  backward: all-to-all (row grads)

The all-to-alls run inside a shard group (S ranks, one mesh row), so the R groups are
replicas of each other; after backward `sync_replica_grads` all-reduces each rank's table
gradients across the "replicate" dim (one flat all-reduce). The optimizer then holds state
only for the local rows: optimizer state is sharded the same way as the tables.

Plans (`plan_tables`):
  * row: every table split into S contiguous row blocks of ceil(V/S) rows (the chunking of
    DTensor's Shard(0), so the weights are DTensors [Replicate(), Shard(0)] that
    torch.distributed.checkpoint saves and reshards like any other);
  * table: whole tables placed by bytes, largest first onto the least-loaded shard rank
    (LPT); owners hold a plain parameter, other ranks hold none.
`shard_tables(model, mesh, mode)` swaps the model's nn.Embedding modules for
`ShardedEmbedding`s from outside; the model code does not change.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from ..config import SPARSE_SHARDINGS


@dataclass(frozen=True)
class TablePlan:
    name: str
    rows: int
    dim: int
    mode: str            # "row" or "table"
    owner: int = -1      # table-wise: the shard index holding the whole table

    def row_range(self, shard_index: int, shards: int) -> tuple[int, int]:
        """[start, stop) of the rows held by shard rank `shard_index`."""
        if self.mode == "table":
            return (0, self.rows) if shard_index == self.owner else (0, 0)
        chunk = -(-self.rows // shards)
        start = min(self.rows, shard_index * chunk)
        return start, min(self.rows, start + chunk)

    def owner_of(self, ids: Tensor, shards: int) -> Tensor:
        """The shard index that holds each id's row."""
        if self.mode == "table":
            return torch.full_like(ids, self.owner)
        return ids // -(-self.rows // shards)

    def local_bytes(self, shard_index: int, shards: int, element_size: int = 4) -> int:
        start, stop = self.row_range(shard_index, shards)
        return (stop - start) * self.dim * element_size


def plan_tables(tables: dict[str, tuple[int, int]], shards: int, mode: str) -> dict[str, TablePlan]:
    """{name: (rows, dim)} -> {name: TablePlan} for S shard ranks ("row" or "table")."""
    if mode not in ("row", "table"):
        raise ValueError(f"sparse_sharding={mode!r} has no plan; valid plans: row, table")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if mode == "row":
        return {n: TablePlan(n, r, d, "row") for n, (r, d) in tables.items()}
    loads = [0] * shards
    plans = {}
    for name in sorted(tables, key=lambda n: (-tables[n][0] * tables[n][1], n)):
        owner = min(range(shards), key=lambda s: (loads[s], s))
        rows, dim = tables[name]
        loads[owner] += rows * dim
        plans[name] = TablePlan(name, rows, dim, "table", owner)
    return {n: plans[n] for n in tables}


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows with autograd: backward sends the gradients the reverse way."""

    @staticmethod
    def forward(ctx, rows: Tensor, out_splits: list[int], in_splits: list[int], group, *anchor: Tensor) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = rows.new_empty((sum(out_splits),) + tuple(rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        grad_in = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(grad_in, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return (grad_in, None, None, None) + (None,) * (len(ctx.needs_input_grad) - 4)


class ShardedEmbedding(nn.Module):
    """An nn.Embedding whose rows live on the ranks of a shard group; called like the original."""

    def __init__(self, table: nn.Embedding, plan: TablePlan, mesh: DeviceMesh):
        super().__init__()
        self.plan, self.num_embeddings, self.embedding_dim = plan, table.num_embeddings, table.embedding_dim
        self.dtype = table.weight.dtype
        self.group, self.shards = mesh.get_group("shard"), mesh.size(1)
        self.shard_index = mesh.get_local_rank("shard")
        self.row_start = plan.row_range(self.shard_index, self.shards)[0]
        full = table.weight.detach()
        if plan.mode == "row":
            self.weight = nn.Parameter(distribute_tensor(full, mesh, [Replicate(), Shard(0)]))
        elif plan.owner == self.shard_index:
            self.weight = nn.Parameter(full.clone())
        else:
            self.register_parameter("weight", None)

    def local_weight(self) -> Tensor | None:
        w = self.weight
        return w.to_local() if isinstance(w, DTensor) else w

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1)
        owner = self.plan.owner_of(flat, self.shards)
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=self.shards)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_l, recv_l = send.tolist(), recv.tolist()
        served_ids = flat.new_empty(sum(recv_l))
        dist.all_to_all_single(served_ids, flat[order], recv_l, send_l, group=self.group)
        weight = self.local_weight()
        if weight is None:   # table-wise, not the owner: serves nothing, but joins every all-to-all
            served = torch.zeros((0, self.embedding_dim), dtype=self.dtype, device=flat.device)
            anchor = (torch.zeros(0, requires_grad=torch.is_grad_enabled()),)  # so backward runs here too
        else:
            served = F.embedding(served_ids - self.row_start, weight)
            anchor = ()
        rows_sorted = _AllToAll.apply(served, send_l, recv_l, self.group, *anchor)
        rows = rows_sorted[torch.argsort(order)]
        return rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        start, stop = self.plan.row_range(self.shard_index, self.shards)
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.plan.mode}-wise, rows [{start}, {stop})"


def shard_tables(model: nn.Module, mesh: DeviceMesh, mode: str) -> list[nn.Parameter]:
    """Replace every nn.Embedding in `model.tables` by a ShardedEmbedding; return their local parameters.

    The returned parameters are what FSDP must ignore (`fully_shard(..., ignored_params=...)`).
    """
    if mode not in SPARSE_SHARDINGS:
        raise ValueError(f"sparse_sharding={mode!r}; valid: {', '.join(SPARSE_SHARDINGS)}")
    if mode == "none":
        return []
    tables = model.tables
    plans = plan_tables({n: (t.num_embeddings, t.embedding_dim) for n, t in tables.items()}, mesh.size(1), mode)
    for name, plan in plans.items():
        tables[name] = ShardedEmbedding(tables[name], plan, mesh)
    return [t.weight for t in tables.values() if t.weight is not None]


def sharded_tables(model: nn.Module) -> list[ShardedEmbedding]:
    tables = getattr(model, "tables", {})
    return [t for t in tables.values() if isinstance(t, ShardedEmbedding)]


def sync_replica_grads(model: nn.Module, mesh: DeviceMesh) -> None:
    """Sum the table gradients of the R replicas (one flat all-reduce over "replicate").

    Every rank of a replicate group holds the same shard index, hence the same tables and
    row ranges, so the flat buffers line up.
    """
    if mesh.size(0) == 1:
        return
    grads = []
    for t in sharded_tables(model):
        if t.weight is not None and t.weight.grad is not None:
            g = t.weight.grad
            grads.append(g.to_local() if isinstance(g, DTensor) else g)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=mesh.get_group("replicate"))
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
