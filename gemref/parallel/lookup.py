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
own order, so both sides can unpack without sending any index: the buffers are cut into segments
(rank s, request k) whose sizes the counts give, so each table is looked up once and its rows
concatenated, with no scatter into a shared buffer. The host waits for the device once per
exchange, for the counts (the all-to-alls' split sizes); nothing else reads a value or sizes an
output by the data (tests/test_parallel_sparse.py counts it).

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
    def forward(ctx, served: Tensor, out_splits: list[int], in_splits: list[int], group, route,
                segments: list[int], *anchor):
        ctx.splits, ctx.group, ctx.route, ctx.segments = (out_splits, in_splits), group, route, segments
        out = served.new_empty(sum(out_splits))
        dist.all_to_all_single(out, served.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        grad_served = grad.new_empty(sum(in_splits))
        dist.all_to_all_single(grad_served, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        k = len(ctx.route)
        pieces = grad_served.split(ctx.segments) if any(t.row_optimizer is not None for t, _ in ctx.route) else ()
        for i, (table, local_ids) in enumerate(ctx.route):
            if table.row_optimizer is not None:   # its rows' gradients: segments (source s, request i)
                rows = torch.cat(pieces[i::k]).view(local_ids.numel(), table.embedding_dim)
                table.row_optimizer.stash(table, local_ids, rows)
            else:
                table.unsynced = table.replicas > 1
        return (grad_served,) + (None,) * (len(ctx.needs_input_grad) - 1)


def _out_of_range(tables, flat, sources: list[int], own_bad: bool) -> str:
    """The error of an exchange in which some rank of the shard group asked for rows that do not exist."""
    if own_bad:
        for table, f in zip(tables, flat):
            if f.numel() and (int(f.min()) < 0 or int(f.max()) >= table.num_embeddings):
                return (f"table {table.plan.name!r}: ids must lie in [0, {table.num_embeddings}), got "
                        f"{int(f.min())}..{int(f.max())}")
    return (f"exchange: shard rank(s) {sources} of this shard group looked up ids outside their tables "
            f"(that rank names the table); no rows were exchanged")


def exchange(requests: Sequence[tuple[object, Tensor]]) -> list[Tensor]:
    """Rows (n_k, d_k) for each request (table, 1D ids), the tables sharing one shard group: one
    counts, one ids and one rows all-to-all (module doc).

    One host sync: the counts' `.tolist()` (the all-to-alls' split sizes; every other size is
    derived from them on the host). Ids outside a table are counted on the device and travel
    with the counts, so every rank of the group raises the ValueError together (none is left
    waiting in the next all-to-all)."""
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
    sizes, dims = [f.numel() for f in flat], [t.embedding_dim for t in tables]
    device = flat[0].device
    ids = torch.cat(flat)
    label = torch.cat([torch.full((n,), i, dtype=torch.int64, device=device) for i, n in enumerate(sizes)])
    bad = torch.stack([((f < 0) | (f >= t.num_embeddings)).sum() for t, f in zip(tables, flat)]).sum()
    owner = torch.cat([t.plan.owner_of(f, shards) for t, f in zip(tables, flat)]).clamp(0, shards - 1)
    key = owner * k + label
    perm = torch.argsort(key, stable=True)                    # owner-major, request-minor, stable
    send = key.new_zeros(shards * k).index_add_(0, key, torch.ones_like(key)).view(shards, k)
    send = torch.cat([send, bad.reshape(1, 1).expand(shards, 1)], 1)   # each destination: K counts, bad ids
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    counts = torch.cat([send, recv]).tolist()                 # the one host sync (split sizes)
    send_n, recv_n = [row[:k] for row in counts[:shards]], [row[:k] for row in counts[shards:]]
    sources = [s for s, row in enumerate(counts[shards:]) if row[k]]
    if sources:
        raise ValueError(_out_of_range(tables, flat, sources, bool(counts[0][k])))
    served_ids = ids.new_empty(sum(map(sum, recv_n)))
    dist.all_to_all_single(served_ids, ids[perm], [sum(r) for r in recv_n], [sum(r) for r in send_n], group=group)

    # serve: received ids come in segments (source s, request i), source-major; each request's
    # segments are looked up at once and the rows laid out in the same segment order, flattened
    id_segments = served_ids.split([n for row in recv_n for n in row])
    row_segments: list[Tensor] = [served_ids.new_empty(0, dtype=first.dtype)] * (shards * k)
    route = []
    for i, table in enumerate(tables):
        weight = table.local_weight()
        served = [recv_n[s][i] for s in range(shards)]
        if weight is None:    # table-wise, not the owner: serves nothing, but joins the exchange
            if sum(served):
                raise ValueError(f"table {table.plan.name!r}: ids were routed to a rank that holds none of its rows")
            route.append((table, served_ids.new_empty(0)))
            continue
        local = torch.cat(id_segments[i::k]) - table.row_start   # looked up even when empty: the weight gets a gradient
        rows = F.embedding(local, weight.detach() if table.row_optimizer is not None else weight)
        for s, part in enumerate(rows.split(served)):
            row_segments[s * k + i] = part.reshape(-1)
        route.append((table, local))
    elems_out = [sum(n * d for n, d in zip(row, dims)) for row in send_n]   # rows this rank asked for, in elements
    elems_in = [sum(n * d for n, d in zip(row, dims)) for row in recv_n]    # rows it serves
    anchor = (torch.zeros(0, requires_grad=True),) if torch.is_grad_enabled() else ()
    rows_flat = _RowsAllToAll.apply(torch.cat(row_segments), elems_out, elems_in, group, route,
                                    [n * d for row in recv_n for n, d in zip(row, dims)], *anchor)

    # unpack: rows arrive in the order the ids were sent, in segments (owner s, request i); a
    # request's segments hold its rows sorted by owner (stable), put back in request order
    segments = rows_flat.split([n * d for row in send_n for n, d in zip(row, dims)])
    by_request = perm[torch.argsort(label[perm], stable=True)].split(sizes)   # request-major, owner order
    out, start = [], 0
    for i, (table, order) in enumerate(zip(tables, by_request)):
        rows = torch.cat(segments[i::k]).view(sizes[i], dims[i])
        out.append(rows.new_empty(rows.shape).index_copy(0, order - start, rows))
        start += sizes[i]
    return out
