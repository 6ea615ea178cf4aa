"""`cpu_jagged`: GDPA on CPU as length-bucketed, query-chunked batched matmuls.

The reference pads every sequence to the longest and materialises (B, H, L, L) scores; on a
skewed batch that is mostly padding, and at L = 4096 it is gigabytes. This kernel:

  1. groups sequences of similar length into buckets (gemref/attention/bucketing.py), so the
     padded work stays within ~25% of the real work;
  2. walks each bucket in chunks of query rows, visiting only the keys those rows may attend
     (causal: up to the chunk's last row; window: within W), so the live score tile is
     bounded (CHUNK_ENTRIES per chunk) instead of O(L^2);
  3. recomputes the scores of each chunk in backward (an autograd.Function that saves only
     q, k, v and, for softmax, the output) instead of storing them.

Softmax needs no online rescaling here: a chunk holds *all* keys of its rows, so each row is
normalised exactly once. Half-precision inputs are computed in float32 (CPUs without AMX
run bf16 matmuls slowly, and accumulating dK, dV across chunks in bf16 loses precision).

Executed matmul FLOPs, per chunk of n sequences, R rows and K keys: forward 2 matmuls
(S = QK^T, O = A V), backward 5 (S recomputed, dV = A^T dO, dA = dO V^T, dQ = dS K,
dK = dS^T Q), each 2 * n * H * R * K * D.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .api import register_kernel
from .bucketing import Bucket, Chunk, bucket_rows, chunk_mask, lengths_list, make_buckets, query_chunks
from .reference import ACTIVATIONS, default_qk_scale

CHUNK_ENTRIES = 1 << 20  # score entries (n * H * rows * keys) per chunk: 4 MiB in float32


def activation_and_grad(name: str, s: Tensor) -> tuple[Tensor, Tensor | None]:
    """act(s) and act'(s) for the pointwise activations (None: the derivative is 1)."""
    if name == "silu":
        sig = torch.sigmoid(s)
        return s * sig, sig * (1 + s * (1 - sig))
    if name == "gelu":
        cdf = 0.5 * (1 + torch.erf(s * (1 / math.sqrt(2))))
        pdf = torch.exp(-0.5 * s * s) * (1 / math.sqrt(2 * math.pi))
        return s * cdf, cdf + s * pdf
    if name == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (s + 0.044715 * s ** 3))
        return 0.5 * s * (1 + t), 0.5 * (1 + t) + 0.5 * s * (1 - t * t) * c * (1 + 3 * 0.044715 * s * s)
    if name == "relu":
        return F.relu(s), (s > 0).to(s.dtype)
    if name == "relu2":
        r = F.relu(s)
        return r * r, 2 * r
    if name == "leaky_relu":
        return F.leaky_relu(s, 0.01), torch.full_like(s, 0.01).masked_fill_(s > 0, 1.0)
    if name == "identity":
        return s, None
    raise AssertionError(name)


def _activation(name: str, s: Tensor) -> Tensor:
    """act(s) in place where torch allows it (s is a scratch tile)."""
    if name == "silu":
        return F.silu(s, inplace=True)
    if name == "relu":
        return s.relu_()
    if name == "relu2":
        return s.relu_().square_()
    if name == "leaky_relu":
        return F.leaky_relu(s, 0.01, inplace=True)
    if name == "gelu":
        return F.gelu(s)
    if name == "gelu_tanh":
        return F.gelu(s, approximate="tanh")
    assert name == "identity", name
    return s


@dataclass
class _BucketPlan:
    bucket: Bucket
    chunks: list[Chunk]
    q_src: Tensor
    q_dest: Tensor
    kv_src: Tensor
    kv_dest: Tensor


