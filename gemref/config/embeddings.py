"""The embeddings section: native tables or TorchRec's (EC/EBC, sharded by DistributedModelParallel)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .section import Section, switch

EMBEDDING_ENGINES = ("native", "torchrec")                # gemref/interop/tables.py
# every table, EC and EBC alike (table_row_wise: bags only, sequence tables row_wise; gemref/interop/sharders.py)
TORCHREC_SHARDINGS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


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
