"""2D sparse parallelism (chapter 07_fsdp_2d): tables sharded across "shard", replicated across "replicate".

Embedding tables are most of a ranking model's bytes and few of its FLOPs, so they are
never all-gathered: each rank keeps a slice of every table (row-wise) or whole tables
(table-wise), and a lookup sends the ids to the rank that owns their rows and the rows back:

    ids --bucket by owner--> all-to-all (counts, ids) --> local lookup --> all-to-all (rows)
                                                                  backward: all-to-all (row grads)

An nn.EmbeddingBag's ids travel the same way; its rows are pooled (sum or mean, per-sample
weights with sum) on the rank that asked, after the rows come back. Options the sharded
lookup does not reproduce (padding_idx, max_norm, scale_grad_by_freq, sparse, mode="max")
are refused by name. Sizes: rows and dims in elements, `local_bytes` in bytes.

The all-to-alls run inside a shard group (S ranks, one mesh row; lookup.py `exchange`, which
`fuse_lookups` makes one per forward for all tables), so the R groups are replicas of each other.
Tables trained by AdamW: after every backward the caller runs `sync_replica_grads(tables, mesh)`,
which sums the tables' gradients across the "replicate" dim (one flat all-reduce). With R > 1 a
table whose gradient was never summed refuses its next training forward (ValueError): its
replicas would otherwise drift apart with nothing said. Tables with a `RowWiseAdagrad`
(rowwise.py) form no gradient: it steps them inside backward and averages the replicas every
`sync_interval` steps. Either way the optimizer state is sharded the same way as the tables.

Plans (`plan_tables`):
  * row: every table split into S contiguous row blocks of ceil(V/S) rows (the chunking of
    DTensor's Shard(0), so the weights are DTensors [Replicate(), Shard(0)] that
    torch.distributed.checkpoint saves and reshards like any other);
  * table: whole tables placed by bytes, largest first onto the least-loaded shard rank
    (LPT); owners hold a plain parameter, other ranks hold none.
`shard_tables(model, mesh, tables, mode)` swaps the modules named by `tables` (fully qualified
names of nn.Embedding / nn.EmbeddingBag modules, any model) for `ShardedEmbedding`s from
outside, and returns them; the model code does not change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from .config import SPARSE_SHARDINGS
from .lookup import exchange


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
    """An nn.Embedding or nn.EmbeddingBag whose rows live on the ranks of a shard group; called
    like the original (a bag: `(ids, offsets=None, per_sample_weights=None)`, ids 1D with
    offsets or 2D fixed-size bags)."""

    def __init__(self, table: nn.Embedding | nn.EmbeddingBag, plan: TablePlan, mesh: DeviceMesh):
        super().__init__()
        check_table(plan.name, table)
        self.plan, self.num_embeddings, self.embedding_dim = plan, table.num_embeddings, table.embedding_dim
        self.bag = getattr(table, "mode", None) if isinstance(table, nn.EmbeddingBag) else None
        self.include_last_offset = getattr(table, "include_last_offset", False)
        self.dtype = table.weight.dtype
        self.group, self.shards = mesh.get_group("shard"), mesh.size(1)
        self.shard_index, self.replicas = mesh.get_local_rank("shard"), mesh.size(0)
        self.row_start = plan.row_range(self.shard_index, self.shards)[0]
        self.replicate_group = mesh.get_group("replicate") if self.replicas > 1 else None
        self.unsynced = False        # a backward left gradients not yet summed over "replicate"
        self.row_optimizer = None    # a RowWiseAdagrad (rowwise.py) taking this table's row gradients
        self.fused = False           # fuse_lookups fetches this table's rows for the whole model
        self.prefetched: list[tuple[Tensor, Tensor]] = []
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
        """Rows (N, d) of the ids (any shape, N of them), served by their owners: the rows
        `fuse_lookups` fetched for this call (checked: the same ids, module doc), or one exchange
        of this table alone."""
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
        if self.unsynced and torch.is_grad_enabled():
            raise ValueError(f"table {self.plan.name!r}: the gradients of the last backward were never summed over "
                             f"the mesh's 'replicate' dim (R={self.replicas}): call sync_replica_grads(tables, mesh) "
                             f"after every backward, before the optimizer step")
        if self.bag is None:
            if offsets is not None or per_sample_weights is not None:
                raise ValueError(f"table {self.plan.name!r} is an nn.Embedding: it takes no offsets or weights")
            return self.lookup(ids).view(*ids.shape, self.embedding_dim)
        rows = self.lookup(ids)
        if per_sample_weights is not None:
            if self.bag != "sum":
                raise ValueError(f"table {self.plan.name!r}: per_sample_weights need mode='sum', not {self.bag!r}")
            rows = rows * per_sample_weights.reshape(-1, 1).to(rows.dtype)
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError(f"table {self.plan.name!r}: 2D ids are fixed-size bags and take no offsets")
            lengths = ids.new_full((ids.shape[0],), ids.shape[1])
            starts = torch.arange(ids.shape[0], device=ids.device) * ids.shape[1]
        else:
            if offsets is None:
                raise ValueError(f"table {self.plan.name!r} is an nn.EmbeddingBag: 1D ids need offsets")
            ends = offsets[1:] if self.include_last_offset else \
                torch.cat([offsets[1:], offsets.new_full((1,), ids.numel())])
            starts = offsets[:ends.numel()]
            lengths = ends - starts
        # each row's bag: the last one starting at or before it (empty bags start where the next does)
        bag = torch.searchsorted(starts, torch.arange(rows.shape[0], device=rows.device), right=True) - 1
        pooled = rows.new_zeros(lengths.numel(), self.embedding_dim).index_add(0, bag, rows)
        return pooled / lengths.clamp(min=1)[:, None].to(pooled.dtype) if self.bag == "mean" else pooled

    def extra_repr(self) -> str:
        start, stop = self.plan.row_range(self.shard_index, self.shards)
        kind = f", bag {self.bag}" if self.bag else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{kind}, {self.plan.mode}-wise, rows [{start}, {stop})"


def _same_ids(named: Tensor, ids: Tensor) -> bool:
    """Whether a lookup's `ids` are those its features `named`: the same view of the same memory
    (free, no host sync: GEMRef's features pass the forward's own views), else compared by value
    (torch.equal: on a GPU, a host sync)."""
    if named is ids or (named.shape == ids.shape and named.stride() == ids.stride() and named.dtype == ids.dtype
                        and named.device == ids.device and named.data_ptr() == ids.data_ptr()):
        return True
    return named.numel() == ids.numel() and torch.equal(named.reshape(-1), ids.reshape(-1))


def shard_tables(model: nn.Module, mesh: DeviceMesh, tables: Sequence[str], mode: str) -> dict[str, ShardedEmbedding]:
    """Replace each module named in `tables` (fully qualified names, e.g. "item" or "tables.item")
    by a ShardedEmbedding planned row- or table-wise over the mesh's "shard" dim; return
    {name: ShardedEmbedding}, what `sync_replica_grads` syncs. Their parameters are what FSDP
    must ignore (gemref/parallel/fsdp.py `apply_fsdp` finds them itself). mode "none": {}.
    """
    if mode not in SPARSE_SHARDINGS:
        raise ValueError(f"sparse_sharding={mode!r}; valid: {', '.join(SPARSE_SHARDINGS)}")
    if mode == "none":
        return {}
    if not tables:
        raise ValueError(f"sparse_sharding={mode!r} needs the names of the tables to shard (got none)")
    found = {}
    for name in tables:
        try:
            found[name] = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"table {name!r}: no such module in {type(model).__name__}") from None
        check_table(name, found[name])
    plans = plan_tables({n: (t.num_embeddings, t.embedding_dim) for n, t in found.items()}, mesh.size(1), mode)
    sharded = {}
    for name, plan in plans.items():
        parent, _, leaf = name.rpartition(".")
        sharded[name] = ShardedEmbedding(found[name], plan, mesh)
        setattr(model.get_submodule(parent), leaf, sharded[name])
    return sharded


def sync_replica_grads(tables: Mapping[str, ShardedEmbedding] | Iterable[ShardedEmbedding] | nn.Module,
                       mesh: DeviceMesh) -> None:
    """Sum the table gradients of the R replicas (one flat all-reduce over "replicate").

    `tables`: what shard_tables returned, or a module holding ShardedEmbeddings (found by type).
    R = 1: nothing to sum. R > 1 with no sharded table given: ValueError. Every rank of a
    replicate group holds the same shard index, hence the same tables and row ranges, so the
    flat buffers line up.
    """
    found = _sharded(tables, "sync_replica_grads")
    if any(t.row_optimizer is not None for t in found):
        raise ValueError("sync_replica_grads sums table gradients, but these tables train with a row-wise optimizer "
                         "(no gradient is formed; RowWiseAdagrad averages the replicas every sync_interval steps)")
    if mesh.size(0) == 1:
        return
    if not found:
        raise ValueError(f"mesh {mesh.size(0)}x{mesh.size(1)} has R > 1 replicas but no sharded table was given to "
                         f"sync: pass the tables shard_tables returned")
    for t in found:
        t.unsynced = False
    grads = [t.weight.grad for t in found if t.weight is not None and t.weight.grad is not None]
    grads = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=mesh.get_group("replicate"))
    torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]), grads)])


def _sharded(tables, who: str) -> list[ShardedEmbedding]:
    if isinstance(tables, nn.Module):
        found = [m for m in tables.modules() if isinstance(m, ShardedEmbedding)]
    else:
        found = list(tables.values() if isinstance(tables, Mapping) else tables)
    if not all(isinstance(t, ShardedEmbedding) for t in found):
        raise ValueError(f"{who} takes ShardedEmbedding tables (what shard_tables returns)")
    return found


def fuse_lookups(model: nn.Module, tables: Mapping[str, ShardedEmbedding],
                 features: Callable[..., Mapping[str, Sequence[Tensor]]]):
    """One exchange (one ids and one rows all-to-all, one backward) for all the tables' lookups of
    a model forward, as TorchRec's input/output distributions do, instead of one per lookup.

    `features(*args, **kwargs)` gets the model's forward arguments and returns {table name (a key of
    `tables`): [the ids of each call of that table, in call order]}; a forward pre-hook on `model`
    runs one `exchange` for all of them and each call then takes its rows (checked: same ids).
    A call the features did not name, or a named call the forward did not make, is a ValueError.
    Returns the hook's handle (`.remove()` unfuses).
    """
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
        rows = exchange([(table, ids.reshape(-1)) for table, ids in named])
        for (table, ids), r in zip(named, rows):
            table.prefetched.append((ids, r))

    for t in tables.values():
        t.fused = True
    return model.register_forward_pre_hook(prefetch, with_kwargs=True)
