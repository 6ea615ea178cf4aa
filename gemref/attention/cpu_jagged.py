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
Chunk tiles live in a small workspace reused by every chunk (matmuls write into it with
out=, activations run in place): allocating a fresh multi-MiB tile per chunk costs page
faults that on CPU take as long as the matmul itself.

Threads: the kernel issues a few hundred mid-sized ops per call, each an OpenMP parallel
region. On an oversubscribed CPU (more busy threads than cores, e.g. other jobs on a shared
machine) every region's barrier waits for descheduled threads and it slows down 10x or more;
there, give torch fewer threads (torch.set_num_threads, or `gemref bench attention --threads`).

Executed matmul FLOPs, per chunk of n sequences, R rows and K keys: forward 2 matmuls
(S = QK^T, O = A V), backward 5 (S recomputed, dV = A^T dO, dA = dO V^T, dQ = dS K,
dK = dS^T Q), each 2 * n * H * R * K * D.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .api import register_kernel
from .bucketing import Bucket, Chunk, bucket_rows, chunk_mask, lengths_list, make_buckets, query_chunks
from .reference import ACTIVATIONS, default_qk_scale

CHUNK_ENTRIES = 1 << 20  # score entries (n * H * rows * keys) per chunk: 4 MiB in float32
_aten = torch.ops.aten


def _activation_(name: str, s: Tensor) -> Tensor:
    """act(s), in place."""
    if name == "silu":
        return F.silu(s, inplace=True)
    if name == "gelu":
        return _aten.gelu_(s)
    if name == "gelu_tanh":
        return _aten.gelu_(s, approximate="tanh")
    if name == "relu":
        return s.relu_()
    if name == "relu2":
        return s.relu_().square_()
    if name == "leaky_relu":
        return _aten.leaky_relu_(s, 0.01)
    assert name == "identity", name
    return s


def _activation_backward_(name: str, grad: Tensor, s: Tensor) -> Tensor:
    """grad * act'(s), in place in grad, with the fused kernels autograd itself uses."""
    if name == "silu":
        return _aten.silu_backward.grad_input(grad, s, grad_input=grad)
    if name in ("gelu", "gelu_tanh"):
        approximate = "tanh" if name == "gelu_tanh" else "none"
        return _aten.gelu_backward.grad_input(grad, s, approximate=approximate, grad_input=grad)
    if name == "relu":
        return _aten.threshold_backward.grad_input(grad, s, 0, grad_input=grad)
    if name == "relu2":
        return grad.mul_(s.clamp(min=0)).mul_(2)
    if name == "leaky_relu":
        return _aten.leaky_relu_backward.grad_input(grad, s, 0.01, False, grad_input=grad)
    assert name == "identity", name
    return grad


def _softmax_(s: Tensor) -> Tensor:
    """Row softmax in place (blocked entries hold the dtype's min, so they become 0)."""
    s.sub_(s.amax(-1, keepdim=True)).exp_()
    return s.div_(s.sum(-1, keepdim=True))


class _Workspace:
    """Named flat buffers reused across chunks; `take` returns a contiguous view of a prefix.

    Each buffer is allocated once, at the largest size the plan needs (a buffer regrown
    chunk after chunk would briefly hold old and new tiles at once)."""

    def __init__(self, like: Tensor, dtype: torch.dtype, plans: list) -> None:
        self.like, self.dtype, self.buffers = like, dtype, {}
        heads, head_dim = like.shape[1:]
        self.sizes = {"s": 0, "ds": 0, "kv": 0, "o": 0}
        for p in plans:
            for c in p.chunks:
                rows = p.bucket.size * heads
                self.sizes["s"] = max(self.sizes["s"], rows * (c.q1 - c.q0) * (c.k1 - c.k0))
                self.sizes["kv"] = max(self.sizes["kv"], rows * (c.k1 - c.k0) * head_dim)
                self.sizes["o"] = max(self.sizes["o"], rows * (c.q1 - c.q0) * head_dim)
        self.sizes["ds"] = self.sizes["s"]

    def take(self, name: str, *shape: int) -> Tensor:
        numel = 1
        for n in shape:
            numel *= n
        if name not in self.buffers:
            self.buffers[name] = self.like.new_empty(self.sizes[name], dtype=self.dtype)
        assert numel <= self.buffers[name].numel(), (name, shape)
        return self.buffers[name][:numel].view(shape)


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


def _masked_fill_(x: Tensor, blocked: Tensor | None, n: int, value: float) -> None:
    """Fill the blocked entries of a (n*H, rows, keys) tile; `blocked` broadcasts as (n|1, 1, rows|1, keys)."""
    if blocked is not None:
        x.view(n, -1, *x.shape[1:]).masked_fill_(blocked, value)


