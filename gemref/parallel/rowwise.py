"""Row-wise optimizers for embedding tables, stepped inside the backward (chapter 07_fsdp_2d).

Production trains tables the way TorchRec does (fbgemm's fused "split table batched embeddings"
optimizers): only the rows a batch touched move, and the second moment is kept per ROW. For a
touched row i with summed gradient g_i (d elements) at optimizer step t (1, 2, ...):

  RowWiseAdagrad  (fbgemm EXACT_ROWWISE_ADAGRAD; state "sum", 1 value per row)
      sum_i += mean(g_i ** 2)
      w_i   -= lr * g_i / (sqrt(sum_i) + eps)

  RowWiseAdam     (fbgemm PARTIAL_ROWWISE_ADAM; "exp_avg" d values per row, "exp_avg_sq" 1)
      exp_avg_i    = beta1 * exp_avg_i + (1 - beta1) * g_i              per element
      exp_avg_sq_i = beta2 * exp_avg_sq_i + (1 - beta2) * mean(g_i ** 2)   per row
      w_i         -= lr * (exp_avg_i / (1 - beta1 ** t)) / (sqrt(exp_avg_sq_i / (1 - beta2 ** t)) + eps)

  The first moment is per element because it is the update's direction: one number per row
  would move every element of the row by the same amount (fbgemm's full ADAM keeps both moments
  per element, 2d values per row; PARTIAL_ROWWISE_ADAM, kept here, d + 1). Bias correction uses
  the optimizer's global step t, as fbgemm's kernels use their `iter` counter, not a per-row
  count: a row first touched at a late step gets (almost) no correction, exactly as production.

Rows the batch did not look up keep their weights and state (no decay of their moments; AdamW
moves every row each step). `RowWiseAdagrad(tables, lr, eps, sync_interval)` and
`RowWiseAdam(tables, lr, betas, eps, sync_interval)` attach to tables and step them inside
`loss.backward()` at their own `lr` (gemref's runs pass `table_lr`, parallel/config.py: 0.01 by default,
as fbgemm's fused optimizers; the dense parameters keep their optimizer and rate):

  * a ShardedEmbedding (sparse.py): its exchange hands the owner (local row ids, row gradients) in
    backward (sparse.py `exchange`); the rows are summed per unique id and stepped in a callback queued at the
    end of the backward. No dense gradient of the table is formed.
  * a plain nn.Embedding / nn.EmbeddingBag (one process, the parity reference): a forward pre-hook
    records the ids, the weight's post-accumulate-grad hook takes the recorded rows of the (dense)
    gradient, drops it, and the same end-of-backward callback steps them. Same math, so one process
    and ranks can be compared.

Each backward is one step (a table looked up twice in a forward is stepped once, on the sum).

2D (mesh RxS, R > 1), as TorchRec's DMPCollection: each replica group (a mesh row) steps its own
tables from its own part of the batch; every `sync_interval` steps the weights AND the row state
are averaged over "replicate" (one flat all-reduce, SUM / R). That is a mean of R partial updates,
not today's summed-gradient step (`sync_replica_grads`, kept for AdamW tables: one update from the
gradient of the whole global batch, the single-process step); between syncs the replicas differ.

Checkpoints: `row_state_dict(model)` / `load_row_state_dict(model, state)` give every attached
optimizer's state (and step) placed as its table's weight, for torch.distributed.checkpoint
(gemref/checkpoint/dcp.py saves them beside the model). Units: lr per step, state in gradient and
squared-gradient units, interval in steps.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from .sparse import ShardedEmbedding, check_table

TABLE_TYPES = (nn.Embedding, nn.EmbeddingBag, ShardedEmbedding)


def sum_rows(ids: Tensor, grads: Tensor) -> tuple[Tensor, Tensor]:
    """(unique row ids, their summed gradient rows): repeated ids in a batch add up."""
    rows, inverse = torch.unique(ids, return_inverse=True)
    return rows, grads.new_zeros((rows.numel(), grads.shape[1])).index_add_(0, inverse, grads)


@torch.no_grad()
def rowwise_adagrad_update(weight: Tensor, state_sum: Tensor, rows: Tensor, g: Tensor, lr: float,
                           eps: float) -> None:
    """In place: row-wise Adagrad on the unique `rows` with summed gradient `g` (module doc)."""
    state_sum[rows] += g.pow(2).mean(1)
    weight[rows] -= lr * g / (state_sum[rows].sqrt() + eps)[:, None]


@torch.no_grad()
def rowwise_adam_update(weight: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, rows: Tensor, g: Tensor, lr: float,
                        betas: tuple[float, float], eps: float, step: int) -> None:
    """In place: partial row-wise Adam at global step `step` (1-based) on the unique `rows` (module doc)."""
    beta1, beta2 = betas
    m = exp_avg[rows].mul_(beta1).add_(g, alpha=1 - beta1)
    v = exp_avg_sq[rows].mul_(beta2).add_(g.pow(2).mean(1), alpha=1 - beta2)
    exp_avg[rows], exp_avg_sq[rows] = m, v
    denom = (v / (1 - beta2 ** step)).sqrt_().add_(eps)
    weight[rows] -= lr * (m / (1 - beta1 ** step)) / denom[:, None]


def _tables_of(tables, who: str) -> list[nn.Module]:
    if isinstance(tables, TABLE_TYPES):
        found = [tables]
    elif isinstance(tables, nn.Module):
        found = [m for m in tables.modules() if isinstance(m, TABLE_TYPES)]
    else:
        found = list(tables.values() if isinstance(tables, Mapping) else tables)
    if not found:
        raise ValueError(f"{who} needs the embedding tables to train (nn.Embedding, nn.EmbeddingBag or "
                         "ShardedEmbedding), got none")
    for i, t in enumerate(found):
        if not isinstance(t, TABLE_TYPES):
            raise ValueError(f"{who}: table {i} is a {type(t).__name__}, not nn.Embedding, "
                             f"nn.EmbeddingBag or ShardedEmbedding")
    return found


class RowWiseOptimizer:
    """What the row-wise optimizers share (module doc): attaching to `tables` (a mapping or list of
    nn.Embedding, nn.EmbeddingBag or ShardedEmbedding modules, or a module whose tables are found by
    type), stepping the touched rows at the end of every backward, the replica sync, the state.
    Nothing to call per step. Leave the tables out of the dense optimizer. A subclass names its
    per-row state (`state_dims`) and its update (`update`)."""

    def __init__(self, tables: Mapping[str, nn.Module] | Iterable[nn.Module] | nn.Module, lr: float,
                 eps: float, sync_interval: int):
        who = type(self).__name__
        found = _tables_of(tables, who)
        if lr <= 0 or eps <= 0 or sync_interval < 1:
            raise ValueError(f"{who} needs lr > 0, eps > 0 and sync_interval >= 1, got {lr}, {eps}, {sync_interval}")
        self.lr, self.eps, self.sync_interval = lr, eps, sync_interval
        self.tables, self.steps, self.syncs, self.synced_bytes = found, 0, 0, 0   # synced_bytes: all-reduced so far
        self.state: dict[int, dict[str, Tensor]] = {}    # id(table) -> {state name: (local rows, ...) tensor}
        self._ids: dict[int, list[Tensor]] = {}          # plain tables: ids recorded by forward
        self._stash: dict[int, list[tuple[Tensor, Tensor]]] = {}   # (row ids, gradient rows) of this backward
        self._queued = False
        for t in found:       # the last optimizer attached to a table steps it (earlier ones step nothing)
            if not isinstance(t, ShardedEmbedding):
                check_table(type(t).__name__, t)
                t.register_forward_pre_hook(self._record_ids)
                t.weight.register_post_accumulate_grad_hook(self._plain_hook(t))
            t.row_optimizer = self

    # ------------------------------------------------------------------ what a subclass defines
    def state_dims(self, dim: int) -> dict[str, tuple[int, ...]]:
        """{state name: its shape per row} for a table of `dim` columns."""
        raise NotImplementedError

    def update(self, weight: Tensor, state: dict[str, Tensor], rows: Tensor, g: Tensor) -> None:
        """In place: step the unique local `rows` with summed gradient `g`; self.steps is the step's number."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    @staticmethod
    def _local(table: nn.Module) -> Tensor | None:
        w = table.weight
        return w.detach().to_local() if isinstance(w, DTensor) else (w.detach() if w is not None else None)

    def row_state(self, table: nn.Module) -> dict[str, Tensor] | None:
        """The table's local state {name: (local rows, ...)}, zeros until its first step; None where
        this rank holds none of its rows."""
        w = self._local(table)
        if w is None:
            return None
        if id(table) not in self.state:
            self.state[id(table)] = {name: torch.zeros((w.shape[0], *dims), dtype=w.dtype, device=w.device)
                                     for name, dims in self.state_dims(w.shape[1]).items()}
        return self.state[id(table)]

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on this rank."""
        return sum(s.numel() * s.element_size() for state in self.state.values() for s in state.values())

    # ------------------------------------------------------------------ plain tables
    def _record_ids(self, module: nn.Module, args) -> None:
        if torch.is_grad_enabled() and module.row_optimizer is self:
            self._ids.setdefault(id(module), []).append(args[0].detach().reshape(-1))

    def _plain_hook(self, table: nn.Module):
        def hook(param: Tensor) -> None:
            if table.row_optimizer is not self:
                return
            seen = self._ids.pop(id(table), [])
            if seen:
                rows = torch.unique(torch.cat(seen))
                self.stash(table, rows, param.grad[rows])
            param.grad = None
        return hook

    # ------------------------------------------------------------------ the step
    def stash(self, table: nn.Module, local_ids: Tensor, grads: Tensor) -> None:
        """Called in backward with the rows this rank owns (the sharded exchange, or a plain table's
        hook); they are stepped at the backward's end."""
        self._stash.setdefault(id(table), []).append((local_ids, grads))
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        self._queued = False
        self.steps += 1
        for t in self.tables:
            seen = self._stash.pop(id(t), []) if t.row_optimizer is self else []
            w = self._local(t)
            if seen and w is not None:
                rows, g = sum_rows(torch.cat([i for i, _ in seen]), torch.cat([g for _, g in seen]))
                self.update(w, self.row_state(t), rows, g)
        if self.steps % self.sync_interval == 0:
            self.sync_replicas()

    def sync_replicas(self) -> None:
        """Average the sharded tables' weights and row state over the mesh's "replicate" dim
        (one flat all-reduce); nothing where R = 1. Every rank of a replicate group holds the same
        shard index, hence the same rows, so the buffers line up."""
        sharded = [t for t in self.tables if isinstance(t, ShardedEmbedding) and t.replicas > 1]
        if not sharded:
            return
        held = [t for t in sharded if self._local(t) is not None]
        parts = [x for t in held for x in (self._local(t), *self.row_state(t).values())]
        self.syncs += 1
        if not parts:
            return
        flat = torch.cat([p.reshape(-1) for p in parts])
        self.synced_bytes += flat.numel() * flat.element_size()
        dist.all_reduce(flat, group=sharded[0].replicate_group)
        flat /= sharded[0].replicas
        torch._foreach_copy_(parts, [f.view_as(p) for f, p in zip(flat.split([p.numel() for p in parts]), parts)])


