"""TorchRec as the embedding engine: a GEMRef's tables as one EmbeddingCollection + one EmbeddingBagCollection.

`use_torchrec_tables(model, ...)` swaps `model.tables` (nn.Embedding per table) for
`TorchRecTables` with the same initial weights, from outside (the model code does not change):
  * history tables `item`, `action`, `time_gap`, `position` -> an EmbeddingCollection (unpooled
    sequence lookups); `item` serves two features, the history's `item` and the candidate `ad`;
  * non-sequence tables `sparse_f` -> an EmbeddingBagCollection (one id per sample, SUM pooling).
One KeyedJaggedTensor per collection per step. With a process group the module is sharded by
DistributedModelParallel over every rank (sharders.py: plan, sharders); its dense layers stay
gemref's (DDP or FSDP, which ignore these tables).

Optimizer: TorchRec's CPU kernel (fbgemm TBE, compute kernel `fused`) updates the rows inside the
backward, with SGD or Adagrad only (fbgemm's CPU TBE has no Adam). The tables therefore train with
exact Adagrad (lr = TrainConfig.lr, eps ADAGRAD_EPS), fused when sharded and through torch's
in-backward Adagrad in one process; the dense layers keep AdamW. Native tables train with AdamW,
so the two engines give equal steps only with the same table optimizer (tests/test_torchrec_parity.py
gives the native tables torch Adagrad).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..data.jagged import HISTORY_FIELDS
from .kjt import AD_KEY, sparse_keys
from .lib import torchrec

ADAGRAD_EPS = 1e-8            # fbgemm's default; torch's Adagrad is given the same
TABLE_OPTIMIZER = "exact_adagrad"
POSITION_KEY = "position"
ENGINE_ATTR = "torchrec_engine"   # the record use_torchrec_tables leaves on the model
SEQUENCE_TABLES = HISTORY_FIELDS + (POSITION_KEY,)   # table names; `item` also serves AD_KEY


class TorchRecTables(nn.Module):
    """Called as `tables(batch, layout, dense_proj)` -> (x (rows, d), z (B, N, d)), what GEMRef.embed returns."""

    def __init__(self, tables: nn.ModuleDict):
        super().__init__()
        trec = torchrec()
        device = tables["item"].weight.device
        self.n_sparse = sum(name.startswith("sparse_") for name in tables)
        seq = [trec.EmbeddingConfig(name=n, num_embeddings=tables[n].num_embeddings,
                                    embedding_dim=tables[n].embedding_dim,
                                    feature_names=[n, AD_KEY] if n == "item" else [n]) for n in SEQUENCE_TABLES]
        bags = [trec.EmbeddingBagConfig(name=n, num_embeddings=tables[n].num_embeddings,
                                        embedding_dim=tables[n].embedding_dim, feature_names=[n],
                                        pooling=trec.PoolingType.SUM) for n in sparse_keys(self.n_sparse)]
        self.ec = trec.EmbeddingCollection(tables=seq, device=device)
        self.ebc = trec.EmbeddingBagCollection(tables=bags, device=device)
        with torch.no_grad():
            for n in SEQUENCE_TABLES:
                self.ec.embeddings[n].weight.copy_(tables[n].weight)
            for n in sparse_keys(self.n_sparse):
                self.ebc.embedding_bags[n].weight.copy_(tables[n].weight)

    def forward(self, batch, layout, dense_proj: nn.Module) -> tuple[Tensor, Tensor]:
        trec = torchrec()
        ids, B = batch.values, batch.batch_size
        lengths = batch.lengths
        rows = torch.full_like(lengths, layout.max_len) if layout.padded else lengths
        ones = torch.ones(B, dtype=torch.int64, device=lengths.device)
        seq = trec.KeyedJaggedTensor(
            keys=list(SEQUENCE_TABLES) + [AD_KEY],
            values=torch.cat([ids[:, 0], ids[:, 1], ids[:, 2], layout.row_position, batch.ad_ids]),
            lengths=torch.cat([lengths, lengths, lengths, rows, ones]), stride=B)
        bags = trec.KeyedJaggedTensor(keys=list(sparse_keys(self.n_sparse)), values=batch.sparse_ids.t().reshape(-1),
                                      lengths=ones.repeat(self.n_sparse), stride=B)
        looked_up, pooled = self.ec(seq), self.ebc(bags)
        x = looked_up["item"].values() + looked_up["action"].values() + looked_up["time_gap"].values()
        x = layout.to_rows(x) + looked_up[POSITION_KEY].values()
        # a KeyedTensor read by key: a sharded EBC's keys come in shard-placement order
        sparse = [pooled[k] for k in sparse_keys(self.n_sparse)]
        z = torch.stack(sparse + [looked_up[AD_KEY].values(), dense_proj(batch.dense)], dim=1)
        return x, z


class TorchRecEmbed:
    """Mixin put in front of the model's class (as FSDP2's fully_shard does): `embed` asks the tables."""

    def embed(self, batch, layout):
        return self.tables(batch, layout, self.dense_proj)


def with_torchrec_embed(model: nn.Module) -> None:
    cls = type(model)
    if not issubclass(cls, TorchRecEmbed):
        model.__class__ = type(f"TorchRec{cls.__name__}", (TorchRecEmbed, cls), {})


def uses_torchrec(model: nn.Module) -> bool:
    return isinstance(model, TorchRecEmbed)


def engine_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters TorchRec's optimizer updates (every other optimizer must leave them)."""
    return {id(p) for p in model.tables.parameters()} if uses_torchrec(model) else set()


def engine_record(model: nn.Module) -> dict | None:
    """What use_torchrec_tables recorded (engine, optimizer, per-table plan); None for native tables."""
    return getattr(model, ENGINE_ATTR, None)
