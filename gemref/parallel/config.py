"""Rung 6's sections of a run's config: `ParallelConfig` (the RxS mesh, FSDP's resharding, the native
tables' sharding and optimizer, the backend) and `EmbeddingConfig` (native tables or TorchRec's,
gemref/interop/). No torch: the command line reads them without loading parallelism."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

SPARSE_SHARDINGS = ("none", "row", "table")               # gemref/parallel/sparse.py
BACKENDS = ("auto", "gloo", "nccl", "ncclx")              # gemref/parallel/backend.py
TABLE_OPTIMIZERS = ("adamw", "rowwise_adagrad", "rowwise_adam")   # gemref/parallel/rowwise.py
TABLE_LR = 0.01                                           # table_lr's default (ParallelConfig)
EMBEDDING_ENGINES = ("native", "torchrec")                # gemref/interop/tables.py
# every table, EC and EBC alike (table_row_wise: bags only, sequence tables row_wise; gemref/interop/sharders.py)
TORCHREC_SHARDINGS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


@dataclass(frozen=True)
class MeshShape:
    """A 2D device mesh RxS (gemref/parallel/mesh.py builds it): R replica groups of S shards."""

    replicate: int   # R: groups holding a full copy of the (sharded) parameters
    shard: int       # S: ranks a parameter is split across

    @property
    def world(self) -> int:
        return self.replicate * self.shard

    def coordinates(self, rank: int) -> tuple[int, int]:
        return divmod(rank, self.shard)    # (replicate index, shard index) of a global rank

    def __str__(self) -> str:
        return f"{self.replicate}x{self.shard}"


def parse_mesh(spec: str) -> MeshShape:
    """"RxS" -> MeshShape; anything else is a UsageError naming the field."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(spec))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UsageError(f"mesh={spec!r} must look like RxS with R, S >= 1 (e.g. 1x4, 2x2, 4x1)")
    return MeshShape(int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True)
class ParallelConfig(Section):
    mesh: str = switch("1x1", "mesh", "rung 6: RxS mesh, R replica groups x S-way sharding (with --ranks N or "
                       "torchrun: default 1xN, FSDP over all ranks)")
    reshard_after_forward: bool = switch(True, "reshard_after_forward", "FSDP: free gathered parameters after "
                                         "forward (--no-...: keep them for backward, more memory, less traffic)")
    sparse_sharding: str = switch("none", "sparse_sharding", "rung 6: shard the embedding tables", SPARSE_SHARDINGS)
    backend: str = switch("auto", "backend", "collectives (auto: nccl on cuda, gloo on cpu)", BACKENDS)
    table_optimizer: str = switch("adamw", "table_optimizer", "native tables: adamw (with the dense layers; R > 1 "
                                  "replicas sum their table gradients every step), rowwise_adagrad (TorchRec's: one "
                                  "accumulator per row, touched rows only, stepped inside backward) or rowwise_adam "
                                  "(fbgemm's partial row-wise Adam: first moment per element, second per row)",
                                  TABLE_OPTIMIZERS)
    table_sync_interval: int = switch(1, "table_sync_interval", "row-wise tables on a mesh RxS with R > 1: average "
                                      "the table replicas (weights and row state) every N steps (DMPCollection's "
                                      "sync interval; 1: every step)")
    # TorchRec/fbgemm fused table optimizers take their own learning rate; 0.01 is the default of
    # fbgemm_gpu.split_table_batched_embeddings_ops_training.SplitTableBatchedEmbeddingBagsCodegen
    # (learning_rate=0.01, its API docs) and of torchrec.optim.rowwise_adagrad.RowWiseAdagrad (lr=1e-2)
    table_lr: float = switch(TABLE_LR, "table_lr", "row-wise tables' learning rate (their own, as fbgemm's fused "
                             "optimizers; adamw tables use --lr)")

    def check(self) -> None:
        parse_mesh(self.mesh)
        if self.table_sync_interval < 1:
            raise UsageError(f"table_sync_interval must be >= 1, got {self.table_sync_interval}")
        if self.table_lr <= 0:
            raise UsageError(f"table_lr must be > 0, got {self.table_lr}")
        if self.table_lr != TABLE_LR and self.table_optimizer == "adamw":
            raise UsageError(f"table_lr={self.table_lr} is read only with table_optimizer='rowwise_adagrad' or "
                             f"'rowwise_adam' (adamw tables train at the dense lr)")
        if self.table_sync_interval != 1 and self.table_optimizer == "adamw":
            raise UsageError(f"table_sync_interval={self.table_sync_interval} is read only with "
                             f"table_optimizer='rowwise_adagrad' or 'rowwise_adam' (adamw tables sum their "
                             f"replicas' gradients every step)")

    @property
    def shape(self) -> MeshShape:
        return parse_mesh(self.mesh)


@dataclass(frozen=True)
class EmbeddingConfig(Section):
    engine: str = switch("native", "embeddings", "embedding engine: native tables, or TorchRec's "
                         "EmbeddingCollection/EmbeddingBagCollection (sharded by DistributedModelParallel with "
                         "--ranks)", EMBEDDING_ENGINES)
    torchrec_sharding: str = switch("auto", "torchrec_sharding", "with --embeddings torchrec and ranks: auto "
                                    "(TorchRec's planner) or one sharding type for every table (table_row_wise: the "
                                    "bag tables; sequence tables then row_wise)", TORCHREC_SHARDINGS)
    torchrec_2d: bool = switch(False, "torchrec_2d", "with --embeddings torchrec and --mesh RxS (R, S >= 2): "
                               "TorchRec's 2D sparse parallel (DMPCollection): tables sharded over each S-rank row "
                               "of the mesh, replicated over the R rows, replicas averaged after every step; CUDA only")

    def check(self) -> None:
        if self.engine == "native" and self.torchrec_sharding != "auto":
            raise UsageError(f"torchrec_sharding={self.torchrec_sharding!r} is read only with embeddings='torchrec'")
        if self.torchrec_2d and self.engine != "torchrec":
            raise UsageError("torchrec_2d is TorchRec's 2D sparse parallel: it needs embeddings='torchrec'")
        if self.torchrec_2d and self.torchrec_sharding == "data_parallel":
            raise UsageError("torchrec_2d with torchrec_sharding='data_parallel' would replicate the tables "
                             "inside each sharding group too: pick a model-parallel type (or auto)")
