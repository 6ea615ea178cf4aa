"""Sharding TorchRecTables over ranks: TorchRec's planner, sharders that list every CPU sharding
type, DistributedModelParallel, and the plan as a record.

The stock CPU sharders leave row_wise and table_row_wise out of the EmbeddingBagCollection's
list; ours list table_wise, row_wise, column_wise and table_row_wise (bags) and table_wise,
row_wise, column_wise (sequence tables: TorchRec has no table_row_wise for an
EmbeddingCollection, so `sharding="table_row_wise"` puts the sequence tables row_wise), all with
compute kernel `fused` (the only CPU kernel of a model-parallel table). `sharding="auto"` lets
EmbeddingShardingPlanner choose per table on a CPU Topology of the world; a named type
constrains every table to it. data_parallel is listed only when named: every rank then holds
every table whole, no fused optimizer (bags: TorchRec's compute kernel `dense`; sequence tables:
plain EmbeddingCollection replicas under DDP, `replicate_sequence_tables` says why), trained by
`sum_then_adagrad`.
DMP shards the tables module only (init_data_parallel=False): gemref's own DDP/FSDP wraps the
dense layers and ignores the tables. As everywhere in gemref, gradients are summed over ranks
(each loss is divided by the global batch): TorchRec's all-to-all backward would divide them by
the world size, so that is switched off (a TorchRec process-wide setting). DMP initialises the
sharded tables afresh; the model's weights are copied back into each rank's shards
(`load_full_weights`).
"""
from __future__ import annotations

import logging
import math
import warnings

import torch
import torch.distributed as dist
from torch import nn

from ..errors import UsageError
from .lib import torchrec
from .tables import ADAGRAD_EPS, ENGINE_ATTR, TABLE_OPTIMIZER, TorchRecTables, with_torchrec_embed

BAG_SHARDINGS = ("table_wise", "row_wise", "column_wise", "table_row_wise")
SEQUENCE_SHARDINGS = ("table_wise", "row_wise", "column_wise")
DATA_PARALLEL = "data_parallel"
DP_STATE = "dp_adagrad_state"   # on the DMP: [(weight, Adagrad state sum)] of sum_then_adagrad's tables


def sequence_sharding(sharding: str) -> str:
    """The sharding type a named `sharding` gives the EmbeddingCollection's (sequence) tables:
    the same, except table_row_wise, which TorchRec offers bags only -> row_wise."""
    return "row_wise" if sharding == "table_row_wise" else sharding


def compute_kernel(sharding: str) -> str:
    """`dense` for data_parallel tables (plain replicated weights), `fused` (fbgemm TBE) otherwise."""
    return "dense" if sharding == DATA_PARALLEL else "fused"


def sharders(lr: float, sharding: str = "auto") -> list:
    """An EBC and an EC sharder listing our CPU sharding types (plus data_parallel when `sharding`
    names it), fused exact Adagrad at `lr` for the model-parallel ones."""
    torchrec()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    extra = [DATA_PARALLEL] if sharding == DATA_PARALLEL else []

    class BagSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(BAG_SHARDINGS) + extra

    class SequenceSharder(EmbeddingCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(SEQUENCE_SHARDINGS) + extra

    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": lr, "eps": ADAGRAD_EPS}
    return [BagSharder(fused_params=dict(fused)), SequenceSharder(fused_params=dict(fused))]


def plan_tables(tables: TorchRecTables, sharding: str, batch_size: int, shard_with: list, group=None, *,
                world: int | None = None, device_type: str = "cpu"):
    """TorchRec's ShardingPlan for `tables` on `world` ranks of `device_type` (default: the
    process group's size, CPU). In a process group every rank gets rank 0's plan; without one
    the plan is made here alone (what a test of the 2D plan does)."""
    torchrec()
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    world = world or dist.get_world_size(group)
    constraints = None
    if sharding != "auto":
        kernel = [compute_kernel(sharding)]
        constraints = {n: ParameterConstraints(sharding_types=[sequence_sharding(sharding)], compute_kernels=kernel)
                       for n, _ in tables.ec.embeddings.named_children()}
        constraints.update({n: ParameterConstraints(sharding_types=[sharding], compute_kernels=kernel)
                            for n, _ in tables.ebc.embedding_bags.named_children()})
    planner_log = logging.getLogger("torchrec.distributed.planner")
    level = planner_log.level
    planner_log.setLevel(logging.ERROR)   # its advice on GPU topologies and dry runs does not apply here
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\.distributed\.planner")
            planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device=device_type,
                                                                 local_world_size=world),
                                               batch_size=batch_size, constraints=constraints, debug=False)
            if group is None and not dist.is_initialized():
                return planner.plan(tables, shard_with)
            return planner.collective_plan(tables, shard_with, group or dist.group.WORLD)
    finally:
        planner_log.setLevel(level)


