"""Analytic communication volume of one training step: which collectives, how many payload bytes.

Per rank and step, for a ModelConfig on an RxS mesh (payload bytes as gemref/measure/comm.py records
them: all-gather output, reduce-scatter input, all-reduce tensor, all-to-all input):

  dense, FSDP units = each GEMLayer + the root (the rest; plus the tables if not sharded):
    all_gather     over shard      per unit in forward, and again in backward for every
                                   non-root unit when reshard_after_forward: padded numel x param bytes
    reduce_scatter over shard      per unit: padded numel x reduce bytes
    all_reduce     over replicate  per unit (R > 1, HSDP): padded numel / S x reduce bytes
  sparse, all the K table lookups of a forward in one exchange (row- or table-wise tables, over shard):
    all_to_all     4 per step: counts S x K x 8, ids n x 8, rows m x d x 4 (forward), row grads
                   n x d x 4 (backward), n summed over the lookups (ids this rank looks up), m = ids it serves
    all_reduce     over replicate (R > 1): table_optimizer adamw: this rank's table gradient rows x d x 4,
                   every step; rowwise_adagrad: its rows x (d + 1) x 4 (weights and the row state),
                   rowwise_adam: rows x (2d + 1) x 4 (weights, first moment per element, second per row), once
                   every table_sync_interval steps (count and bytes per step: 1/interval of them)
A collective over one rank moves nothing and is not counted. m (rows a rank serves)
depends on the ids; it is taken as n here, so per-rank sparse figures assume balanced
routing, and summed over a shard group they are exact. Parameter counts come from a
meta-device GEMRef, so this also works for presets that fit no machine (the simulator).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from ..model.config import ModelConfig
from .config import MeshShape
from .sparse import plan_tables

ID_BYTES = 8     # int64 ids and counts


def padded_numel(shape: torch.Size | tuple[int, ...], shards: int) -> int:
    """Elements of a parameter once FSDP pads its dim 0 to a multiple of `shards` (fsdp.py)."""
    if not shape:
        return shards
    rest = 1
    for n in shape[1:]:
        rest *= n
    return -(-shape[0] // shards) * shards * rest


def row_state_values(table_optimizer: str, d: int) -> int:
    """Values of row-wise optimizer state per table row of `d` columns, averaged with the weights
    (rowwise.py): rowwise_adagrad 1 (its sum), rowwise_adam d + 1 (first moment per element, second
    per row); a ValueError for any other name."""
    per_row = {"rowwise_adagrad": 1, "rowwise_adam": d + 1}
    if table_optimizer not in per_row:
        raise ValueError(f"table_optimizer={table_optimizer!r} keeps no row-wise state; valid: {', '.join(per_row)}")
    return per_row[table_optimizer]


def model_units(cfg: ModelConfig, sparse_sharding: str = "none") -> dict[str, list[torch.Size]]:
    """FSDP unit -> parameter shapes ("layers.i" per GEMLayer, "root" for the rest)."""
    from ..model.gem import GEMRef

    with torch.device("meta"):
        model = GEMRef(cfg)
    units: dict[str, list[torch.Size]] = defaultdict(list)
    for name, p in model.named_parameters():
        if name.startswith("tables.") and sparse_sharding != "none":
            continue
        parts = name.split(".")
        units[".".join(parts[:2]) if parts[0] == "layers" else "root"].append(p.shape)
    return dict(units)


def table_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """{table name: (rows, dim)} in GEMRef's order."""
    tables = {"item": cfg.item_vocab, "action": cfg.action_vocab, "time_gap": cfg.time_buckets,
              "position": cfg.max_len}
    tables.update({f"sparse_{f}": v for f, v in enumerate(cfg.sparse_vocab)})
    return {n: (v, cfg.d_model) for n, v in tables.items()}


def lookups(cfg: ModelConfig, batch: int, tokens: int, jagged: bool) -> list[tuple[str, int]]:
    """(table, ids) of every embedding call of one forward, in GEMRef.embed's order."""
    rows = tokens if jagged else batch * cfg.max_len
    calls = [("item", tokens), ("action", tokens), ("time_gap", tokens), ("position", rows)]
    calls += [(f"sparse_{f}", batch) for f in range(cfg.n_sparse)]
    return calls + [("item", batch)]


def step_volume(cfg: ModelConfig, mesh: MeshShape, *, rank: int = 0, batch: int, tokens: int, jagged: bool,
                param_bytes: int = 4, reduce_bytes: int = 4, reshard_after_forward: bool = True,
                sparse_sharding: str = "none", table_optimizer: str = "adamw",
                table_sync_interval: int = 1) -> list[dict]:
    """Rows {kind, dim, group_size, count, bytes} for one step of rank `rank` holding
    `batch` samples with `tokens` history events."""
    R, S = mesh.replicate, mesh.shard
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0])

    def add(kind: str, dim: str, count: float, nbytes: float) -> None:
        if (S if dim == "shard" else R) > 1 and count:
            out[(kind, dim)][0] += count
            out[(kind, dim)][1] += nbytes

    for unit, shapes in model_units(cfg, sparse_sharding).items():
        numel = sum(padded_numel(s, S) for s in shapes)
        gathers = 1 + (reshard_after_forward and unit != "root")
        add("all_gather", "shard", gathers, gathers * numel * param_bytes)
        add("reduce_scatter", "shard", 1, numel * reduce_bytes)
        add("all_reduce", "replicate", 1, numel // S * reduce_bytes)
    if sparse_sharding != "none":
        d, calls = cfg.d_model, lookups(cfg, batch, tokens, jagged)
        n = sum(c for _, c in calls)
        add("all_to_all", "shard", 4, S * len(calls) * ID_BYTES + n * ID_BYTES + 2 * n * d * 4)
        plans = plan_tables(table_shapes(cfg), S, sparse_sharding)
        held = sum(p.local_bytes(mesh.coordinates(rank)[1], S) for p in plans.values())
        if table_optimizer != "adamw":
            add("all_reduce", "replicate", int(held > 0) / table_sync_interval,
                held * (d + row_state_values(table_optimizer, d)) / d / table_sync_interval)
        else:
            add("all_reduce", "replicate", int(held > 0), held)
    group = {"shard": S, "replicate": R}
    return [{"kind": k, "dim": dim, "group_size": group[dim], "count": c, "bytes": b}
            for (k, dim), (c, b) in sorted(out.items())]


def total_bytes(rows: list[dict]) -> int:
    return sum(r["bytes"] for r in rows)
