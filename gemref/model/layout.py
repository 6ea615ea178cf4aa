"""How the history tokens of a batch are laid out: jagged (T real rows) or padded (B * max_len rows).

The model's blocks see history tokens as a 2-D (rows, d) tensor in either layout, so every
Linear is written once; only attention, pooling and broadcasting need to know the layout,
and they ask this object. Padded is the baseline (every sample padded to max_len: static
shapes, wasted FLOPs on pad rows); jagged is ladder rung 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import gdpa, gdpa_padded
from ..data.jagged import offsets_to_lengths, segment_ids


@dataclass
class SequenceLayout:
    offsets: Tensor        # (B+1,) int64 offsets of the real history rows
    lengths: Tensor        # (B,) int64
    max_len: int           # padded length (padded layout) or the batch's longest sequence (jagged)
    padded: bool
    kernel: str            # gdpa kernel for the jagged layout (padded always materialises)
    row_owner: Tensor      # (rows,) int64 sample of each row
    row_position: Tensor   # (rows,) int64 position of each row inside its sequence
    row_is_real: Tensor | None  # (rows,) bool, padded layout only

    @staticmethod
    def build(offsets: Tensor, max_len: int, *, padded: bool, kernel: str, longest: int | None = None,
              total: int | None = None) -> "SequenceLayout":
        """Layout for a batch; `max_len` is the model's (pad target, and the cap on lengths).
        `longest` (the longest sequence) and `total` (offsets[-1], the rows), when the caller
        knows them on the host (JaggedBatch.host_max_length, values.shape[0]), spare the two
        device syncs that reading them from `offsets` costs on a GPU."""
        lengths = offsets_to_lengths(offsets)
        B = lengths.numel()
        if longest is None:
            longest = int(lengths.max()) if B else 0
        if longest > max_len:
            raise ValueError(f"a history has {longest} events > max_len={max_len}")
        if padded:
            pos = torch.arange(max_len, device=offsets.device)
            owner = torch.arange(B, device=offsets.device).repeat_interleave(max_len)
            position = pos.repeat(B)
            is_real = (pos[None, :] < lengths[:, None]).reshape(-1)
            return SequenceLayout(offsets, lengths, max_len, True, kernel, owner, position, is_real)
        T = int(offsets[-1]) if total is None else total
        owner = segment_ids(offsets, T)
        position = torch.arange(T, device=offsets.device) - offsets[:-1][owner]
        return SequenceLayout(offsets, lengths, longest, False, kernel, owner, position, None)

    @property
    def batch_size(self) -> int:
        return self.lengths.numel()

    def to_rows(self, values: Tensor) -> Tensor:
        """Jagged per-event values (T, ...) -> this layout's rows (zeros on pad rows)."""
        if not self.padded:
            return values
        out = values.new_zeros((self.row_owner.numel(),) + tuple(values.shape[1:]))
        out[self.row_is_real] = values
        return out

    def self_attention(self, q: Tensor, k: Tensor, v: Tensor, *, activation: str,
                       out_scale: float, window: int | None = None) -> Tensor:
        """Causal attention within each sequence, each event over its last `window` events
        (itself included; None: all earlier ones); q, k, v: (rows, H, D) -> (rows, H, D)."""
        if self.padded:
            B, L = self.batch_size, self.max_len
            out = gdpa_padded(q.view(B, L, *q.shape[1:]), k.view(B, L, *k.shape[1:]),
                              v.view(B, L, *v.shape[1:]), self.lengths, self.lengths,
                              activation=activation, causal=True, window=window, out_scale=out_scale)
            return out.reshape(q.shape)
        return gdpa(q, k, v, self.offsets, activation=activation, causal=True, window=window,
                    out_scale=out_scale, kernel=self.kernel, max_len=self.max_len)

    def cross_attention(self, q: Tensor, k: Tensor, v: Tensor, *, activation: str,
                        out_scale: float) -> Tensor:
        """Each sample's N query tokens attend to its history: q (B*N, H, D), k/v (rows, H, D)."""
        B = self.batch_size
        N = q.shape[0] // B
        if self.padded:
            L = self.max_len
            out = gdpa_padded(q.view(B, N, *q.shape[1:]), k.view(B, L, *k.shape[1:]),
                              v.view(B, L, *v.shape[1:]), torch.full_like(self.lengths, N),
                              self.lengths, activation=activation, out_scale=out_scale)
            return out.reshape(q.shape)
        q_offsets = torch.arange(0, (B + 1) * N, N, device=q.device)
        return gdpa(q, k, v, q_offsets, kv_offsets=self.offsets, activation=activation,
                    out_scale=out_scale, kernel=self.kernel, max_len=N, kv_max_len=self.max_len)

    def broadcast(self, per_sample: Tensor) -> Tensor:
        """(B, d) -> (rows, d): each row gets its sample's vector."""
        return per_sample[self.row_owner]

    def mean_pool(self, rows: Tensor) -> Tensor:
        """(rows, d) -> (B, d) mean over each sample's real rows (0 for an empty history)."""
        B = self.batch_size
        if self.padded:
            rows = rows * self.row_is_real[:, None].to(rows.dtype)
            total = rows.view(B, self.max_len, -1).sum(1)
        else:
            total = rows.new_zeros((B, rows.shape[1])).index_add_(0, self.row_owner, rows)
        return total / self.lengths.clamp(min=1)[:, None].to(rows.dtype)
