"""Embedding tables sharded over the mesh's "shard" dim, replicated over "replicate" (chapter 07_fsdp_2d).

Tables are most of a ranking model's bytes and few of its FLOPs, so they are never gathered: each
rank of a shard group (S ranks, a mesh row) holds one of S row blocks of every table ("row":
DTensor Shard(0) chunks, which torch.distributed.checkpoint reshards) or whole tables ("table":
largest first onto the least-loaded rank). A lookup of any number of tables (`exchange`) sends
each id to its row's owner and the rows back: all-to-alls of the counts (S x K), the ids and the
rows forward, of the row gradients backward; one host sync, the counts (the split sizes).
`shard_tables(model, mesh, names, mode)` swaps the named nn.Embedding / nn.EmbeddingBag modules of
any model for ShardedEmbeddings (a bag pools on the asking rank); `fuse_lookups` makes a forward's
lookups one exchange. Replicas (R > 1): AdamW tables need `sync_replica_grads(tables, mesh)` after
every backward (else the next training forward refuses); a row-wise optimizer (rowwise.py) gets
the served rows' gradients in backward instead. Units: rows, elements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor


@dataclass(frozen=True)
class TablePlan:
    name: str
    rows: int
    dim: int
    mode: str            # "row" or "table"
    owner: int = -1      # table-wise: the shard index holding the whole table

    def row_range(self, shard_index: int, shards: int) -> tuple[int, int]:
        """[start, stop) of the rows shard rank `shard_index` holds."""
        if self.mode == "table":
            return (0, self.rows) if shard_index == self.owner else (0, 0)
        chunk = -(-self.rows // shards)
        start = min(self.rows, shard_index * chunk)
        return start, min(self.rows, start + chunk)

    def owner_of(self, ids: Tensor, shards: int) -> Tensor:
        """The shard index holding each id's row."""
        return torch.full_like(ids, self.owner) if self.mode == "table" else ids // -(-self.rows // shards)

    def local_bytes(self, shard_index: int, shards: int, element_size: int = 4) -> int:
        start, stop = self.row_range(shard_index, shards)
        return (stop - start) * self.dim * element_size


def plan_tables(tables: dict[str, tuple[int, int]], shards: int, mode: str) -> dict[str, TablePlan]:
    """{name: (rows, dim)} -> {name: TablePlan} over S shard ranks, "row" or "table" (LPT by bytes)."""
    if mode not in ("row", "table"):
        raise ValueError(f"sparse_sharding={mode!r} has no plan; valid plans: row, table")
    loads, owner = [0] * shards, {}
    for name in sorted(tables, key=lambda n: (-tables[n][0] * tables[n][1], n)) if mode == "table" else ():
        owner[name] = min(range(shards), key=lambda s: (loads[s], s))
        loads[owner[name]] += tables[name][0] * tables[name][1]
    return {n: TablePlan(n, r, d, mode, owner.get(n, -1)) for n, (r, d) in tables.items()}


def find_modules(model: nn.Module, names: Sequence[str], what: str) -> dict[str, nn.Module]:
    """{name: module} of `model` for fully qualified `names` of `what` ("tables", "layers"): ValueError
    naming none given, a missing one, the root or a repeat."""
    if not names:
        raise ValueError(f"sharding {type(model).__name__} needs the names of the {what} to shard (got none)")
    if len(set(names)) != len(names) or "" in names:
        raise ValueError(f"{what} {list(names)}: each must name a submodule (not the root) once")
    found = {}
    for name in names:
        try:
            found[name] = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{what[:-1]} {name!r}: no such module in {type(model).__name__}") from None
    return found


def check_table(name: str, module: nn.Module) -> None:
    """ValueError unless `module` is an nn.Embedding / nn.EmbeddingBag that ShardedEmbedding reproduces."""
    if not isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        raise ValueError(f"table {name!r} is a {type(module).__name__}; shard_tables shards nn.Embedding and "
                         f"nn.EmbeddingBag modules only")
    unsupported = [opt for opt, on in (("padding_idx", module.padding_idx is not None),
                                       ("max_norm", module.max_norm is not None),
                                       ("scale_grad_by_freq", module.scale_grad_by_freq), ("sparse", module.sparse),
                                       ("mode='max'", getattr(module, "mode", "sum") == "max")) if on]
    if unsupported:
        raise ValueError(f"table {name!r} uses {', '.join(unsupported)}, which ShardedEmbedding does not implement")


