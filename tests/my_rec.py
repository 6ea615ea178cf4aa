"""A ranking model written from scratch, as a user brings it: no gemref class, no gemref batch type,
no attribute gemref knows by name (no `layers`, `tables`, `cfg`, `forward_loss`).

The tests of each technique's public API apply the technique to this model through its documented
arguments (the blocks, tables and regions named by the caller), forward and backward:

    item = nn.Embedding(vocab, d)          one row per history event (T, d)
    user = nn.EmbeddingBag(vocab, d)       the user's ids pooled by sum -> (B, d)
    stack: two causal self-attention blocks over each jagged history (pre-norm, residual MLP)
    head:  [mean-pooled history, user] -> Linear -> ReLU -> Linear -> one logit; BCE loss

A batch is `RecBatch`: item ids with their offsets (B+1,), user ids with theirs, labels (B,).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class RecBatch:
    items: Tensor          # (T,) int64 item ids of every history event
    offsets: Tensor        # (B+1,) int64 history boundaries into items
    users: Tensor          # (U,) int64 user ids, pooled per sample
    user_offsets: Tensor   # (B+1,) int64 boundaries into users
    labels: Tensor         # (B,) float clicks in {0, 1}

    def to(self, device) -> "RecBatch":
        return RecBatch(*(t.to(device) for t in (self.items, self.offsets, self.users, self.user_offsets,
                                                 self.labels)))

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def make_batch(lengths: list[int], *, vocab: int = 50, users_per_sample: int = 3, seed: int = 0) -> RecBatch:
    """A batch with the given history lengths (0 allowed), random ids and labels."""
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.cat([lengths_t.new_zeros(1), lengths_t.cumsum(0)])
    b = len(lengths)
    items = torch.randint(0, vocab, (int(offsets[-1]),), generator=g)
    users = torch.randint(0, vocab, (b * users_per_sample,), generator=g)
    user_offsets = torch.arange(0, b * users_per_sample + 1, users_per_sample, dtype=torch.int64)
    labels = torch.randint(0, 2, (b,), generator=g).float()
    return RecBatch(items, offsets, users, user_offsets, labels)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor) -> Tensor:
    """Softmax causal attention per sequence, q/k/v (T, H, D): the user's own, plainly written."""
    out = torch.zeros_like(q)
    for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if e == s:
            continue
        scores = torch.einsum("qhd,khd->hqk", q[s:e], k[s:e]) / q.shape[-1] ** 0.5
        mask = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v[s:e])
    return out


class Block(nn.Module):
    """Pre-norm causal self-attention then an MLP, both residual, over jagged (T, d) values."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.attention = causal_attention      # a test may swap in gdpa through a 4-line adapter

    def forward(self, x: Tensor, offsets: Tensor) -> Tensor:
        t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, d // self.heads).unbind(1)
        x = x + self.proj(self.attention(q, k, v, offsets).reshape(t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class MyRec(nn.Module):
    """The module doc's model; `forward(batch) -> (B,) logits`."""

    def __init__(self, vocab: int = 50, d: int = 32, heads: int = 2, hidden: int = 64, n_blocks: int = 2):
        super().__init__()
        self.item = nn.Embedding(vocab, d)
        self.user = nn.EmbeddingBag(vocab, d, mode="sum")
        self.stack = nn.ModuleList(Block(d, heads) for _ in range(n_blocks))
        self.head = nn.Sequential(nn.Linear(2 * d, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch: RecBatch) -> Tensor:
        x = self.item(batch.items)
        for block in self.stack:
            x = block(x, batch.offsets)
        lengths = batch.lengths
        segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths)
        pooled = x.new_zeros(lengths.numel(), x.shape[1]).index_add_(0, segment, x)
        pooled = pooled / lengths.clamp(min=1)[:, None].to(x.dtype)
        user = self.user(batch.users, batch.user_offsets[:-1])
        return self.head(torch.cat([pooled, user], dim=1)).squeeze(1)


def with_attention(model: MyRec, attention) -> MyRec:
    """`model` with every block's attention swapped for `attention(q, k, v, offsets)` (e.g. a gdpa adapter)."""
    for block in model.stack:
        block.attention = attention
    return model


def my_loss(model: nn.Module, batch: RecBatch) -> Tensor:
    """The user's loss: mean BCE over the batch's samples."""
    return F.binary_cross_entropy_with_logits(model(batch), batch.labels)
