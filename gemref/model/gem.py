"""GEMRef: a compact GEM-like ranking model (history tower x non-sequence tower x cross exchange).

    history events --embed--> x (rows, d) ----[SequenceBlock]--[CrossBlock]--> ... --> mean pool --+
                                                   ^                |                                |
    sparse ids, ad, dense --embed--> z (B, N, d) --[InteractionBlock]+--> ... ----> flatten -------+--> heads
                                                                                           (click, conversion)

Embedding tables live in `self.tables` (an nn.ModuleDict of nn.Embedding), so parallel/sparse.py
can shard them from outside; the layers live in `self.layers` (an nn.ModuleList of GEMLayer),
the unit that FSDP, activation checkpointing and torch.compile wrap. The model never knows
about parallelism. Two switches change how it runs, not what it computes:
  * `jagged`: keep the history jagged (rung 1) or pad every sample to max_len (baseline);
  * `kernel`: the gdpa kernel used on the jagged layout (rung 2).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

from .config import ModelConfig
from ..data.jagged import JaggedBatch
from .blocks import GEMLayer
from .layout import SequenceLayout

TASKS = ("click", "conversion")


class GEMRef(nn.Module):
    def __init__(self, cfg: ModelConfig, *, jagged: bool = False, kernel: str = "reference"):
        super().__init__()
        self.cfg = cfg
        self.jagged = jagged
        self.kernel = kernel
        d = cfg.d_model
        tables = {"item": cfg.item_vocab, "action": cfg.action_vocab, "time_gap": cfg.time_buckets,
                  "position": cfg.max_len}
        tables.update({f"sparse_{f}": v for f, v in enumerate(cfg.sparse_vocab)})
        self.tables = nn.ModuleDict({name: nn.Embedding(vocab, d) for name, vocab in tables.items()})
        self.dense_proj = nn.Linear(cfg.n_dense, d)
        self.layers = nn.ModuleList(GEMLayer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(d)
        self.final_norm_ns = nn.LayerNorm(d)
        head_in = d * (1 + cfg.n_ns_tokens)
        self.head_hidden = nn.Linear(head_in, 2 * d)
        self.heads = nn.Linear(2 * d, len(TASKS))   # one logit per task
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small embeddings; residual-branch outputs scaled by 1/sqrt(2 * n_layers) (GPT-2
        style) so the residual streams stay O(1) at init however deep the model is."""
        for table in self.tables.values():
            nn.init.normal_(table.weight, std=0.02)
        scale = (2 * self.cfg.n_layers) ** -0.5
        with torch.no_grad():
            for layer in self.layers:
                for w in (layer.sequence.out.weight, layer.sequence.ffn.down.weight,
                          layer.interaction.mlp_out.weight, layer.interaction.lcb,
                          layer.cross.out.weight, layer.cross.summary.weight):
                    w.mul_(scale)

    def checkpoint_blocks(self) -> list[str]:
        """The module paths of the blocks AutoAC (gemref/autoac/) may checkpoint, in forward
        order: "layers.{i}.sequence", "layers.{i}.interaction", "layers.{i}.cross" per layer."""
        return [f"layers.{i}.{kind}" for i in range(len(self.layers)) for kind in ("sequence", "interaction", "cross")]

    def layout(self, batch: JaggedBatch) -> SequenceLayout:
        """The batch's layout, built once per forward and sized from host-side facts (no device
        sync): its longest history as the loader read it, and its rows (values.shape[0], which
        check_model_inputs holds to offsets[-1]). The sharded tables' fused features
        (gemref/train/compose.py) and then the forward get the same one, so the position ids they
        name are the same tensor (checked for free, gemref/parallel/sparse.py)."""
        key = (self.cfg.max_len, self.jagged, self.kernel)
        last = self.__dict__.get("_last_layout")
        if last is not None and last[0]() is batch and last[1] == key:
            return last[2]
        layout = SequenceLayout.build(batch.offsets, self.cfg.max_len, padded=not self.jagged, kernel=self.kernel,
                                      longest=batch.host_max_length, total=batch.num_tokens)
        self.__dict__["_last_layout"] = (weakref.ref(batch), key, layout)
        return layout

    def embed(self, batch: JaggedBatch, layout: SequenceLayout) -> tuple[Tensor, Tensor]:
        """History tokens x (rows, d) and non-sequence tokens z (B, N, d)."""
        t = self.tables
        ids = batch.values
        x = t["item"](ids[:, 0]) + t["action"](ids[:, 1]) + t["time_gap"](ids[:, 2])
        x = layout.to_rows(x) + t["position"](layout.row_position)
        sparse = [t[f"sparse_{f}"](batch.sparse_ids[:, f]) for f in range(self.cfg.n_sparse)]
        z = torch.stack(sparse + [t["item"](batch.ad_ids), self.dense_proj(batch.dense)], dim=1)
        return x, z

    def forward(self, batch: JaggedBatch) -> Tensor:
        """(B, 2) logits: click, conversion. The batch is checked against this model's vocab
        sizes and max_len unless the loader already did (JaggedBatch.check_model_inputs)."""
        if not isinstance(batch, JaggedBatch):
            raise ValueError(f"GEMRef takes a JaggedBatch, got {type(batch).__name__}")
        batch.check_model_inputs(self.cfg)
        try:
            layout = self.layout(batch)
            with record_function("embeddings"):
                x, z = self.embed(batch, layout)
            for layer in self.layers:
                x, z = layer(x, z, layout)
            with record_function("heads"):
                pooled = layout.mean_pool(self.final_norm(x))
                features = torch.cat([pooled, self.final_norm_ns(z).flatten(1)], dim=1)
                return self.heads(F.silu(self.head_hidden(features)))
        finally:   # the layout is shared within one forward (and its fused lookups' pre-hook), never kept past it
            self.__dict__.pop("_last_layout", None)


def ranking_loss(logits: Tensor, labels: Tensor, normalizer: int | None = None) -> Tensor:
    """Binary cross-entropy summed over tasks, averaged over samples.

    `normalizer` divides the summed loss instead of the local batch size: with load-balanced
    ranks holding different sample counts, pass the GLOBAL batch size so the summed gradient
    equals the single-process one.
    """
    per_sample = F.binary_cross_entropy_with_logits(logits.float(), labels.float(),
                                                    reduction="none").sum(1)
    return per_sample.sum() / (normalizer if normalizer is not None else labels.shape[0])