class ShardedEmbedding(nn.Module):
    """An nn.Embedding or nn.EmbeddingBag whose rows live on the ranks of a shard group, called like
    the original (a bag: `(ids, offsets=None, per_sample_weights=None)`, 1D ids with offsets or 2D)."""

    def __init__(self, table: nn.Embedding | nn.EmbeddingBag, plan: TablePlan, mesh: DeviceMesh):
        super().__init__()
        check_table(plan.name, table)
        self.plan, self.num_embeddings, self.embedding_dim = plan, table.num_embeddings, table.embedding_dim
        self.bag = table.mode if isinstance(table, nn.EmbeddingBag) else None
        self.include_last_offset, self.dtype = getattr(table, "include_last_offset", False), table.weight.dtype
        self.group, self.shards = mesh.get_group("shard"), mesh.size(1)
        self.shard_index, self.replicas = mesh.get_local_rank("shard"), mesh.size(0)
        self.row_start = plan.row_range(self.shard_index, self.shards)[0]
        self.replicate_group = mesh.get_group("replicate") if self.replicas > 1 else None
        self.unsynced = False        # a backward left gradients not yet summed over "replicate"
        self.row_optimizer = None    # a row-wise optimizer (rowwise.py) taking this table's row gradients
        self.fused = False           # fuse_lookups fetches this table's rows for the whole forward
        self.prefetched: list[tuple[Tensor, Tensor]] = []   # (ids named by the features, their rows)
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

    def lookup(self, ids: Tensor) -> Tensor:
        """Rows (N, d) of the N ids (any shape): those fuse_lookups fetched for this call, else one exchange."""
        if self.prefetched:
            named, rows = self.prefetched.pop(0)
            if not _same_ids(named, ids):
                raise ValueError(f"table {self.plan.name!r}: called with other ids than fuse_lookups' features "
                                 f"named for this call (a features function must list each table's calls in order)")
            return rows
        if self.fused:
            raise ValueError(f"table {self.plan.name!r} is looked up inside a fused model forward, but "
                             f"fuse_lookups' features named no (more) ids for it")
        return exchange([(self, ids.reshape(-1))])[0]

    def forward(self, ids: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
        name = self.plan.name
        if self.unsynced and torch.is_grad_enabled():
            raise ValueError(f"table {name!r}: the gradients of the last backward were never summed over the "
                             f"mesh's 'replicate' dim (R={self.replicas}): call sync_replica_grads(tables, mesh) "
                             f"after every backward, before the optimizer step")
        if self.bag is None:
            if offsets is not None or per_sample_weights is not None:
                raise ValueError(f"table {name!r} is an nn.Embedding: it takes no offsets or weights")
            return self.lookup(ids).view(*ids.shape, self.embedding_dim)
        rows = self.lookup(ids)
        if per_sample_weights is not None:
            if self.bag != "sum":
                raise ValueError(f"table {name!r}: per_sample_weights need mode='sum', not {self.bag!r}")
            rows = rows * per_sample_weights.reshape(-1, 1).to(rows.dtype)
        if (ids.dim() == 2) == (offsets is not None):
            raise ValueError(f"table {name!r} is an nn.EmbeddingBag: 1D ids need offsets, 2D ids (fixed-size bags) "
                             f"take none")
        last = self.include_last_offset and offsets is not None
        if offsets is None:
            offsets = torch.arange(ids.shape[0], device=ids.device) * ids.shape[1]
        ends = offsets[1:] if last else torch.cat([offsets[1:], offsets.new_full((1,), ids.numel())])
        starts, lengths = offsets[:ends.numel()], ends - offsets[:ends.numel()]
        # each row's bag: the last one starting at or before it (an empty bag starts where the next does)
        bag = torch.searchsorted(starts, torch.arange(rows.shape[0], device=rows.device), right=True) - 1
        pooled = rows.new_zeros(lengths.numel(), self.embedding_dim).index_add(0, bag, rows)
        return pooled / lengths.clamp(min=1)[:, None].to(pooled.dtype) if self.bag == "mean" else pooled

    def extra_repr(self) -> str:
        start, stop = self.plan.row_range(self.shard_index, self.shards)
        kind = f", bag {self.bag}" if self.bag else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{kind}, {self.plan.mode}-wise, rows [{start}, {stop})"


def _same_ids(named: Tensor, ids: Tensor) -> bool:
    """The same view of the same memory (free: GEMRef's features pass the forward's own views), else
    equal values (torch.equal: a host sync on a GPU)."""
    view = lambda t: (t.shape, t.stride(), t.dtype, t.device, t.data_ptr())   # noqa: E731
    return named is ids or view(named) == view(ids) or \
        (named.numel() == ids.numel() and torch.equal(named.reshape(-1), ids.reshape(-1)))


def shard_tables(model: nn.Module, mesh: DeviceMesh, tables: Sequence[str], mode: str) -> dict[str, ShardedEmbedding]:
    """Replace each module named in `tables` (fully qualified, e.g. "tables.item") by a ShardedEmbedding
    planned `mode` ("row" or "table"; "none": nothing) over the mesh's "shard" dim; return
    {name: ShardedEmbedding}, what `sync_replica_grads` syncs (fsdp.py `apply_fsdp` leaves them out)."""
    if mode == "none":
        return {}
    found = find_modules(model, tables, "tables")
    for name, table in found.items():
        check_table(name, table)
    sharded = {}
    for name, plan in plan_tables({n: (t.num_embeddings, t.embedding_dim) for n, t in found.items()},
                                  mesh.size(1), mode).items():
        parent, _, leaf = name.rpartition(".")
        sharded[name] = ShardedEmbedding(found[name], plan, mesh)
        setattr(model.get_submodule(parent), leaf, sharded[name])
    return sharded


def _sharded(tables, who: str) -> list[ShardedEmbedding]:
    found = [m for m in tables.modules() if isinstance(m, ShardedEmbedding)] if isinstance(tables, nn.Module) \
        else list(tables.values() if isinstance(tables, Mapping) else tables)
    if not all(isinstance(t, ShardedEmbedding) for t in found):
        raise ValueError(f"{who} takes ShardedEmbedding tables (what shard_tables returns)")
    return found


def sync_replica_grads(tables: Mapping[str, ShardedEmbedding] | Iterable[ShardedEmbedding] | nn.Module,
                       mesh: DeviceMesh) -> None:
    """Sum the table gradients of the R replicas: one flat all-reduce over "replicate" (the ranks of a
    replicate group hold the same rows). `tables`: what shard_tables returned, or a module holding
    them. R = 1: nothing to do; R > 1 and no table: ValueError."""
    found = _sharded(tables, "sync_replica_grads")
    if any(t.row_optimizer is not None for t in found):
        raise ValueError("sync_replica_grads sums table gradients, but these tables train with a row-wise optimizer "
                         "(no gradient is formed; it averages the replicas every sync_interval steps)")
    if mesh.size(0) == 1:
        return
    if not found:
        raise ValueError(f"mesh {mesh.size(0)}x{mesh.size(1)} has R > 1 replicas but no sharded table was given to "
                         f"sync: pass the tables shard_tables returned")
    for t in found:
        t.unsynced = False
    grads = [t.weight.grad for t in found if t.weight is not None and t.weight.grad is not None]
    grads = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=mesh.get_group("replicate"))
        torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]), grads)])