class RowWiseAdagrad(RowWiseOptimizer):
    """Row-wise Adagrad (fbgemm EXACT_ROWWISE_ADAGRAD): one accumulator per row (module doc)."""

    def __init__(self, tables: Mapping[str, nn.Module] | Iterable[nn.Module] | nn.Module, lr: float,
                 eps: float = 1e-8, sync_interval: int = 1):
        super().__init__(tables, lr, eps, sync_interval)

    def state_dims(self, dim: int) -> dict[str, tuple[int, ...]]:
        return {"sum": ()}

    def update(self, weight: Tensor, state: dict[str, Tensor], rows: Tensor, g: Tensor) -> None:
        rowwise_adagrad_update(weight, state["sum"], rows, g, self.lr, self.eps)

    def accumulator(self, table: nn.Module) -> Tensor | None:
        """The table's (local rows,) accumulator, zeros until its first step; None where it holds no rows."""
        state = self.row_state(table)
        return None if state is None else state["sum"]


class RowWiseAdam(RowWiseOptimizer):
    """Partial row-wise Adam (fbgemm PARTIAL_ROWWISE_ADAM): first moment per element, second per
    row, bias-corrected by the global step (module doc). fbgemm's defaults: betas (0.9, 0.999), eps 1e-8."""

    def __init__(self, tables: Mapping[str, nn.Module] | Iterable[nn.Module] | nn.Module, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, sync_interval: int = 1):
        if not all(0 <= b < 1 for b in betas) or len(betas) != 2:
            raise ValueError(f"RowWiseAdam needs two betas in [0, 1), got {betas}")
        super().__init__(tables, lr, eps, sync_interval)
        self.betas = (float(betas[0]), float(betas[1]))

    def state_dims(self, dim: int) -> dict[str, tuple[int, ...]]:
        return {"exp_avg": (dim,), "exp_avg_sq": ()}

    def update(self, weight: Tensor, state: dict[str, Tensor], rows: Tensor, g: Tensor) -> None:
        rowwise_adam_update(weight, state["exp_avg"], state["exp_avg_sq"], rows, g, self.lr, self.betas, self.eps,
                            self.steps)


