"""`cpu_jagged`: GDPA on CPU as length-bucketed, query-chunked batched matmuls.

The reference pads every sequence to the longest and materialises (B, H, L, L) scores; on a
skewed batch that is mostly padding, and at L = 4096 it is gigabytes. This kernel:

  1. groups sequences of similar length into buckets (gemref/attention/bucketing.py), so the
     padded work stays within ~25% of the real work;
  2. walks each bucket in chunks of query rows, visiting only the keys those rows may attend
     (causal: up to the chunk's last row; window: within W), so the live score tile is
     bounded (CHUNK_ENTRIES per chunk) instead of O(L^2);
  3. recomputes the scores of each chunk in backward (saving only q, k, v, the offsets and,
     for softmax, the output) instead of storing them.

Softmax needs no online rescaling here: a chunk holds *all* keys of its rows, so each row is
normalised exactly once. Half-precision inputs are computed in float32 (CPUs without AMX
run bf16 matmuls slowly, and accumulating dK, dV across chunks in bf16 loses precision).
Chunk tiles live in a small workspace reused by every chunk (cpu_jagged_tiles.py).

One opaque op. Forward and backward are torch.library custom ops (gemref::cpu_jagged_fwd,
gemref::cpu_jagged_bwd) with fake implementations and FlopCounterMode formulas, like the
Triton kernel: dispatch-level tools see one op, not the few hundred aten ops inside. So
torch.compile traces around it, FlopCounterMode counts its executed FLOPs (the formula
replays the plan), and selective activation checkpointing (gemref/autoac/solver.py) saves its
output instead of recomputing the forward (the workspace tiles it reuses are no activations).
The plan (buckets, chunks, row indices) depends only on the offsets and is rebuilt in each
op from them, in a few vectorised ops. gemref.mfu.memory's CPU tracker is let into the op
(register_torch_dispatch), so peak-memory figures still count the workspace.

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
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..mfu.memory import LiveTensorBytes
from .api import register_kernel
from .bucketing import Bucket, Chunk, chunk_mask, make_buckets, query_chunks
from .cpu_jagged_tiles import (Workspace, activation_, activation_backward_, compute_dtype, masked_fill_,
                               pad, softmax_, unpad_into)
from .reference import ACTIVATIONS, default_qk_scale

CHUNK_ENTRIES = 1 << 20  # score entries (n * H * rows * keys) per chunk: 4 MiB in float32


# ------------------------------------------------------------------------------------ plan
@dataclass
class _BucketPlan:
    bucket: Bucket
    chunks: list[Chunk]
    q_src: Tensor    # rows of the bucket's queries in the jagged q (T, H, D) ...
    q_dest: Tensor   # ... and in its zero-padded flat (n * q_len) block
    kv_src: Tensor
    kv_dest: Tensor


def _rows(offsets: list[int], buckets: list[Bucket], side: str, device) -> list[tuple[Tensor, Tensor]]:
    """(src, dest) row indices of every bucket, as in `pad`, for its queries (side "q") or
    keys ("kv"): one vectorised pass over all buckets (row r of sequence s in bucket slot i
    has src = offsets[s] + r, dest = i * padded length + r)."""
    src_shift, dest_shift, lengths, sizes, row = [], [], [], [], 0
    for b in buckets:
        lens, padded = (b.q_lens, b.q_len) if side == "q" else (b.kv_lens, b.kv_len)
        for i, (seq, length) in enumerate(zip(b.seqs, lens)):
            src_shift.append(offsets[seq] - row)
            dest_shift.append(i * padded - row)
            lengths.append(length)
            row += length
        sizes.append(sum(lens))
    lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
    rows = torch.arange(row, device=device)

    def shifted(shift: list[int]) -> Tensor:
        per_row = torch.repeat_interleave(torch.tensor(shift, dtype=torch.int64, device=device), lengths_t,
                                          output_size=row)
        return rows + per_row
    return list(zip(shifted(src_shift).split(sizes), shifted(dest_shift).split(sizes)))


def _plan(q_offsets: Tensor, kv_offsets: Tensor, heads: int, causal: bool,
          window: int | None) -> list[_BucketPlan]:
    q_offs, kv_offs = q_offsets.tolist(), kv_offsets.tolist()
    q_lens = [b - a for a, b in zip(q_offs, q_offs[1:])]
    kv_lens = [b - a for a, b in zip(kv_offs, kv_offs[1:])]
    buckets = make_buckets(q_lens, kv_lens)
    q_rows = _rows(q_offs, buckets, "q", q_offsets.device)
    kv_rows = q_rows if q_offs == kv_offs else _rows(kv_offs, buckets, "kv", kv_offsets.device)
    return [_BucketPlan(b, query_chunks(b, heads, causal, window, CHUNK_ENTRIES), *q_r, *kv_r)
            for b, q_r, kv_r in zip(buckets, q_rows, kv_rows)]


def _tiles(plans: list[_BucketPlan], heads: int) -> list[tuple[int, int, int]]:
    """Every chunk's score tile as (n*H, query rows, keys), to size the workspace."""
    return [(p.bucket.size * heads, c.q1 - c.q0, c.k1 - c.k0) for p in plans for c in p.chunks]


