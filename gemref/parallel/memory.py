"""Bytes a rank holds for parameters, gradients and optimizer state, itemised by part.

Under S-way sharding each rank should hold about 1/S of the model's parameter and optimizer
bytes; what it holds beyond that is itemised: FSDP's dim-0 padding (inside the sharded
parts), parameters that are replicated, and small per-parameter optimizer scalars (AdamW's
step counter). `unsharded_*` are the totals one process would hold.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from ..interop.tables import engine_parameters, uses_torchrec


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else _local(t).numel() * t.element_size()


def placement(p: torch.Tensor) -> str:
    """"sharded" when the tensor is split over a mesh dim with more than one rank, else "replicated"."""
    if isinstance(p, DTensor):
        for dim, pl in enumerate(p.placements):
            if isinstance(pl, Shard) and p.device_mesh.size(dim) > 1:
                return "sharded"
    return "replicated"


def rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """This rank's bytes: totals, and rows per (part, placement); part = "tables" or "dense".

    Optimizer state tensors with as many elements as their parameter count with it (under
    its placement); smaller ones (AdamW's step) are itemised as "optimizer scalars".
    A table-wise sharded table is held whole by its owner (a plain tensor), so it shows
    as "replicated" there and is absent elsewhere. TorchRec's tables (embeddings="torchrec")
    count the shards this rank holds and their Adagrad state, under their plan's sharding type
    as placement (gemref/interop/sharders.py `table_rank_bytes`).
    """
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {"params": 0, "grads": 0, "optimizer": 0,
                                                             "unsharded_params": 0})
    scalars = 0
    unsharded_optimizer = 0
    engine: set[int] = set()
    if uses_torchrec(model):
        from ..interop.sharders import table_rank_bytes

        engine = engine_parameters(model)
        for pl, v in table_rank_bytes(model).items():
            row = rows[("tables", pl)]
            for k in ("params", "grads", "optimizer", "unsharded_params"):
                row[k] += v[k]
            unsharded_optimizer += v["unsharded_optimizer"]
    for name, p in model.named_parameters():
        if id(p) in engine:
            continue
        row = rows[("tables" if name.startswith("tables.") else "dense", placement(p))]
        row["params"] += _nbytes(p)
        row["grads"] += _nbytes(p.grad)
        row["unsharded_params"] += p.numel() * p.element_size()
        for value in (optimizer.state.get(p, {}) if optimizer is not None else {}).values():
            if not isinstance(value, torch.Tensor):
                continue
            if value.numel() == p.numel():
                row["optimizer"] += _nbytes(value)
                unsharded_optimizer += value.numel() * value.element_size()
            else:
                scalars += _nbytes(value)
    for module in model.modules():     # row-wise optimizers (rowwise.py) keep their state per row, outside `optimizer`
        row_optimizer = getattr(module, "row_optimizer", None)
        for state in (row_optimizer.row_state(module) or {}).values() if row_optimizer is not None else ():
            rows[("tables", placement(module.weight))]["optimizer"] += _nbytes(state)
            unsharded_optimizer += module.num_embeddings * math.prod(state.shape[1:]) * state.element_size()
    parts = [{"part": part, "placement": pl, **v} for (part, pl), v in sorted(rows.items())]
    total = {k: sum(r[k] for r in parts) for k in ("params", "grads", "optimizer", "unsharded_params")}
    return {**total, "optimizer_scalars": scalars, "unsharded_optimizer": unsharded_optimizer, "parts": parts}


def global_parameters(model: nn.Module) -> int:
    """Parameters of the whole model, however it is sharded (a table-wise table counts on every rank,
    TorchRec's sharded tables at their full size)."""
    from .sparse import ShardedEmbedding

    total, counted = 0, set()
    for module in model.modules():
        if id(module) in counted:
            continue
        if isinstance(module, ShardedEmbedding):
            total += module.num_embeddings * module.embedding_dim
        elif hasattr(module, "_dmp_wrapped_module"):   # TorchRec's DMP: its state_dict holds the whole tables
            total += sum(math.prod(v.size()) for v in module.state_dict().values())
            counted.update(id(m) for m in module.modules())
        else:
            total += sum(p.numel() for p in module.parameters(recurse=False))
    return total


def table_state_bytes(table_optimizer: str, rows: int, dim: int) -> int:
    """fp32 optimizer-state bytes for `rows` table rows of `dim` columns: adamw 2 x rows x dim x 4
    (two moments per element), rowwise_adagrad rows x 4 (one sum per row), rowwise_adam
    (rows x dim + rows) x 4 (first moment per element, second per row; rowwise.py's state)."""
    from .volume import row_state_values

    return 4 * rows * (2 * dim if table_optimizer == "adamw" else row_state_values(table_optimizer, dim))


def projected_rank_bytes(cfg, mesh, sparse_sharding: str = "none", *, table_optimizer: str = "adamw") -> dict:
    """Bytes of parameters, gradients and optimizer state on the fullest rank, from the config alone.

    fp32 master parameters and gradients (4 bytes each) sharded like the parameters; AdamW keeps
    two fp32 moments (8 bytes per parameter) for the dense parameters, the tables keep what
    `table_optimizer` keeps (`table_state_bytes`; "table_optimizer" in the result). Dense units are
    FSDP-sharded S ways (dim 0 padded); tables follow their sparse plan (or sit in FSDP's root
    unit, dim 0 padded, when not sharded). AdamW tables keep a gradient like the weights; row-wise
    tables keep none (rowwise.py steps their rows inside the backward and drops the gradient).
    Transient gathered parameters, row gradients and activations are not included.
    """
    from .sparse import plan_tables
    from .volume import model_units, padded_numel, table_shapes

    S = mesh.shard
    dense = sum(padded_numel(shape, S) for shapes in model_units(cfg, "row").values() for shape in shapes) // S
    shapes = table_shapes(cfg)
    if sparse_sharding == "none":
        held = [[(-(-rows // S), dim) for rows, dim in shapes.values()]]     # every rank alike
    else:
        plans = plan_tables(shapes, S, sparse_sharding).values()
        held = [[(stop - start, p.dim) for p in plans for start, stop in [p.row_range(s, S)]] for s in range(S)]
    ranks = [(sum(r * d for r, d in rows), sum(table_state_bytes(table_optimizer, r, d) for r, d in rows))
             for rows in held]
    per_weight = 8 if table_optimizer == "adamw" else 4       # fp32 weight (+ its fp32 gradient for AdamW)
    tables, table_state = max(ranks, key=lambda t: per_weight * t[0] + t[1])
    params = dense + tables
    grads = params if table_optimizer == "adamw" else dense
    optimizer = 8 * dense + table_state
    return {"params": 4 * params, "grads": 4 * grads, "optimizer": optimizer, "table_optimizer": table_state,
            "total": 4 * (params + grads) + optimizer}


def _local_bytes(value) -> int:
    """Bytes of this rank's part of a tensor, DTensor, ShardedTensor or nested dict of them."""
    if isinstance(value, dict):
        return sum(_local_bytes(v) for v in value.values())
    if isinstance(value, DTensor):
        value = value.to_local()
    if hasattr(value, "local_shards"):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in value.local_shards())
    if isinstance(value, torch.Tensor) and value.numel() > 1:   # not Adam's step counters
        return value.numel() * value.element_size()
    return 0


def table_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, engine: str) -> tuple[int, int]:
    """(table weight bytes, table optimizer-state bytes) held by this rank: its shards only
    (gemref's row-wise DTensors and TorchRec's ShardedTensors alike), AdamW's step counters left out;
    `engine` is "native" (model.tables' parameters, `optimizer`'s state) or "torchrec" (the tables'
    state_dict, their fused optimizer's state)."""
    if engine == "native":
        params = list(model.tables.parameters())
        rowwise = [s for m in model.tables.modules() if getattr(m, "row_optimizer", None)
                   for s in (m.row_optimizer.row_state(m) or {}).values()]
        return (sum(_local_bytes(p) for p in params),
                sum(_local_bytes(dict(optimizer.state.get(p, {}))) for p in params) + sum(_nbytes(s) for s in rowwise))
    tables = model.tables
    weights = sum(_local_bytes(v) for v in tables.state_dict().values())
    fused = getattr(tables, "fused_optimizer", None)
    return weights, _local_bytes(fused.state_dict()["state"]) if fused is not None else 0