def _plan(q_offsets: Tensor, kv_offsets: Tensor, heads: int, causal: bool,
          window: int | None) -> list[_BucketPlan]:
    q_lens, kv_lens = lengths_list(q_offsets), lengths_list(kv_offsets)
    plans = []
    for bucket in make_buckets(q_lens, kv_lens):
        chunks = query_chunks(bucket, heads, causal, window, CHUNK_ENTRIES)
        q_src, q_dest = bucket_rows(q_offsets, bucket, bucket.q_lens, bucket.q_len)
        kv_src, kv_dest = bucket_rows(kv_offsets, bucket, bucket.kv_lens, bucket.kv_len)
        plans.append(_BucketPlan(bucket, chunks, q_src, q_dest, kv_src, kv_dest))
    return plans


def _pad(x: Tensor, src: Tensor, dest: Tensor, n: int, length: int, dtype: torch.dtype) -> Tensor:
    """Rows `src` of jagged x (T, H, D) -> zero-padded (n*H, length, D) in `dtype`."""
    H, D = x.shape[1:]
    flat = x.new_zeros((n * length, H, D), dtype=dtype)
    flat[dest] = x[src].to(dtype)
    return flat.view(n, length, H, D).transpose(1, 2).reshape(n * H, length, D)


def _unpad_into(target: Tensor, padded: Tensor, src: Tensor, dest: Tensor, n: int) -> None:
    """Inverse of `_pad`: write padded (n*H, L, D) rows `dest` into target rows `src`."""
    H, D = target.shape[1:]
    length = padded.shape[1]
    rows = padded.view(n, H, length, D).transpose(1, 2).reshape(n * length, H, D)
    target[src] = rows[dest].to(target.dtype)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _masks(chunk: Chunk, bucket: Bucket, heads: int, causal: bool, window: int | None,
           device: torch.device) -> Tensor | None:
    """Blocked (not allowed) entries of a chunk, shaped to broadcast over (n*H, rows, keys)."""
    mask = chunk_mask(chunk, bucket, causal, window, device)
    if mask is None:
        return None
    mask = mask.expand(bucket.size, heads, -1, -1) if mask.shape[0] > 1 else mask[0]
    return ~mask.reshape(-1, *mask.shape[-2:])


def _forward(q, k, v, plans, activation, causal, window, qk_scale, out_scale) -> Tensor:
    H = q.shape[1]
    dtype = _compute_dtype(q)
    out = torch.zeros_like(q)
    for p in plans:
        b = p.bucket
        qb = _pad(q, p.q_src, p.q_dest, b.size, b.q_len, dtype)
        kb = _pad(k, p.kv_src, p.kv_dest, b.size, b.kv_len, dtype)
        vb = _pad(v, p.kv_src, p.kv_dest, b.size, b.kv_len, dtype)
        ob = torch.zeros_like(qb)
        for c in p.chunks:
            s = torch.bmm(qb[:, c.q0:c.q1], kb[:, c.k0:c.k1].transpose(1, 2)).mul_(qk_scale)
            blocked = _masks(c, b, H, causal, window, q.device)
            if activation == "softmax":
                if blocked is not None:
                    s.masked_fill_(blocked, torch.finfo(dtype).min)
                a = torch.softmax(s, dim=-1)
            else:
                a = _activation(activation, s)
            if blocked is not None:  # also zeroes softmax rows that have no allowed key
                a.masked_fill_(blocked, 0.0)
            ob[:, c.q0:c.q1].baddbmm_(a, vb[:, c.k0:c.k1])  # chunks partition the rows of ob
        _unpad_into(out, ob.mul_(out_scale), p.q_src, p.q_dest, b.size)
    return out