def fuse_lookups(model: nn.Module, tables: Mapping[str, ShardedEmbedding],
                 features: Callable[..., Mapping[str, Sequence[Tensor]]]):
    """One exchange for all the tables' lookups of a model forward (as TorchRec's input/output
    distributions), not one per lookup. `features(*args, **kwargs)` gets the forward's arguments and
    returns {table name: [the ids of each call, in call order]}; each call then takes its rows
    (checked: the same ids). A call not named, or a named call not made, is a ValueError. Returns the
    forward pre-hook's handle (`.remove()` unfuses)."""
    if not tables:
        raise ValueError("fuse_lookups needs the sharded tables (what shard_tables returned), got none")
    _sharded(tables, "fuse_lookups")

    def prefetch(module, args, kwargs):
        wanted = features(*args, **kwargs)
        missing = sorted(set(wanted) - set(tables))
        if missing:
            raise ValueError(f"fuse_lookups: features named {missing}, which are not among the sharded tables "
                             f"{sorted(tables)}")
        left = [n for n, t in tables.items() if t.prefetched]
        if left:
            raise ValueError(f"fuse_lookups: the last forward did not make every lookup its features named "
                             f"(tables {left})")
        named = [(tables[n], ids) for n in tables for ids in wanted.get(n, ())]
        for (table, ids), rows in zip(named, exchange([(t, ids.reshape(-1)) for t, ids in named])):
            table.prefetched.append((ids, rows))

    for t in tables.values():
        t.fused = True
    return model.register_forward_pre_hook(prefetch, with_kwargs=True)


# ----------------------------------------------------------------------------- the exchange

class _RowsAllToAll(torch.autograd.Function):
    """all_to_all_single of flattened rows; backward sends the gradient back and hands the served
    rows' gradients to the tables' row optimizers (`stash`), or marks the other tables `unsynced`."""

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
        pieces = grad_served.split(ctx.segments)
        for i, (table, local_ids) in enumerate(ctx.route):
            if table.row_optimizer is not None:   # its rows' gradients: segments (source s, request i)
                rows = torch.cat(pieces[i::k]).view(local_ids.numel(), table.embedding_dim)
                table.row_optimizer.stash(table, local_ids, rows)
            else:
                table.unsynced = table.replicas > 1
        return (grad_served,) + (None,) * (len(ctx.needs_input_grad) - 1)