def _blocked(chunk: Chunk, bucket: Bucket, causal: bool, window: int | None, device) -> Tensor | None:
    mask = chunk_mask(chunk, bucket, causal, window, device)
    return None if mask is None else ~mask


# ----------------------------------------------------------------------------- the loops
def _forward(q, k, v, plans, activation, causal, window, qk_scale, out_scale) -> Tensor:
    dtype = compute_dtype(q)
    out = torch.zeros_like(q)
    ws = Workspace(q, dtype, _tiles(plans, q.shape[1]))
    for p in plans:
        b, n = p.bucket, p.bucket.size
        qb = pad(q, p.q_src, p.q_dest, n, b.q_len, dtype).mul_(qk_scale)  # scale once per bucket
        kb = pad(k, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        vb = pad(v, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        ob = torch.zeros_like(qb)
        for c in p.chunks:
            s = torch.bmm(qb[:, c.q0:c.q1], kb[:, c.k0:c.k1].transpose(1, 2),
                          out=ws.take("s", qb.shape[0], c.q1 - c.q0, c.k1 - c.k0))
            blocked = _blocked(c, b, causal, window, q.device)
            if activation == "softmax":
                masked_fill_(s, blocked, n, torch.finfo(dtype).min)
                softmax_(s)
            else:
                activation_(activation, s)
            masked_fill_(s, blocked, n, 0.0)  # also zeroes softmax rows with no allowed key
            # Chunks partition the rows of ob. (Out-of-place bmm + copy rather than baddbmm_:
            # FlopCounterMode does not count in-place matmuls.)
            ob[:, c.q0:c.q1] = torch.bmm(s, vb[:, c.k0:c.k1], out=ws.take("o", qb.shape[0], c.q1 - c.q0, qb.shape[2]))
        unpad_into(out, ob.mul_(out_scale), p.q_src, p.q_dest, n)
    return out


def _backward(grad_out, q, k, v, out, plans, activation, causal, window, qk_scale, out_scale):
    """dQ, dK, dV chunk by chunk. Q is pre-scaled by qk_scale and dO by out_scale, so
    S = Q'K^T, dK = dS^T Q' and dV = W^T dO' need no further scaling; dQ = qk_scale dS K."""
    dtype = compute_dtype(q)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    softmax = activation == "softmax"
    ws = Workspace(q, dtype, _tiles(plans, q.shape[1]))
    for p in plans:
        b, n = p.bucket, p.bucket.size
        qb = pad(q, p.q_src, p.q_dest, n, b.q_len, dtype).mul_(qk_scale)
        kb = pad(k, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        vb = pad(v, p.kv_src, p.kv_dest, n, b.kv_len, dtype)
        dob = pad(grad_out, p.q_src, p.q_dest, n, b.q_len, dtype)
        if softmax:  # delta_i = dO_i . O_i = sum_j P_ij dP_ij
            delta = (dob * pad(out, p.q_src, p.q_dest, n, b.q_len, dtype)).sum(-1, keepdim=True)
        dob.mul_(out_scale)
        dqb, dkb, dvb = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        for c in p.chunks:
            qc, kc, vc, doc = qb[:, c.q0:c.q1], kb[:, c.k0:c.k1], vb[:, c.k0:c.k1], dob[:, c.q0:c.q1]
            shape = (qb.shape[0], c.q1 - c.q0, c.k1 - c.k0)
            s = torch.bmm(qc, kc.transpose(1, 2), out=ws.take("s", *shape))
            ds = torch.bmm(doc, vc.transpose(1, 2), out=ws.take("ds", *shape))  # dA or dP
            blocked = _blocked(c, b, causal, window, q.device)
            if softmax:
                masked_fill_(s, blocked, n, torch.finfo(dtype).min)
                w = softmax_(s)
                masked_fill_(w, blocked, n, 0.0)
                ds.sub_(delta[:, c.q0:c.q1]).mul_(w)  # dS = P (dP - delta)
            else:
                activation_backward_(activation, ds, s)
                w = activation_(activation, s)  # s is not needed any more
                masked_fill_(w, blocked, n, 0.0)
                masked_fill_(ds, blocked, n, 0.0)
            kv_shape = (qb.shape[0], c.k1 - c.k0, qb.shape[2])
            dvb[:, c.k0:c.k1].add_(torch.bmm(w.transpose(1, 2), doc, out=ws.take("kv", *kv_shape)))
            dkb[:, c.k0:c.k1].add_(torch.bmm(ds.transpose(1, 2), qc, out=ws.take("kv", *kv_shape)))
            dqb[:, c.q0:c.q1] = torch.bmm(ds, kc, out=ws.take("o", qb.shape[0], c.q1 - c.q0, qb.shape[2]))
        unpad_into(dq, dqb.mul_(qk_scale), p.q_src, p.q_dest, n)
        unpad_into(dk, dkb, p.kv_src, p.kv_dest, n)
        unpad_into(dv, dvb, p.kv_src, p.kv_dest, n)
    return dq, dk, dv


# ------------------------------------------------------------------ custom ops and autograd
def _fwd_body(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
              activation: str, causal: bool, window: int, qk_scale: float, out_scale: float) -> Tensor:
    """out (Tq, H, D) in q's dtype. window 0: none."""
    window = window or None
    plans = _plan(q_offsets, kv_offsets, q.shape[1], causal, window)
    return _forward(q, k, v, plans, activation, causal, window, qk_scale, out_scale)


cpu_jagged_fwd = torch.library.custom_op("gemref::cpu_jagged_fwd", _fwd_body, mutates_args=())


@cpu_jagged_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale):
    return torch.empty_like(q)


def _bwd_body(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None, q_offsets: Tensor,
              kv_offsets: Tensor, activation: str, causal: bool, window: int, qk_scale: float,
              out_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv); `out` (the forward's output) is read for softmax only, else None."""
    window = window or None
    plans = _plan(q_offsets, kv_offsets, q.shape[1], causal, window)
    return _backward(grad_out, q, k, v, out, plans, activation, causal, window, qk_scale, out_scale)


cpu_jagged_bwd = torch.library.custom_op("gemref::cpu_jagged_bwd", _bwd_body, mutates_args=())


@cpu_jagged_bwd.register_fake
def _(grad_out, q, k, v, out, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale = inputs
    ctx.save_for_backward(q, k, v, output if activation == "softmax" else None, q_offsets, kv_offsets)
    ctx.args = (activation, causal, window, qk_scale, out_scale)


def _backward_op(ctx, grad_out):
    q, k, v, out, q_offsets, kv_offsets = ctx.saved_tensors
    dq, dk, dv = torch.ops.gemref.cpu_jagged_bwd(grad_out.contiguous(), q, k, v, out, q_offsets, kv_offsets,
                                                 *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


cpu_jagged_fwd.register_autograd(_backward_op, setup_context=_setup_context)


def _lengths(offsets: Tensor) -> Tensor:
    return offsets[1:] - offsets[:-1]


@register_flop_formula(torch.ops.gemref.cpu_jagged_fwd, get_raw=True)
def _fwd_flop(q, k, v, q_offsets, kv_offsets, activation, causal, window, *args, out_val=None, **kwargs) -> int:
    return cpu_jagged_executed_flops(_lengths(q_offsets), _lengths(kv_offsets), q.shape[1], q.shape[2],
                                     causal, window or None)[0]


@register_flop_formula(torch.ops.gemref.cpu_jagged_bwd, get_raw=True)
def _bwd_flop(grad_out, q, k, v, out, q_offsets, kv_offsets, activation, causal, window,
              *args, out_val=None, **kwargs) -> int:
    return cpu_jagged_executed_flops(_lengths(q_offsets), _lengths(kv_offsets), q.shape[1], q.shape[2],
                                     causal, window or None)[1]


def _memory_traced(mode, func, types, args, kwargs):
    """Under gemref.mfu.memory's CPU tracker, run the op's body with the tracker on, so the
    tiles and padded blocks it allocates count towards the peak."""
    body = _fwd_body if func is torch.ops.gemref.cpu_jagged_fwd.default else _bwd_body
    with mode:
        return body(*args, **(kwargs or {}))


for _op in (cpu_jagged_fwd, cpu_jagged_bwd):
    torch.library.register_torch_dispatch(_op, LiveTensorBytes, _memory_traced)


# -------------------------------------------------------------------------- entry points
def gdpa_cpu_jagged(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                    activation: str, causal: bool = False, window: int | None = None,
                    qk_scale: float | None = None, out_scale: float = 1.0,
                    max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged GDPA, q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D); see the module docstring."""
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    return torch.ops.gemref.cpu_jagged_fwd(q, k, v, q_offsets, kv_offsets, activation, causal, window or 0,
                                           float(qk_scale), float(out_scale))


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