def _backward(grad_out, q, k, v, out, plans, activation, causal, window, qk_scale, out_scale):
    H = q.shape[1]
    dtype = _compute_dtype(q)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    softmax = activation == "softmax"
    for p in plans:
        b = p.bucket
        qb = _pad(q, p.q_src, p.q_dest, b.size, b.q_len, dtype)
        kb = _pad(k, p.kv_src, p.kv_dest, b.size, b.kv_len, dtype)
        vb = _pad(v, p.kv_src, p.kv_dest, b.size, b.kv_len, dtype)
        dob = _pad(grad_out, p.q_src, p.q_dest, b.size, b.q_len, dtype)
        if softmax:  # delta_i = dO_i . O_i = sum_j P_ij dP_ij
            delta = (dob * _pad(out, p.q_src, p.q_dest, b.size, b.q_len, dtype)).sum(-1, keepdim=True)
        dqb, dkb, dvb = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        for c in p.chunks:
            qc, kc, vc, doc = qb[:, c.q0:c.q1], kb[:, c.k0:c.k1], vb[:, c.k0:c.k1], dob[:, c.q0:c.q1]
            s = torch.bmm(qc, kc.transpose(1, 2)).mul_(qk_scale)
            blocked = _masks(c, b, H, causal, window, q.device)
            if softmax:
                if blocked is not None:
                    s.masked_fill_(blocked, torch.finfo(dtype).min)
                a = torch.softmax(s, dim=-1)
                if blocked is not None:
                    a.masked_fill_(blocked, 0.0)
                ds = torch.bmm(doc, vc.transpose(1, 2)).mul_(out_scale)   # dP
                ds.sub_(delta[:, c.q0:c.q1]).mul_(a)                       # dS = P (dP - delta)
            else:
                a, grad = activation_and_grad(activation, s)
                ds = torch.bmm(doc, vc.transpose(1, 2))                    # dA (out_scale later)
                if grad is not None:
                    ds.mul_(grad)
                if blocked is not None:
                    a.masked_fill_(blocked, 0.0)
                    ds.masked_fill_(blocked, 0.0)
            dvb[:, c.k0:c.k1].baddbmm_(a.transpose(1, 2), doc)
            dqb[:, c.q0:c.q1].baddbmm_(ds, kc)
            dkb[:, c.k0:c.k1].baddbmm_(ds.transpose(1, 2), qc)
        grad_scale = qk_scale if softmax else qk_scale * out_scale
        _unpad_into(dq, dqb.mul_(grad_scale), p.q_src, p.q_dest, b.size)
        _unpad_into(dk, dkb.mul_(grad_scale), p.kv_src, p.kv_dest, b.size)
        _unpad_into(dv, dvb.mul_(out_scale), p.kv_src, p.kv_dest, b.size)
    return dq, dk, dv


class _JaggedGDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plans, activation, causal, window, qk_scale, out_scale):
        out = _forward(q, k, v, plans, activation, causal, window, qk_scale, out_scale)
        ctx.save_for_backward(q, k, v, out if activation == "softmax" else None)
        ctx.args = (plans, activation, causal, window, qk_scale, out_scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        dq, dk, dv = _backward(grad_out.contiguous(), q, k, v, out, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def gdpa_cpu_jagged(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                    activation: str, causal: bool = False, window: int | None = None,
                    qk_scale: float | None = None, out_scale: float = 1.0,
                    max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged GDPA, q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D); see the module docstring."""
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    plans = _plan(q_offsets, kv_offsets, q.shape[1], causal, window)
    return _JaggedGDPA.apply(q, k, v, plans, activation, causal, window, qk_scale, out_scale)


def cpu_jagged_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                              causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of the bucket/chunk plan these lengths produce."""
    entries = 0
    for bucket in make_buckets(q_lengths.tolist(), kv_lengths.tolist()):
        for c in query_chunks(bucket, heads, causal, window, CHUNK_ENTRIES):
            entries += bucket.size * heads * (c.q1 - c.q0) * (c.k1 - c.k0)
    per_matmul = 2 * head_dim * entries
    return 2 * per_matmul, 5 * per_matmul


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if q.device.type != "cpu":
        return f"cpu_jagged is the CPU path and q is on {q.device.type} (use triton or sdpa there)"
    if not q.dtype.is_floating_point:
        return f"needs floating-point inputs, got {q.dtype}"
    assert activation in ACTIVATIONS
    return None


register_kernel("cpu_jagged", gdpa_cpu_jagged, _unavailable, cpu_jagged_executed_flops)
