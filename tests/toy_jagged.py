"""A toy jagged model small enough to reason about by hand, for tests/test_balance.py's check
that a cost-balanced split with unequal per-rank counts gives the full-batch gradient."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gemref.data.jagged import offsets_to_lengths


class ToyJaggedModel(nn.Module):
    """A stand-in for GEM's sequence tower: per-event projection, optional per-sequence softmax
    attention (the L^2 term), jagged mean pool, linear head -> one logit per sample."""

    def __init__(self, d_in: int = 8, d_hidden: int = 64, attention: bool = True):
        super().__init__()
        self.proj = nn.Linear(d_in, d_hidden)
        self.head = nn.Linear(d_hidden, 1)
        self.attention = attention

    def forward(self, values_TD: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        h_TH = torch.tanh(self.proj(values_TD))
        lengths = offsets_to_lengths(offsets)
        if self.attention:
            h_TH = torch.cat([torch.softmax(h @ h.T / h.shape[1] ** 0.5, dim=-1) @ h
                              for h in torch.split(h_TH, lengths.tolist())] or [h_TH])
        seg = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        pooled_BH = h_TH.new_zeros(lengths.numel(), h_TH.shape[1]).index_add_(0, seg, h_TH)
        pooled_BH = pooled_BH / lengths.clamp(min=1)[:, None].to(h_TH.dtype)
        return self.head(pooled_BH).squeeze(-1)


def toy_batch(lengths, d_in: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic random (values (T, d_in), offsets (B+1,), labels (B,)) for given lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.as_tensor(np.asarray(lengths), dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths_t, 0)])
    values = torch.randn(int(offsets[-1]), d_in, generator=g)
    labels = torch.randint(0, 2, (len(lengths_t),), generator=g).float()
    return values, offsets, labels


def select_samples(values, offsets, labels, idx):
    """The samples `idx` of a toy batch, as a new jagged batch."""
    idx = list(idx)
    lengths = offsets_to_lengths(offsets)[idx]
    rows = [values[offsets[i]:offsets[i + 1]] for i in idx]
    new_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return torch.cat(rows) if rows else values[:0], new_offsets, labels[idx]


def sample_losses(model, values, offsets, labels) -> torch.Tensor:
    """(B,) per-sample binary cross-entropy."""
    return nn.functional.binary_cross_entropy_with_logits(model(values, offsets), labels, reduction="none")
