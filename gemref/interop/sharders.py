"""Sharding TorchRecTables over ranks: TorchRec's planner, sharders that list every CPU sharding
type, DistributedModelParallel, and the plan as a record.

The stock CPU sharders leave row_wise and table_row_wise out of the EmbeddingBagCollection's
list; ours list table_wise, row_wise, column_wise and table_row_wise (bags) and table_wise,
row_wise, column_wise (sequence tables), all with compute kernel `fused` (the only CPU kernel of
a model-parallel table). data_parallel is left out: its tables would need the dense layers'
all-reduce and optimizer, which here never see the tables. `sharding="auto"` lets
EmbeddingShardingPlanner choose per table on a CPU Topology of the world; a named type
constrains every table to it. DMP shards the tables module only (init_data_parallel=False):
gemref's own DDP/FSDP wraps the dense layers and ignores the tables. As everywhere in gemref,
gradients are summed over ranks (each loss is divided by the global batch): TorchRec's
all-to-all backward would divide them by the world size, so that is switched off (a TorchRec
process-wide setting). DMP initialises the sharded tables afresh; the model's weights are
copied back into each rank's shards (`load_full_weights`).
"""
from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist
from torch import nn

from .lib import torchrec
from .tables import ADAGRAD_EPS, ENGINE_ATTR, TABLE_OPTIMIZER, TorchRecTables, with_torchrec_embed

BAG_SHARDINGS = ("table_wise", "row_wise", "column_wise", "table_row_wise")
SEQUENCE_SHARDINGS = ("table_wise", "row_wise", "column_wise")


def sharders(lr: float) -> list:
    """An EBC and an EC sharder listing our CPU sharding types, fused exact Adagrad at `lr`."""
    torchrec()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class BagSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(BAG_SHARDINGS)

    class SequenceSharder(EmbeddingCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(SEQUENCE_SHARDINGS)

    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": lr, "eps": ADAGRAD_EPS}
    return [BagSharder(fused_params=dict(fused)), SequenceSharder(fused_params=dict(fused))]


def plan_tables(tables: TorchRecTables, sharding: str, batch_size: int, shard_with: list, group=None):
    """TorchRec's ShardingPlan for `tables` over the process group (every rank gets rank 0's plan)."""
    torchrec()
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    world = dist.get_world_size(group)
    constraints = None
    if sharding != "auto":
        names = [n for n, _ in tables.ec.embeddings.named_children()] + \
            [n for n, _ in tables.ebc.embedding_bags.named_children()]
        constraints = {n: ParameterConstraints(sharding_types=[sharding], compute_kernels=["fused"]) for n in names}
    planner_log = logging.getLogger("torchrec.distributed.planner")
    level = planner_log.level
    planner_log.setLevel(logging.ERROR)   # its advice on GPU topologies and dry runs does not apply here
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\.distributed\.planner")
            planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu",
                                                                 local_world_size=world),
                                               batch_size=batch_size, constraints=constraints, debug=False)
            return planner.collective_plan(tables, shard_with, group or dist.group.WORLD)
    finally:
        planner_log.setLevel(level)


def plan_record(plan) -> dict:
    """{"ec.item": {"sharding": "row_wise", "kernel": "fused", "ranks": [0, 1]}, ...} from a ShardingPlan."""
    out = {}
    for module, params in sorted(plan.plan.items()):
        for table, p in sorted(params.items()):
            out[f"{module}.{table}"] = {"sharding": p.sharding_type, "kernel": p.compute_kernel,
                                        "ranks": sorted(set(p.ranks or []))}
    return out


def load_full_weights(sharded: nn.Module, full: dict) -> None:
    """Copy each table's full (rows, dim) weight into this rank's shards: DMP initialises the
    sharded tables afresh, so the weights the model was built with are put back."""
    with torch.no_grad():
        for key, value in sharded.state_dict().items():
            weight = full[key.removeprefix("_dmp_wrapped_module.")]
            for shard in value.local_shards():
                (r, c), t = shard.metadata.shard_offsets, shard.tensor
                t.copy_(weight[r:r + t.shape[0], c:c + t.shape[1]])


def use_torchrec_tables(model: nn.Module, *, lr: float, sharding: str = "auto", batch_size: int = 1,
                        group=None) -> dict:
    """Swap `model.tables` for TorchRecTables (same weights) and, in a process group, shard them
    with DMP over all its ranks. Returns the record of the engine: optimizer and per-table plan."""
    tables = TorchRecTables(model.tables)
    device = next(tables.parameters()).device
    record = {"engine": "torchrec", "optimizer": TABLE_OPTIMIZER, "lr": lr, "eps": ADAGRAD_EPS}
    if group is None and not dist.is_initialized():
        from torch.distributed.optim import _apply_optimizer_in_backward

        _apply_optimizer_in_backward(torch.optim.Adagrad, tables.parameters(), {"lr": lr, "eps": ADAGRAD_EPS})
        model.tables = tables
        setattr(model, ENGINE_ATTR, record)
        record["plan"] = {f"{m}.{n}": {"sharding": "unsharded", "kernel": "torch", "ranks": [0]}
                          for m, coll in (("ec", tables.ec.embeddings), ("ebc", tables.ebc.embedding_bags))
                          for n, _ in coll.named_children()}
        with_torchrec_embed(model)
        return record
    from torchrec.distributed.comm_ops import set_gradient_division
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    set_gradient_division(False)   # gemref sums gradients over ranks; TorchRec's default divides by the world

    pg, shard_with = group or dist.group.WORLD, sharders(lr)
    plan = plan_tables(tables, sharding, batch_size, shard_with, pg)
    full = {k: v.detach().clone() for k, v in tables.state_dict().items()}
    model.tables = DistributedModelParallel(tables, env=ShardingEnv.from_process_group(pg), device=device,
                                            plan=plan, sharders=shard_with, init_data_parallel=False)
    load_full_weights(model.tables, full)
    record["plan"] = plan_record(plan)
    record["sharding"] = sharding
    setattr(model, ENGINE_ATTR, record)
    with_torchrec_embed(model)
    return record
