"""`sdpa`: softmax attention on jagged sequences through PyTorch's fused attention kernels.

Which kernel runs, and how the jagged batch reaches it:

* CUDA, fp16/bf16, head dim a multiple of 8 up to 256: FlashAttention-2 *varlen*
  (`aten._flash_attention_forward` with cumulative offsets, the call nested-jagged SDPA makes
  internally). No padding at all; causal and sliding windows are native (window_size_left/
  right). FlashAttention aligns windows to the bottom-right corner when a sequence has
  Lq != Lk, while gemref's window is top-left aligned (reference.py), so windowed *cross*
  attention takes the bucketed path below. Not run here (no GPU in this sandbox).
* Otherwise (always on CPU): length buckets (bucketing.py) padded to their longest member
  and passed to `F.scaled_dot_product_attention`, which keeps the flash kernel on CPU
  (`aten._scaled_dot_product_flash_attention_for_cpu`; it accepts masks and skips key blocks
  past the causal diagonal). Masks are kept small so they never cost O(L^2):
    - causal self-attention with right padding: `is_causal=True` alone hides the pad keys
      from every real query (pad keys sit after the diagonal), so no mask at all;
    - non-causal: a key-length mask of shape (n, 1, 1, Lk), broadcast over queries
      (none when every sequence of the bucket has the same key length);
    - sliding window: query chunks, each with a (n, 1, rows, keys) band mask over only the
      keys within W of the chunk. Rows with no allowed key are given one dummy key and then
      zeroed, so no fused kernel ever sees a fully masked row (NaN on some CUDA kernels).

torch's FlopCounterMode has no formula for the CPU flash op; this module registers one that
mirrors the kernel's blocking as read in aten/src/ATen/native/cpu/FlashAttentionKernel.cpp
(query blocks of 256/64/32 rows for Lq >= 768/192/else, key blocks of 512; causal skips the
key blocks past each query block's diagonal; 2 matmuls forward, 5 backward since S = QK^T is
recomputed). Only the causal count depends on those block sizes; were a torch release to
change them, it would shift by less than one key block per query block.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import flop_registry, register_flop_formula

from ..data.jagged import offsets_to_lengths
from .api import register_kernel
from .bucketing import bucket_rows, chunk_mask, lengths_list, make_buckets, query_chunks
from .reference import default_qk_scale

WINDOW_CHUNK_ENTRIES = 1 << 22  # n * H * rows * keys per windowed chunk (its mask is n * rows * keys)
_aten = torch.ops.aten


# ---------------------------------------------------------------- FLOPs of the CPU flash kernel
def cpu_flash_matmul_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                           causal: bool, matmuls: int) -> int:
    """Matmul FLOPs of the CPU flash kernel on (batch, heads, q_len|kv_len, head_dim) inputs."""
    q_split = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    kv_split = 512
    if not causal:
        entries = q_len * kv_len
    else:
        entries = 0
        for m in range(0, q_len, q_split):
            rows = min(q_split, q_len - m)
            for n in range(0, min(m + rows, kv_len), kv_split):
                entries += rows * min(kv_split, kv_len - n)
    return matmuls * 2 * batch * heads * head_dim * entries


def _cpu_flash_forward_flop(query, key, value, dropout_p=0.0, is_causal=False, *args,
                            out_shape=None, **kwargs) -> int:
    B, H, Lq, D = query
    return cpu_flash_matmul_flops(B, H, Lq, key[2], D, bool(is_causal), matmuls=2)


def _cpu_flash_backward_flop(grad_out, query, key, value, out, logsumexp, dropout_p=0.0,
                             is_causal=False, *args, out_shape=None, **kwargs) -> int:
    B, H, Lq, D = query
    return cpu_flash_matmul_flops(B, H, Lq, key[2], D, bool(is_causal), matmuls=5)


for _op, _formula in ((_aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_forward_flop),
                      (_aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_backward_flop)):
    if _op not in flop_registry:  # a future torch may count it itself
        register_flop_formula(_op)(_formula)


# ------------------------------------------------------------------------- the kernel paths
def _use_varlen(device_type: str, head_dim: int, window: int | None, same_lengths: bool) -> bool:
    return (device_type == "cuda" and head_dim % 8 == 0 and head_dim <= 256
            and (window is None or same_lengths))


def _flash_varlen(q, k, v, q_offsets, kv_offsets, causal, window, qk_scale, max_q, max_kv) -> Tensor:
    """FlashAttention-2 varlen on CUDA (not run in this sandbox: no GPU)."""
    if max_q is None:
        max_q = int(offsets_to_lengths(q_offsets).max())
    if max_kv is None:
        max_kv = int(offsets_to_lengths(kv_offsets).max())
    if max_q == 0 or max_kv == 0:
        return _zeros_in_graph(q, k, v)
    left = right = None
    if window is not None:
        left, right = window - 1, 0 if causal else window - 1
    out = _aten._flash_attention_forward(
        q, k, v, q_offsets.to(torch.int32), kv_offsets.to(torch.int32), max_q, max_kv, 0.0,
        causal, False, scale=qk_scale, window_size_left=left, window_size_right=right)[0]
    return out


def _zeros_in_graph(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The all-zero output of a batch with no (query, key) pair, still a function of q, k, v
    so that backward returns zero gradients rather than none."""
    return q * 0 + 0 * (k.sum() + v.sum())


def _pad(x: Tensor, src: Tensor, dest: Tensor, n: int, length: int) -> Tensor:
    """Jagged rows `src` -> padded (n, H, length, D) view, differentiable."""
    H, D = x.shape[1:]
    flat = x.new_zeros((n * length, H, D)).index_copy(0, dest, x.index_select(0, src))
    return flat.view(n, length, H, D).transpose(1, 2)