# ---------------------------------------------------------------------- checkpoints


def _attached(model: nn.Module):
    """(fully qualified name, table, its row-wise optimizer) of every table of `model` that has one."""
    for fqn, module in model.named_modules():
        opt = getattr(module, "row_optimizer", None)
        if isinstance(opt, RowWiseOptimizer) and isinstance(module, TABLE_TYPES):
            yield fqn, module, opt


def row_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Every row-wise optimizer's state on `model`'s tables, for torch.distributed.checkpoint:
    {"<table>.<state name>": state, "<table>.step": its optimizer's step count}. A state is placed as
    its table's weight: a DTensor of the weight's mesh and placements for a row-sharded table (DCP
    saves and reshards it like the weight), a plain tensor where the rank holds the whole table,
    absent on a rank that holds none of its rows. Not-yet-stepped state is materialised as zeros, so
    the same dict can receive a load in place; empty when no table has a row-wise optimizer."""
    out: dict[str, Tensor] = {}
    for fqn, table, opt in _attached(model):
        out[f"{fqn}.step"] = torch.tensor(opt.steps)
        state, w = opt.row_state(table), table.weight
        for name, s in (state or {}).items():
            if isinstance(w, DTensor):
                shape = torch.Size((w.shape[0], *s.shape[1:]))
                s = DTensor.from_local(s, w.device_mesh, w.placements, run_check=False, shape=shape,
                                       stride=torch.empty(shape, device="meta").stride())
            out[f"{fqn}.{name}"] = s
    return out


def load_row_state_dict(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Put what `row_state_dict` gave (and a checkpoint filled) back into the optimizers, in place."""
    for fqn, table, opt in _attached(model):
        opt.steps = int(state[f"{fqn}.step"])
        for name, s in (opt.row_state(table) or {}).items():
            value = state[f"{fqn}.{name}"]
            s.copy_(value.to_local() if isinstance(value, DTensor) else value)


ROW_OPTIMIZERS = {"rowwise_adagrad": RowWiseAdagrad, "rowwise_adam": RowWiseAdam}   # table_optimizer -> class
