"""The all-to-all exchange behind sharded table lookups: one per direction for any number of tables.

A lookup of sharded tables (gemref/parallel/sparse.py, chapter 07_fsdp_2d) sends each id to the
rank of the shard group that owns its row and the rows back. `exchange` does it for a list of
(table, ids) requests at once, as TorchRec's input and output distributions do for all the
features of a KeyedJaggedTensor:

    forward:  all-to-all (counts: S x K int64) -> all-to-all (ids of all K requests)
              -> local lookups -> all-to-all (rows of all requests, flattened: tables may differ in dim)
    backward: all-to-all (row gradients of all requests)

so a step costs 1 ids and 1 rows all-to-all (plus the small counts one) forward and 1 backward,
whatever the number of tables. Sent ids are ordered by (owner, request), each request keeping its
own order, so both sides can unpack without sending any index.

Row gradients arrive, in backward, at the owner as (local row ids, gradient rows). A table with a
`row_optimizer` (gemref/parallel/rowwise.py) is looked up in its detached weight and gets them
handed over (`row_optimizer.stash`): no dense gradient of the table is ever formed. Any other
table gets them through autograd (F.embedding's backward: the local shard's dense gradient) and is
marked `unsynced` when its replicas (R > 1) must still sum it. Units: elements, rows.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


class _RowsAllToAll(torch.autograd.Function):
    """all_to_all_single of flattened rows with autograd; backward returns the gradient the reverse
    way and hands the served rows' gradients to the tables' row optimizers."""

    @staticmethod
    def forward(ctx, served: Tensor, out_splits: list[int], in_splits: list[int], group, route, *anchor):
        ctx.splits, ctx.group, ctx.route = (out_splits, in_splits), group, route
        out = served.new_empty(sum(out_splits))
        dist.all_to_all_single(out, served.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        grad_served = grad.new_empty(sum(in_splits))
        dist.all_to_all_single(grad_served, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        for table, local_ids, positions in ctx.route:
            if table.row_optimizer is not None:
                rows = grad_served[positions].view(local_ids.numel(), table.embedding_dim)
                table.row_optimizer.stash(table, local_ids, rows)
            else:
                table.unsynced = table.replicas > 1
        return (grad_served, None, None, None, None) + (None,) * (len(ctx.needs_input_grad) - 5)


def _offsets(dims: Tensor) -> Tensor:
    """Exclusive cumulative sum: where each element's row starts in a flat buffer."""
    return torch.cumsum(dims, 0) - dims


def _positions(starts: Tensor, dim: int) -> Tensor:
    return (starts[:, None] + torch.arange(dim, device=starts.device)).reshape(-1)


def exchange(requests: Sequence[tuple[object, Tensor]]) -> list[Tensor]:
    """Rows (n_k, d_k) for each request (table, 1D ids), the tables sharing one shard group: one
    counts, one ids and one rows all-to-all (module doc)."""
    if not requests:
        return []
    tables = [t for t, _ in requests]
    first = tables[0]
    if any(t.group is not first.group or t.shards != first.shards for t in tables):
        raise ValueError("exchange: the tables must be sharded over the same shard group")
    if len({t.dtype for t in tables}) > 1:
        dtypes = sorted(map(str, {t.dtype for t in tables}))
        raise ValueError(f"exchange: tables of one exchange need one dtype, got {dtypes}")
    shards, k, group = first.shards, len(requests), first.group
    flat = [ids.reshape(-1) for _, ids in requests]
    for table, f in zip(tables, flat):
        if f.numel() and (int(f.min()) < 0 or int(f.max()) >= table.num_embeddings):
            raise ValueError(f"table {table.plan.name!r}: ids must lie in [0, {table.num_embeddings}), got "
                             f"{int(f.min())}..{int(f.max())}")
    device = flat[0].device
    sizes = torch.tensor([f.numel() for f in flat], device=device)
    dims = torch.tensor([t.embedding_dim for t in tables], device=device)
    label = torch.repeat_interleave(torch.arange(k, device=device), sizes)
    owner = torch.cat([t.plan.owner_of(f, shards) for t, f in zip(tables, flat)])
    perm = torch.argsort(owner * k + label, stable=True)
    send = torch.bincount(owner * k + label, minlength=shards * k)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_ids, recv_ids = send.view(shards, k).sum(1).tolist(), recv.view(shards, k).sum(1).tolist()
    served_ids = torch.cat(flat).new_empty(sum(recv_ids))
    dist.all_to_all_single(served_ids, torch.cat(flat)[perm], recv_ids, send_ids, group=group)

    # serve: received ids are source-major, request-minor; every row lands in one flat buffer
    served_label = torch.repeat_interleave(torch.arange(k, device=device).repeat(shards), recv)
    served_start = _offsets(dims[served_label])
    served = torch.zeros(int(dims[served_label].sum()), dtype=first.dtype, device=device)
    route = []
    for i, table in enumerate(tables):
        idx = torch.nonzero(served_label == i).flatten()
        weight = table.local_weight()
        if weight is None:    # table-wise, not the owner: serves nothing, but joins the exchange
            if idx.numel():
                raise ValueError(f"table {table.plan.name!r}: ids were routed to a rank that holds none of its rows")
            route.append((table, served_ids.new_empty(0), served_ids.new_empty(0)))
            continue
        local = served_ids[idx] - table.row_start   # looked up even when empty: the weight gets a gradient
        rows = F.embedding(local, weight.detach() if table.row_optimizer is not None else weight)
        positions = _positions(served_start[idx], table.embedding_dim)
        served = served.index_put((positions,), rows.reshape(-1))
        route.append((table, local, positions))
    elems_out = (send.view(shards, k) * dims).sum(1).tolist()     # rows this rank asked for, in elements
    elems_in = (recv.view(shards, k) * dims).sum(1).tolist()      # rows it serves
    anchor = (torch.zeros(0, requires_grad=True),) if torch.is_grad_enabled() else ()
    rows_flat = _RowsAllToAll.apply(served, elems_out, elems_in, group, route, *anchor)

    # unpack: rows arrive in the order the ids were sent (owner-major, request-minor, stable)
    sent_label = label[perm]
    sent_start = _offsets(dims[sent_label])
    request_start = _offsets(sizes)
    out = []
    for i, table in enumerate(tables):
        js = torch.nonzero(sent_label == i).flatten()
        rows = rows_flat[_positions(sent_start[js], table.embedding_dim)].view(js.numel(), table.embedding_dim)
        out.append(rows[torch.argsort(perm[js] - request_start[i])])
    return out