def exchange(requests: Sequence[tuple[ShardedEmbedding, Tensor]]) -> list[Tensor]:
    """Rows (n_k, d_k) for each request (table, 1D ids) of one shard group. Sent ids are ordered (owner,
    request), so both sides cut the buffers into segments by the counts alone. Ids outside a table are
    counted on the device and travel with the counts: the whole group raises (none is left waiting)."""
    if not requests:
        return []
    tables = [t for t, _ in requests]
    first = tables[0]
    if any(t.group is not first.group or t.shards != first.shards or t.dtype != first.dtype for t in tables):
        raise ValueError("exchange: the tables of one exchange need one shard group and one dtype")
    shards, k, group = first.shards, len(requests), first.group
    flat = [ids.reshape(-1) for _, ids in requests]
    sizes, dims = [f.numel() for f in flat], [t.embedding_dim for t in tables]
    ids = torch.cat(flat)
    label = torch.cat([torch.full((n,), i, dtype=torch.int64, device=ids.device) for i, n in enumerate(sizes)])
    bad = torch.stack([((f < 0) | (f >= t.num_embeddings)).sum() for t, f in zip(tables, flat)]).sum()
    key = torch.cat([t.plan.owner_of(f, shards) for t, f in zip(tables, flat)]).clamp(0, shards - 1) * k + label
    perm = torch.argsort(key, stable=True)                    # owner-major, request-minor, stable
    send = key.new_zeros(shards * k).index_add_(0, key, torch.ones_like(key)).view(shards, k)
    send = torch.cat([send, bad.reshape(1, 1).expand(shards, 1)], 1)   # to each rank: K counts, bad ids
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    counts = torch.cat([send, recv]).tolist()                 # the one host sync
    send_n, recv_n = [row[:k] for row in counts[:shards]], [row[:k] for row in counts[shards:]]
    sources = [s for s, row in enumerate(counts[shards:]) if row[k]]
    if counts[0][k]:
        for table, f in zip(tables, flat):
            if f.numel() and (int(f.min()) < 0 or int(f.max()) >= table.num_embeddings):
                raise ValueError(f"table {table.plan.name!r}: ids must lie in [0, {table.num_embeddings}), got "
                                 f"{int(f.min())}..{int(f.max())}")
    if sources:
        raise ValueError(f"exchange: shard rank(s) {sources} of this shard group looked up ids outside their "
                         f"tables (that rank names the table); no rows were exchanged")
    served_ids = ids.new_empty(sum(map(sum, recv_n)))
    dist.all_to_all_single(served_ids, ids[perm], [sum(r) for r in recv_n], [sum(r) for r in send_n], group=group)

    # serve: segments (source s, request i), source-major; a request's segments are looked up at once
    id_segments = served_ids.split([n for row in recv_n for n in row])
    row_segments: list[Tensor] = [served_ids.new_empty(0, dtype=first.dtype)] * (shards * k)
    route = []
    for i, table in enumerate(tables):
        weight, served = table.local_weight(), [recv_n[s][i] for s in range(shards)]
        if weight is None:    # table-wise, not the owner: serves nothing (owner_of sent it no id)
            route.append((table, served_ids.new_empty(0)))
            continue
        local = torch.cat(id_segments[i::k]) - table.row_start   # looked up even when empty: the weight gets a gradient
        rows = F.embedding(local, weight.detach() if table.row_optimizer is not None else weight)
        for s, part in enumerate(rows.split(served)):
            row_segments[s * k + i] = part.reshape(-1)
        route.append((table, local))
    elems = lambda per_rank: [sum(n * d for n, d in zip(row, dims)) for row in per_rank]   # noqa: E731
    anchor = (torch.zeros(0, requires_grad=True),) if torch.is_grad_enabled() else ()
    rows_flat = _RowsAllToAll.apply(torch.cat(row_segments), elems(send_n), elems(recv_n), group, route,
                                    [n * d for row in recv_n for n, d in zip(row, dims)], *anchor)

    # unpack: segments (owner s, request i); a request's rows, sorted by owner, go back to its order
    segments = rows_flat.split([n * d for row in send_n for n, d in zip(row, dims)])
    by_request = perm[torch.argsort(label[perm], stable=True)].split(sizes)
    out, start = [], 0
    for i, order in enumerate(by_request):
        rows = torch.cat(segments[i::k]).view(sizes[i], dims[i])
        out.append(rows.new_empty(rows.shape).index_copy(0, order - start, rows))
        start += sizes[i]
    return out
