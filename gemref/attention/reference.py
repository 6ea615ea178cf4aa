"""The GDPA math spec: padded, masked, materialised, obviously right.

Generalized Dot-Product Attention (GDPA) for query i of a sequence:

    out_i = out_scale * sum_j  act(qk_scale * q_i . k_j) * v_j     over the keys j the mask allows

With act = "softmax" this is standard attention (the row is normalised over allowed keys, and
out_scale multiplies the normalised result). Every other activation is pointwise, as in HSTU,
InterFormer and Kunlun: no normalisation across keys, so each interaction keeps its own
magnitude.

Masks, per sequence, with i a query position and j a key position:
  * keys beyond the sequence's own length are never allowed (jagged / padded batches);
  * causal (self-attention only):  j <= i;
  * window W (an int >= 1):         i - j < W, and for non-causal also j - i < W.

Every kernel in gemref.attention is tested against this file, in float64 where it can.
It materialises the (B, H, Lq, Lk) score tensor: O(L^2) memory, which is the point of the
fast kernels.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.jagged import offsets_to_lengths, pad, unpad

POINTWISE: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.01),
    "identity": lambda x: x,
}
ACTIVATIONS = ("softmax",) + tuple(POINTWISE)


def default_qk_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def allowed_mask(q_lengths: Tensor, kv_lengths: Tensor, max_q: int, max_kv: int, *,
                 causal: bool, window: int | None) -> Tensor:
    """(B, max_q, max_kv) bool: True where query i may attend key j in that sequence."""
    i = torch.arange(max_q, device=q_lengths.device)[:, None]
    j = torch.arange(max_kv, device=q_lengths.device)[None, :]
    mask = (i < q_lengths[:, None, None]) & (j < kv_lengths[:, None, None])
    if causal:
        mask = mask & (j <= i)
    if window is not None:
        mask = mask & (i - j < window)
        if not causal:
            mask = mask & (j - i < window)
    return mask


def gdpa_padded(q: Tensor, k: Tensor, v: Tensor, q_lengths: Tensor, kv_lengths: Tensor, *,
                activation: str, causal: bool = False, window: int | None = None,
                qk_scale: float | None = None, out_scale: float = 1.0) -> Tensor:
    """GDPA on padded tensors: q (B, Lq, H, D), k/v (B, Lk, H, D) -> (B, Lq, H, D), pad rows 0.

    Works in the inputs' dtype (pass float64 for a high-precision check).
    """
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    mask = allowed_mask(q_lengths, kv_lengths, q.shape[1], k.shape[1], causal=causal, window=window)
    mask = mask[:, None]  # (B, 1, Lq, Lk), broadcast over heads
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * qk_scale
    if activation == "softmax":
        # A finite fill keeps fully masked rows (empty sequences, padding) free of NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = POINTWISE[activation](scores)
    weights = weights.masked_fill(~mask, 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v) * out_scale


def gdpa_reference(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                   activation: str, causal: bool = False, window: int | None = None,
                   qk_scale: float | None = None, out_scale: float = 1.0,
                   max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged GDPA by padding to the longest sequence: q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D)."""
    q_lengths = offsets_to_lengths(q_offsets)
    kv_lengths = offsets_to_lengths(kv_offsets)
    max_q = int(q_lengths.max()) if max_q is None else max_q
    max_kv = int(kv_lengths.max()) if max_kv is None else max_kv
    q_pad, _ = pad(q, q_offsets, max_q)
    k_pad, _ = pad(k, kv_offsets, max_kv)
    v_pad, _ = pad(v, kv_offsets, max_kv)
    out = gdpa_padded(q_pad, k_pad, v_pad, q_lengths, kv_lengths, activation=activation,
                      causal=causal, window=window, qk_scale=qk_scale, out_scale=out_scale)
    return unpad(out, q_offsets)