def two_d_refusal(device_type: str) -> str | None:
    """Why torchrec_2d cannot run on `device_type` (one line), or None on CUDA."""
    if device_type == "cuda":
        return None
    return (f"torchrec_2d: TorchRec's DMPCollection (2D sparse parallel) needs CUDA (torchrec 1.8.0 asserts a cuda "
            f"or mtia device); this run is on {device_type}: drop --torchrec-2d (plain DMP shards over every rank)")


def dmp_collection_refusal() -> str | None:
    """What TorchRec's 2D path, DMPCollection, says when asked to build on a CPU device: the
    message of the assertion it checks first; None if it passed that check."""
    torchrec()
    from torchrec.distributed.model_parallel import DMPCollection

    try:
        DMPCollection(module=torch.nn.Linear(1, 1), device=torch.device("cpu"), plan=None, world_size=2,
                      sharding_group_size=1, global_pg=None)
    except AssertionError as e:
        return str(e)
    except Exception:     # past the device check, stopped by the missing process group
        return None
    return None


def dmp_collection_groups(world: int, shard: int) -> tuple[list[list[int]], list[list[int]]]:
    """(sharding groups, replica groups) of gemref's mesh RxS (R = world / shard), as DMPCollection
    builds them with use_inter_host_allreduce=True: sharding group g is ranks [g S, (g+1) S) (a
    row of gemref's mesh, its FSDP shard dim), replica group j is ranks j, j + S, j + 2S, ... (a
    column: the same shard of every sharding group)."""
    if shard < 1 or world % shard:
        raise ValueError(f"world {world} is not a multiple of the sharding group size {shard}")
    return ([list(range(g * shard, (g + 1) * shard)) for g in range(world // shard)],
            [list(range(j, world, shard)) for j in range(shard)])


def dmp_collection_kwargs(world: int, shard: int) -> dict:
    """The group arguments DMPCollection (torchrec 1.8.0) takes for gemref's mesh RxS: world_size
    R*S, sharding_group_size S, and use_inter_host_allreduce=True, which makes its sharding groups
    the contiguous rows of gemref's mesh (its default, False, strides them: group g = g, g + R, ...)."""
    dmp_collection_groups(world, shard)
    return {"world_size": world, "sharding_group_size": shard, "use_inter_host_allreduce": True}


def sync_replicas(model: nn.Module) -> None:
    """After an optimizer step under torchrec_2d: DMPCollection.sync() averages (ReduceOp.AVG) each
    table shard's weights and Adagrad state over its replica group. A no-op for other engines."""
    tables = getattr(model, "tables", None)
    if hasattr(tables, "sync") and getattr(model, ENGINE_ATTR, {}).get("two_d"):
        tables.sync()


def plan_record(plan) -> dict:
    """{"ec.item": {"sharding": "row_wise", "kernel": "fused", "ranks": [0, 1]}, ...} from a ShardingPlan."""
    out = {}
    for module, params in sorted(plan.plan.items()):
        for table, p in sorted(params.items()):
            out[f"{module}.{table}"] = {"sharding": p.sharding_type, "kernel": p.compute_kernel,
                                        "ranks": sorted(set(p.ranks or []))}
    return out


def local_shards(value) -> list[tuple[tuple[int, int], torch.Tensor]]:
    """[((row, col) offset, tensor)] this rank holds of one table's state_dict value: a
    ShardedTensor's local shards, or the whole table (offset (0, 0)) for a data_parallel table."""
    if isinstance(value, torch.Tensor) and not hasattr(value, "local_shards"):
        return [((0, 0), value)]
    return [(tuple(s.metadata.shard_offsets), s.tensor) for s in value.local_shards()]


def load_full_weights(sharded: nn.Module, full: dict) -> None:
    """Copy each table's full (rows, dim) weight into this rank's shards: DMP initialises the
    sharded tables afresh, so the weights the model was built with are put back."""
    with torch.no_grad():
        for key, value in sharded.state_dict().items():
            weight = full[key.removeprefix("_dmp_wrapped_module.")]
            for (r, c), t in local_shards(value):
                t.copy_(weight[r:r + t.shape[0], c:c + t.shape[1]])


def sum_then_adagrad(sharded: nn.Module, pg, lr: float) -> int:
    """Train data_parallel tables as gemref trains replicated ones; returns how many DDP wrappers
    got the hook (0 without data_parallel tables).

    TorchRec wraps each data_parallel lookup in its own DDP, which AVERAGES gradients over the
    ranks and leaves the step to the user's optimizer. This comm hook replaces both: it all-reduces
    each bucket with SUM (gemref's convention), then takes one exact Adagrad step (lr, ADAGRAD_EPS:
    sum += g^2, w -= lr g / (sqrt(sum) + eps), torch's Adagrad without decay) on the bucket's table
    weights and zeroes their gradients, inside the backward, as the fused kernel does for the other
    sharding types. Same update as the fused kernel's on the same summed gradient; what differs:
    the weights are plain replicated tensors (every rank holds every table, plus a full-size
    fp32 state sum) updated by these torch ops, not fbgemm's TBE, and the state is not in
    TorchRec's fused optimizer."""
    from torch.nn.parallel import DistributedDataParallel

    # a sharded collection keeps its lookups in a plain list (`_lookups`), out of modules()' reach
    found = [m for m in sharded.modules()] + [lookup for m in sharded.modules() for lookup in getattr(m, "_lookups", [])]
    wrappers = list({id(m): m for m in found if isinstance(m, DistributedDataParallel)}.values())
    params = {id(p): p for ddp in wrappers for p in ddp.parameters()}
    state_sums = {pid: torch.zeros_like(p, memory_format=torch.preserve_format) for pid, p in params.items()}

    def hook(_, bucket):
        fut = dist.all_reduce(bucket.buffer(), group=pg, async_op=True).get_future()

        def step(done):
            buffer = done.value()[0]      # all_reduce is in place: the bucket's gradients see the sum
            with torch.no_grad():
                for p, g in zip(bucket.parameters(), bucket.gradients()):
                    total = state_sums[id(p)].addcmul_(g, g)
                    p.addcdiv_(g, total.sqrt().add_(ADAGRAD_EPS), value=-lr)
            return buffer.zero_()
        return fut.then(step)

    for ddp in wrappers:
        ddp.register_comm_hook(None, hook)
    setattr(sharded, DP_STATE, [(params[pid], total) for pid, total in state_sums.items()])
    return len(wrappers)


def replicate_sequence_tables(sharded: nn.Module, pg) -> None:
    """data_parallel sequence tables: the EmbeddingCollection, left out of DMP's plan, wrapped in
    torch's DDP (which sum_then_adagrad then hooks like TorchRec's own data_parallel lookups).

    TorchRec's data_parallel EmbeddingCollection runs compute kernel `dense`, fbgemm's
    DenseTableBatchedEmbeddingBagsCodegen with PoolingMode.NONE, and fbgemm-gpu-cpu 1.8.0's CPU
    op ignores NONE: 5 ids in 3 bags come back as 3 pooled rows, not 5, and the EC's output split
    fails. The replicas here are the EC's own nn.Embedding tables: the same weights on every rank,
    the same summed gradient and Adagrad step."""
    from torch.nn.parallel import DistributedDataParallel

    inner = sharded._dmp_wrapped_module
    inner.ec = DistributedDataParallel(inner.ec, process_group=pg, gradient_as_bucket_view=True)


def use_torchrec_tables(model: nn.Module, *, lr: float, sharding: str = "auto", batch_size: int = 1,
                        group=None, two_d_shard: int | None = None) -> dict:
    """Swap `model.tables` for TorchRecTables (same weights) and, in a process group, shard them
    with DMP over all its ranks, or with `two_d_shard` = S, TorchRec's 2D sparse parallel
    (DMPCollection): the tables sharded over each S-rank sharding group (`dmp_collection_groups`)
    on a plan made for S ranks, replicated over the R = world / S groups, the replicas averaged
    by `sync_replicas` after every optimizer step. Returns the record of the engine: optimizer
    and per-table plan (2D: the plan of the first sharding group, ranks 0..S-1).

    The 2D path was NOT run here (no GPU; DMPCollection asserts CUDA): its arguments, groups and
    plan are tested on CPU (tests/test_torchrec_2d.py), the construction, forward and sync are not.
    Its training differs from the 1D engine's by design: each sharding group's fused Adagrad
    applies the gradient of that group's ranks only, and sync() averages the R replicas' weights
    and state, so a table row moves by about the mean of R partial updates, not by the update
    of the summed gradient (gemref's convention elsewhere)."""
    tables = TorchRecTables(model.tables)
    device = next(tables.parameters()).device
    if two_d_shard is not None:
        refusal = two_d_refusal(device.type)
        if refusal:
            raise UsageError(refusal)
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

    pg, shard_with = group or dist.group.WORLD, sharders(lr, sharding)
    if two_d_shard is not None:
        from torchrec.distributed.model_parallel import DMPCollection

        plan = plan_tables(tables, sharding, batch_size, shard_with, pg, world=two_d_shard, device_type=device.type)
        record["plan"] = plan_record(plan)        # before DMPCollection remaps it to this rank's group
        full = {k: v.detach().clone() for k, v in tables.state_dict().items()}
        model.tables = DMPCollection(module=tables, device=device, plan=plan, global_pg=pg, sharders=shard_with,
                                     init_data_parallel=False,
                                     **dmp_collection_kwargs(dist.get_world_size(pg), two_d_shard))
        load_full_weights(model.tables, full)
        record.update(sharding=sharding, two_d={"sharding_group_size": two_d_shard,
                                                "world_size": dist.get_world_size(pg)})
        setattr(model, ENGINE_ATTR, record)
        with_torchrec_embed(model)
        return record
    plan = plan_tables(tables, sharding, batch_size, shard_with, pg)
    replicated = {}
    if sharding == DATA_PARALLEL:   # the sequence tables stay plain EC replicas (replicate_sequence_tables)
        del plan.plan["ec"]
        replicated = {f"ec.{n}": {"sharding": DATA_PARALLEL, "kernel": "torch", "ranks": list(range(dist.get_world_size(pg)))}
                      for n, _ in tables.ec.embeddings.named_children()}
    full = {k: v.detach().clone() for k, v in tables.state_dict().items()}
    model.tables = DistributedModelParallel(tables, env=ShardingEnv.from_process_group(pg), device=device,
                                            plan=plan, sharders=shard_with, init_data_parallel=False)
    load_full_weights(model.tables, full)
    if replicated:
        replicate_sequence_tables(model.tables, pg)
    sum_then_adagrad(model.tables, pg, lr)
    record["plan"] = dict(sorted({**plan_record(plan), **replicated}.items()))
    record["sharding"] = sharding
    setattr(model, ENGINE_ATTR, record)
    with_torchrec_embed(model)
    return record


def _table_of(key: str) -> str:
    """"ec.item" from a state_dict key such as "_dmp_wrapped_module.ec.module.embeddings.item.weight"."""
    parts = key.split(".")
    return f"{'ec' if 'ec' in parts else 'ebc'}.{parts[-2]}"


def _nbytes(t) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the whole tensor) of a ShardedTensor or a plain tensor."""
    if hasattr(t, "local_shards"):
        whole = math.prod(t.size()) * torch.empty((), dtype=t.metadata().tensor_properties.dtype).element_size()
        return sum(s.tensor.numel() * s.tensor.element_size() for s in t.local_shards()), whole
    return t.numel() * t.element_size(), t.numel() * t.element_size()


def table_rank_bytes(model: nn.Module) -> dict[str, dict[str, int]]:
    """This rank's TorchRec table bytes per placement (the plan's sharding type: row_wise,
    table_wise, ..., data_parallel, unsharded): {"params", "grads", "optimizer",
    "unsharded_params", "unsharded_optimizer"}, in bytes.

    params: the local shards of each table (a ShardedTensor's local_shards(); a data_parallel or
    unsharded table whole); optimizer: the Adagrad state sum kept for them (fused kernel:
    momentum1's local shards; data_parallel: sum_then_adagrad's sums; one process: torch's
    in-backward Adagrad "sum"; the step counters are not counted); grads: gradients the tables
    hold (none under the fused kernel, which applies them in the backward). `unsharded_*`: the
    whole tables', as one process would hold them."""
    record = getattr(model, ENGINE_ATTR)
    placement = {name: entry["sharding"] for name, entry in record["plan"].items()}
    out: dict[str, dict[str, int]] = {}

    def row(table: str) -> dict[str, int]:
        return out.setdefault(placement[table], {"params": 0, "grads": 0, "optimizer": 0,
                                                 "unsharded_params": 0, "unsharded_optimizer": 0})

    tables = model.tables
    for key, value in tables.state_dict().items():
        local, full = _nbytes(value)
        r = row(_table_of(key))
        r["params"] += local
        r["unsharded_params"] += full
    dp_state = getattr(tables, DP_STATE, [])
    for p, total in dp_state:   # data_parallel: TorchRec's flat weights or the EC's, every rank holds all
        r = out.setdefault(DATA_PARALLEL, {k: 0 for k in ("params", "grads", "optimizer", "unsharded_params",
                                                          "unsharded_optimizer")})
        r["grads"] += 0 if p.grad is None else p.grad.numel() * p.grad.element_size()
        r["optimizer"] += total.numel() * total.element_size()
        r["unsharded_optimizer"] += total.numel() * total.element_size()
    for name, p in tables.named_parameters():
        if p.grad is not None and placement[_table_of(name)] != DATA_PARALLEL:   # DP: counted above (the
            # EBC's per-table slices are views of its flat weight's gradient)
            row(_table_of(name))["grads"] += p.grad.numel() * p.grad.element_size()
        for opt in getattr(p, "_in_backward_optimizers", []):   # one process: torch's Adagrad
            state = opt.state.get(p, {}).get("sum")
            if state is not None:
                r = row(_table_of(name))
                r["optimizer"] += state.numel() * state.element_size()
                r["unsharded_optimizer"] += state.numel() * state.element_size()
    if hasattr(tables, "fused_optimizer"):
        for key, state in tables.fused_optimizer.state_dict()["state"].items():
            for name, value in state.items():
                if name.endswith("momentum1"):
                    local, full = _nbytes(value)
                    r = row(_table_of(key))
                    r["optimizer"] += local
                    r["unsharded_optimizer"] += full
    return out