def _sdpa_window_chunks(qb, kb, vb, bucket, causal, window, qk_scale) -> Tensor:
    """Windowed attention of one bucket, chunk by chunk: (n, H, Lq, D)."""
    n, H, Lq, D = qb.shape
    pieces, done = [], 0
    for c in query_chunks(bucket, H, causal, window, WINDOW_CHUNK_ENTRIES):
        if c.q0 > done:  # rows with no key at all: zero output
            pieces.append(qb.new_zeros(n, H, c.q0 - done, D))
        mask = chunk_mask(c, bucket, causal, window, qb.device)
        row_ok = None
        if mask is not None:
            row_ok = mask.any(-1, keepdim=True)
            if bool(row_ok.all()):
                row_ok = None
            else:  # give empty rows key 0 so the fused kernel stays finite; zeroed below
                mask = mask.clone()
                mask[..., 0:1] |= ~row_ok
        o = F.scaled_dot_product_attention(qb[:, :, c.q0:c.q1], kb[:, :, c.k0:c.k1], vb[:, :, c.k0:c.k1],
                                           attn_mask=mask, scale=qk_scale)
        pieces.append(o if row_ok is None else torch.where(row_ok, o, 0.0))
        done = c.q1
    if done < Lq:
        pieces.append(qb.new_zeros(n, H, Lq - done, D))
    return torch.cat(pieces, dim=2)


def _bucketed(q, k, v, q_offsets, kv_offsets, causal, window, qk_scale) -> Tensor:
    H, D = q.shape[1:]
    q_lens, kv_lens = lengths_list(q_offsets), lengths_list(kv_offsets)
    srcs, rows = [], []
    for bucket in make_buckets(q_lens, kv_lens):
        q_src, q_dest = bucket_rows(q_offsets, bucket, bucket.q_lens, bucket.q_len)
        kv_src, kv_dest = bucket_rows(kv_offsets, bucket, bucket.kv_lens, bucket.kv_len)
        n = bucket.size
        qb = _pad(q, q_src, q_dest, n, bucket.q_len)
        kb = _pad(k, kv_src, kv_dest, n, bucket.kv_len)
        vb = _pad(v, kv_src, kv_dest, n, bucket.kv_len)
        if window is not None:
            ob = _sdpa_window_chunks(qb, kb, vb, bucket, causal, window, qk_scale)
        else:
            mask = None
            if not causal and bucket.min_kv_len < bucket.kv_len:
                j = torch.arange(bucket.kv_len, device=q.device)
                mask = (j[None, :] < torch.tensor(bucket.kv_lens, device=q.device)[:, None])[:, None, None, :]
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=causal, scale=qk_scale)
        srcs.append(q_src)
        rows.append(ob.transpose(1, 2).reshape(n * bucket.q_len, H, D).index_select(0, q_dest))
    if not rows:  # every sequence is empty on one side
        return _zeros_in_graph(q, k, v)
    return q.new_zeros(q.shape).index_copy(0, torch.cat(srcs), torch.cat(rows))


def gdpa_sdpa(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
              activation: str, causal: bool = False, window: int | None = None,
              qk_scale: float | None = None, out_scale: float = 1.0,
              max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged softmax attention, q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D); see module docstring."""
    assert activation == "softmax", activation
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    same = kv_offsets is q_offsets or (window is not None and torch.equal(q_offsets, kv_offsets))
    if _use_varlen(q.device.type, q.shape[-1], window, same):
        out = _flash_varlen(q, k, v, q_offsets, kv_offsets, causal, window, qk_scale, max_q, max_kv)
    else:
        out = _bucketed(q, k, v, q_offsets, kv_offsets, causal, window, qk_scale)
    return out if out_scale == 1.0 else out * out_scale


def sdpa_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                        causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of the path `gdpa_sdpa` takes on the lengths' device.

    CPU: the bucketed calls, counted like the registered CPU flash formula. CUDA: the count
    torch's own FlopCounterMode formulas use (full Lq x Lk rectangle per call; they ignore
    the causal tiles flash skips, so for causal attention this overstates the work ~2x).
    """
    q_list, kv_list = q_lengths.tolist(), kv_lengths.tolist()
    on_cuda = q_lengths.device.type == "cuda"
    if on_cuda and _use_varlen("cuda", head_dim, window, q_list == kv_list):
        entries = sum(a * b for a, b in zip(q_list, kv_list))
        per_matmul = 2 * heads * head_dim * entries
        return 2 * per_matmul, 5 * per_matmul
    forward = backward = 0
    for bucket in make_buckets(q_list, kv_list):
        if window is None:
            calls = [(bucket.q_len, bucket.kv_len, causal)]
        else:
            calls = [(c.q1 - c.q0, c.k1 - c.k0, False)
                     for c in query_chunks(bucket, heads, causal, window, WINDOW_CHUNK_ENTRIES)]
        for lq, lk, is_causal in calls:
            is_causal = is_causal and not on_cuda
            forward += cpu_flash_matmul_flops(bucket.size, heads, lq, lk, head_dim, is_causal, 2)
            backward += cpu_flash_matmul_flops(bucket.size, heads, lq, lk, head_dim, is_causal, 5)
    return forward, backward


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if activation != "softmax":
        return f"SDPA computes softmax attention only, not activation={activation!r} (use cpu_fused, cpu_jagged or triton)"
    if q.device.type == "cuda" and q.dtype not in (torch.float16, torch.bfloat16):
        return f"on CUDA the flash kernels need float16/bfloat16, got {q.dtype} (use triton)"
    if q.device.type not in ("cpu", "cuda"):
        return f"not wired for device {q.device.type}"
    return None


register_kernel("sdpa", gdpa_sdpa, _unavailable, sdpa_executed_flops)