def _blocked(chunk: Chunk, bucket: Bucket, causal: bool, window: int | None, device) -> Tensor | None:
    mask = chunk_mask(chunk, bucket, causal, window, device)
    return None if mask is None else ~mask


def _forward(q, k, v, plans, activation, causal, window, qk_scale, out_scale) -> Tensor:
    dtype = _compute_dtype(q)
    out = torch.zeros_like(q)
    ws = _Workspace(q, dtype, plans)
    for p in plans:
        b, n = p.bucket, p.bucket.size
        qb = _pad(q, p.q_src, p.q_dest, n, b.q_len, dtype).mul_(qk_scale)  # scale once per bucket
        kb = _pad(k, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        vb = _pad(v, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        ob = torch.zeros_like(qb)
        for c in p.chunks:
            s = torch.bmm(qb[:, c.q0:c.q1], kb[:, c.k0:c.k1].transpose(1, 2),
                          out=ws.take("s", qb.shape[0], c.q1 - c.q0, c.k1 - c.k0))
            blocked = _blocked(c, b, causal, window, q.device)
            if activation == "softmax":
                _masked_fill_(s, blocked, n, torch.finfo(dtype).min)
                _softmax_(s)
            else:
                _activation_(activation, s)
            _masked_fill_(s, blocked, n, 0.0)  # also zeroes softmax rows with no allowed key
            # Chunks partition the rows of ob. (Out-of-place bmm + copy rather than baddbmm_:
            # FlopCounterMode does not count in-place matmuls.)
            ob[:, c.q0:c.q1] = torch.bmm(s, vb[:, c.k0:c.k1], out=ws.take("o", qb.shape[0], c.q1 - c.q0, qb.shape[2]))
        _unpad_into(out, ob.mul_(out_scale), p.q_src, p.q_dest, n)
    return out


def _backward(grad_out, q, k, v, out, plans, activation, causal, window, qk_scale, out_scale):
    """dQ, dK, dV chunk by chunk. Q is pre-scaled by qk_scale and dO by out_scale, so
    S = Q'K^T, dK = dS^T Q' and dV = W^T dO' need no further scaling; dQ = qk_scale dS K."""
    dtype = _compute_dtype(q)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    softmax = activation == "softmax"
    ws = _Workspace(q, dtype, plans)
    for p in plans:
        b, n = p.bucket, p.bucket.size
        qb = _pad(q, p.q_src, p.q_dest, n, b.q_len, dtype).mul_(qk_scale)
        kb = _pad(k, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        vb = _pad(v, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        dob = _pad(grad_out, p.q_src, p.q_dest, n, b.q_len, dtype)
        if softmax:  # delta_i = dO_i . O_i = sum_j P_ij dP_ij
            delta = (dob * _pad(out, p.q_src, p.q_dest, n, b.q_len, dtype)).sum(-1, keepdim=True)
        dob.mul_(out_scale)
        dqb, dkb, dvb = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        for c in p.chunks:
            qc, kc, vc, doc = qb[:, c.q0:c.q1], kb[:, c.k0:c.k1], vb[:, c.k0:c.k1], dob[:, c.q0:c.q1]
            shape = (qb.shape[0], c.q1 - c.q0, c.k1 - c.k0)
            s = torch.bmm(qc, kc.transpose(1, 2), out=ws.take("s", *shape))
            ds = torch.bmm(doc, vc.transpose(1, 2), out=ws.take("ds", *shape))  # dA or dP
            blocked = _blocked(c, b, causal, window, q.device)
            if softmax:
                _masked_fill_(s, blocked, n, torch.finfo(dtype).min)
                w = _softmax_(s)
                _masked_fill_(w, blocked, n, 0.0)
                ds.sub_(delta[:, c.q0:c.q1]).mul_(w)  # dS = P (dP - delta)
            else:
                _activation_backward_(activation, ds, s)
                w = _activation_(activation, s)  # s is not needed any more
                _masked_fill_(w, blocked, n, 0.0)
                _masked_fill_(ds, blocked, n, 0.0)
            kv_shape = (qb.shape[0], c.k1 - c.k0, qb.shape[2])
            dvb[:, c.k0:c.k1].add_(torch.bmm(w.transpose(1, 2), doc, out=ws.take("kv", *kv_shape)))
            dkb[:, c.k0:c.k1].add_(torch.bmm(ds.transpose(1, 2), qc, out=ws.take("kv", *kv_shape)))
            dqb[:, c.q0:c.q1] = torch.bmm(ds, kc, out=ws.take("o", qb.shape[0], c.q1 - c.q0, qb.shape[2]))
        _unpad_into(dq, dqb.mul_(qk_scale), p.q_src, p.q_dest, n)
        _unpad_into(dk, dkb, p.kv_src, p.kv_dest, n)
        _unpad_into(dv, dvb, p.kv_src, p.kv_dest, n)
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
