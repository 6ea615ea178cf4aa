"""Row-wise Adagrad for embedding tables, stepped inside the backward (chapter 07_fsdp_2d).

Production trains tables the way TorchRec does (fbgemm's EXACT_ROWWISE_ADAGRAD, "fused"): one
accumulator per ROW, and only the rows a batch touched move. For a touched row i with summed
gradient g_i (d elements):

    state_i += mean(g_i ** 2)              one float per row (AdamW keeps 2 per element)
    w_i     -= lr * g_i / (sqrt(state_i) + eps)

Rows the batch did not look up keep their weights and state (AdamW moves every row each step).
`RowWiseAdagrad(tables, lr, eps, sync_interval)` attaches to tables and steps them inside
`loss.backward()`; the dense parameters keep their own optimizer:

  * a ShardedEmbedding (sparse.py): its exchange hands the owner (local row ids, row gradients) in
    backward (lookup.py); the rows are summed per unique id and stepped in a callback queued at the
    end of the backward. No dense gradient of the table is formed.
  * a plain nn.Embedding / nn.EmbeddingBag (one process, the parity reference): a forward pre-hook
    records the ids, the weight's post-accumulate-grad hook steps the recorded rows and drops the
    (dense) gradient. Same math, so one process and ranks can be compared.

Each backward is one step (a table looked up twice in a forward is stepped once, on the sum).

2D (mesh RxS, R > 1), as TorchRec's DMPCollection: each replica group (a mesh row) steps its own
tables from its own part of the batch; every `sync_interval` steps the weights AND the
accumulators are averaged over "replicate" (one flat all-reduce, SUM / R). That is a mean of R
partial updates, not today's summed-gradient step (`sync_replica_grads`, kept for AdamW tables:
one update from the gradient of the whole global batch, the single-process step); between syncs
the replicas differ. Units: lr per step, state in squared gradient units, interval in steps.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from .sparse import ShardedEmbedding, check_table

TABLE_TYPES = (nn.Embedding, nn.EmbeddingBag, ShardedEmbedding)


def rowwise_adagrad_update(weight: Tensor, state: Tensor, ids: Tensor, grads: Tensor, lr: float,
                           eps: float) -> Tensor:
    """In place: the row-wise Adagrad step of the rows `ids` (repeats allowed: their gradient rows
    are summed); returns the unique rows stepped."""
    rows, inverse = torch.unique(ids, return_inverse=True)
    g = grads.new_zeros((rows.numel(), grads.shape[1])).index_add_(0, inverse, grads)
    with torch.no_grad():
        state[rows] += g.pow(2).mean(1)
        weight[rows] -= lr * g / (state[rows].sqrt() + eps)[:, None]
    return rows


class RowWiseAdagrad:
    """Row-wise Adagrad attached to `tables` (module doc): a mapping or list of nn.Embedding,
    nn.EmbeddingBag or ShardedEmbedding modules, or a module whose tables are found by type.
    Nothing to call per step: it steps inside backward. Leave the tables out of the dense optimizer."""

    def __init__(self, tables: Mapping[str, nn.Module] | Iterable[nn.Module] | nn.Module, lr: float,
                 eps: float = 1e-8, sync_interval: int = 1):
        if isinstance(tables, TABLE_TYPES):
            found = [tables]
        elif isinstance(tables, nn.Module):
            found = [m for m in tables.modules() if isinstance(m, TABLE_TYPES)]
        else:
            found = list(tables.values() if isinstance(tables, Mapping) else tables)
        if not found:
            raise ValueError("RowWiseAdagrad needs the embedding tables to train (nn.Embedding, nn.EmbeddingBag or "
                             "ShardedEmbedding), got none")
        for i, t in enumerate(found):
            if not isinstance(t, TABLE_TYPES):
                raise ValueError(f"RowWiseAdagrad: table {i} is a {type(t).__name__}, not nn.Embedding, "
                                 f"nn.EmbeddingBag or ShardedEmbedding")
        if lr <= 0 or eps <= 0 or sync_interval < 1:
            raise ValueError(f"RowWiseAdagrad needs lr > 0, eps > 0 and sync_interval >= 1, got {lr}, {eps}, "
                             f"{sync_interval}")
        self.lr, self.eps, self.sync_interval = lr, eps, sync_interval
        self.tables, self.steps, self.syncs, self.synced_bytes = found, 0, 0, 0   # synced_bytes: all-reduced so far
        self.state: dict[int, Tensor] = {}        # id(table) -> (local rows,) accumulator
        self._stash: dict[int, list[tuple[Tensor, Tensor]]] = {}
        self._queued = False
        for t in found:       # the last RowWiseAdagrad attached to a table steps it (earlier ones step nothing)
            if not isinstance(t, ShardedEmbedding):
                check_table(type(t).__name__, t)
                t.register_forward_pre_hook(self._record_ids)
                t.weight.register_post_accumulate_grad_hook(self._plain_hook(t))
            t.row_optimizer = self

    # ------------------------------------------------------------------ state
    @staticmethod
    def _local(table: nn.Module) -> Tensor | None:
        w = table.weight
        return w.detach().to_local() if isinstance(w, DTensor) else (w.detach() if w is not None else None)

    def accumulator(self, table: nn.Module) -> Tensor | None:
        """The table's (local rows,) accumulator, zeros until its first step; None where it holds no rows."""
        w = self._local(table)
        if w is None:
            return None
        if id(table) not in self.state:
            self.state[id(table)] = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        return self.state[id(table)]

    # ------------------------------------------------------------------ plain tables
    def _record_ids(self, module: nn.Module, args) -> None:
        if torch.is_grad_enabled() and module.row_optimizer is self:
            self._stash.setdefault(id(module), []).append((args[0].detach().reshape(-1), None))

    def _plain_hook(self, table: nn.Module):
        def hook(param: Tensor) -> None:
            if table.row_optimizer is not self:
                return
            seen = self._stash.pop(id(table), [])
            if seen:
                ids = torch.cat([i for i, _ in seen])
                rows = torch.unique(ids)
                rowwise_adagrad_update(param.detach(), self.accumulator(table), rows, param.grad[rows], self.lr,
                                       self.eps)
            param.grad = None
        return hook

    # ------------------------------------------------------------------ sharded tables
    def stash(self, table: ShardedEmbedding, local_ids: Tensor, grads: Tensor) -> None:
        """Called by the exchange's backward with the rows this rank owns; stepped at the backward's end."""
        self._stash.setdefault(id(table), []).append((local_ids, grads))
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        self._queued = False
        for t in self.tables:
            seen = self._stash.pop(id(t), []) if isinstance(t, ShardedEmbedding) and t.row_optimizer is self else []
            w = self._local(t)
            if seen and w is not None:
                rowwise_adagrad_update(w, self.accumulator(t), torch.cat([i for i, _ in seen]),
                                       torch.cat([g for _, g in seen]), self.lr, self.eps)
        self.steps += 1
        if self.steps % self.sync_interval == 0:
            self.sync_replicas()

    def sync_replicas(self) -> None:
        """Average the sharded tables' weights and accumulators over the mesh's "replicate" dim
        (one flat all-reduce); nothing where R = 1. Every rank of a replicate group holds the same
        shard index, hence the same rows, so the buffers line up."""
        sharded = [t for t in self.tables if isinstance(t, ShardedEmbedding) and t.replicas > 1]
        if not sharded:
            return
        held = [t for t in sharded if self._local(t) is not None]
        parts = [x for t in held for x in (self._local(t), self.accumulator(t))]
        self.syncs += 1
        if not parts:
            return
        flat = torch.cat([p.reshape(-1) for p in parts])
        self.synced_bytes += flat.numel() * flat.element_size()
        dist.all_reduce(flat, group=sharded[0].replicate_group)
        flat /= sharded[0].replicas
        torch._foreach_copy_(parts, [f.view_as(p) for f, p in zip(flat.split([p.numel() for p in parts]), parts)])

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on this rank (one element per local row)."""
        return sum(s.numel() * s.element_size() for s in self.state.values())
