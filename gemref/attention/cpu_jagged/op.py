"""`cpu_jagged`: GDPA on CPU as a few large batched matmuls over padded length buckets.

The reference pads every sequence to the longest and materialises (B, H, L, L) scores; on a
skewed batch that is mostly padding, and at L = 4096 it is gigabytes. This kernel:

  1. groups sequences of similar length into buckets (gemref/attention/bucketing.py), so the
     padded work stays within ~25% of the real work, and lays all buckets out in one padded
     buffer per tensor (one gather in, one gather out: plan.py);
  2. covers each bucket's allowed (query, key) pairs with a few batched matmuls whose
     operands are strided views of those buffers: causal attention with a pointwise
     activation as a binary tree of blocks (the diagonal leaves in one matmul, one mask-free
     matmul per level), so it computes ~L^2/2 scores, not L^2; everything else as chunks of
     query rows over the keys they may attend. Masks are triangles (`tril_`/`triu_`) or a
     cached additive bias, never a per-tile boolean fill (tiles.py);
  3. runs the matmuls in waves of at most CHUNK_ENTRIES scores: the wave's tiles share one
     workspace and a pointwise activation runs once per wave, so the live score memory is
     bounded instead of O(L^2) and the op count stays in the tens per call;
  4. recomputes the scores in backward (saving only q, k, v and the offsets) instead of
     storing them.

Softmax needs no online rescaling: its pieces hold *all* keys of their rows, so each row is
normalised exactly once. Scales are folded into the padded operands (k by qk_scale, v by
out_scale), so no score tile is rescaled. Half-precision inputs are computed in float32
(CPUs without AMX run bf16 matmuls slowly, and accumulating dK, dV in bf16 loses precision).

One opaque op (jagged_op.py). Forward and backward are torch.library custom ops
(gemref::cpu_jagged_fwd, gemref::cpu_jagged_bwd) with fake implementations and FlopCounterMode
formulas, like the Triton kernel: dispatch-level tools see one op, not the tens of aten ops inside. So
torch.compile traces around it, FlopCounterMode counts its executed FLOPs (the formula
replays the plan), and AutoAC's save_matmuls checkpointing (gemref/autoac/plan.py) saves its
output instead of recomputing the forward (the workspace it reuses holds no activations).
The plan depends only on the offsets; it is cached by them, so forward, backward and every
layer of a step build it once. gemref.mfu.memory's CPU tracker is let into the op
(register_torch_dispatch), so peak-memory figures still count the workspace.

Threads: the kernel issues tens of mid-sized ops per call, each an OpenMP parallel region.
On an oversubscribed CPU (more busy threads than cores, e.g. other jobs on a shared
machine) every region's barrier waits for descheduled threads and it slows down a lot;
there, give torch fewer threads (torch.set_num_threads, or `gemref bench attention --threads`).

Executed matmul FLOPs, per score entry of the plan: forward 2 matmuls (S = QK^T, O = A V),
backward 5 (S recomputed, dA = dO V^T, dV = A^T dO, dK = dS^T Q, dQ = dS K), each 2 * D.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ...data.jagged import lengths_to_offsets
from ..api import register_kernel
from ..jagged_op import JaggedGDPAOps
from .plan import Piece, Plan, make_plan
from .tiles import (activation_, activation_backward_, compute_dtype, key_padding_bias, keys, new_padded,
                               pad, queries, softmax_, unpad, zero_masked_)
from ..reference import ACTIVATIONS

CHUNK_ENTRIES = 1 << 18  # score entries per wave (all its tiles): 1 MiB in float32, about an L2 cache


def _plan(q_offsets: Tensor, kv_offsets: Tensor, heads: int, causal: bool, window: int | None,
          softmax: bool) -> Plan:
    return make_plan(q_offsets.tolist(), kv_offsets.tolist(), heads, causal, window, softmax, CHUNK_ENTRIES)


def _bmm_into(target: Tensor, a: Tensor, b: Tensor, accumulate: bool, scratch: Tensor) -> None:
    """target = a @ b, or target += a @ b (through `scratch`: an in-place baddbmm_ on a strided
    view falls back to one addmm per tile on CPU)."""
    if not accumulate:
        torch.bmm(a, b, out=target)
    else:
        target.add_(torch.bmm(a, b, out=scratch[:target.numel()].view(target.shape)))


def _scratch(plan: Plan, like: Tensor, D: int, dtype: torch.dtype) -> Tensor:
    size = max((p.batch * max(p.rows, p.keys) * D for wave in plan.waves for p in wave), default=0)
    return like.new_empty(size, dtype=dtype)


def _tiles(ws: Tensor, wave: tuple[Piece, ...]) -> list[Tensor]:
    """Consecutive (batch, rows, keys) slices of the workspace, one per piece."""
    tiles, offset = [], 0
    for p in wave:
        tiles.append(ws[offset:offset + p.entries].view(p.batch, p.rows, p.keys))
        offset += p.entries
    return tiles


def _key_bias(plan: Plan, softmax: bool, dtype: torch.dtype) -> Tensor | None:
    needed = softmax and any(p.pad_keys for wave in plan.waves for p in wave)
    return key_padding_bias(plan.kv, dtype) if needed else None


# ----------------------------------------------------------------------------- the loops
def _forward(q, k, v, plan: Plan, activation, qk_scale, out_scale) -> Tensor:
    dtype, D = compute_dtype(q), q.shape[-1]
    softmax = activation == "softmax"
    qp, kp, vp = pad(q, plan.q, dtype), pad(k, plan.kv, dtype, qk_scale), pad(v, plan.kv, dtype, out_scale)
    out = new_padded(plan.q, D, q, dtype, plan.q_written)
    ws, scratch = q.new_empty(plan.workspace, dtype=dtype), _scratch(plan, q, D, dtype)
    bias = _key_bias(plan, softmax, dtype)
    for wave in plan.waves:
        tiles = _tiles(ws, wave)
        for p, s in zip(wave, tiles):
            torch.bmm(queries(qp, p), keys(kp, p).transpose(1, 2), out=s)
            if softmax:
                softmax_(s, p, bias)
            else:
                zero_masked_(s, p)
        if not softmax:  # masked scores are 0 and act(0) = 0
            activation_(activation, ws[:sum(p.entries for p in wave)])
        for p, w in zip(wave, tiles):
            _bmm_into(queries(out, p), w, keys(vp, p), p.q_acc, scratch)
    return unpad(out, plan.q, q)


def _backward(grad_out, q, k, v, plan: Plan, activation, qk_scale, out_scale):
    """dQ, dK, dV wave by wave. K is pre-scaled by qk_scale and dO by out_scale, so
    S = QK'^T, dQ = dS K' and dV = W^T dO' need no further scaling; dK = qk_scale dS^T Q.

    Softmax: dS = P (dP - delta) with delta_i = sum_j P_ij dP_ij from the tile itself (a
    softmax piece holds whole rows), not from dO . O: with half-precision inputs the saved
    output is rounded, and delta cancels against dP."""
    dtype, D = compute_dtype(q), q.shape[-1]
    softmax = activation == "softmax"
    qp, kp, vp = pad(q, plan.q, dtype), pad(k, plan.kv, dtype, qk_scale), pad(v, plan.kv, dtype)
    dop = pad(grad_out, plan.q, dtype, out_scale)
    dq = new_padded(plan.q, D, q, dtype, plan.q_written)
    dk, dv = (new_padded(plan.kv, D, q, dtype, plan.k_written) for _ in range(2))
    ws_s, ws_ds = q.new_empty(plan.workspace, dtype=dtype), q.new_empty(plan.workspace, dtype=dtype)
    scratch = _scratch(plan, q, D, dtype)
    bias = _key_bias(plan, softmax, dtype)
    for wave in plan.waves:
        s_tiles, ds_tiles = _tiles(ws_s, wave), _tiles(ws_ds, wave)
        for p, s, ds in zip(wave, s_tiles, ds_tiles):
            torch.bmm(queries(qp, p), keys(kp, p).transpose(1, 2), out=s)
            torch.bmm(queries(dop, p), keys(vp, p).transpose(1, 2), out=ds)  # dA, or dP
            if softmax:  # dS = P (dP - delta)
                w = softmax_(s, p, bias)
                ds.sub_(torch.linalg.vecdot(w, ds).unsqueeze(-1)).mul_(w)
            else:
                zero_masked_(s, p)
                zero_masked_(ds, p)
        if not softmax:
            n = sum(p.entries for p in wave)
            activation_backward_(activation, ws_ds[:n], ws_s[:n])
            activation_(activation, ws_s[:n])
        for p, w, ds in zip(wave, s_tiles, ds_tiles):
            _bmm_into(keys(dv, p), w.transpose(1, 2), queries(dop, p), p.k_acc, scratch)
            _bmm_into(keys(dk, p), ds.transpose(1, 2), queries(qp, p), p.k_acc, scratch)
            _bmm_into(queries(dq, p), ds, keys(kp, p), p.q_acc, scratch)
    return unpad(dq, plan.q, q), unpad(dk, plan.kv, k, qk_scale), unpad(dv, plan.kv, v)


# ------------------------------------------------------------------ custom ops and autograd
def _fwd_body(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
              activation: str, causal: bool, window: int, qk_scale: float, out_scale: float) -> Tensor:
    """out (Tq, H, D) in q's dtype. window 0: none."""
    plan = _plan(q_offsets, kv_offsets, q.shape[1], causal, window or None, activation == "softmax")
    return _forward(q, k, v, plan, activation, qk_scale, out_scale)


def _bwd_body(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
              activation: str, causal: bool, window: int, qk_scale: float,
              out_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv)."""
    plan = _plan(q_offsets, kv_offsets, q.shape[1], causal, window or None, activation == "softmax")
    return _backward(grad_out, q, k, v, plan, activation, qk_scale, out_scale)


OPS = JaggedGDPAOps("cpu_jagged", _fwd_body, _bwd_body)


def _executed(q_offsets: Tensor, kv_offsets: Tensor, activation: str, causal: bool, window: int,
              heads: int, head_dim: int) -> int:
    """Matmul FLOPs of ONE pass over the plan's score entries (2 * D per entry)."""
    plan = _plan(q_offsets, kv_offsets, heads, causal, window or None, activation == "softmax")
    return 2 * head_dim * plan.entries


@register_flop_formula(torch.ops.gemref.cpu_jagged_fwd, get_raw=True)
def _fwd_flop(q, k, v, q_offsets, kv_offsets, activation, causal, window, *args, out_val=None, **kwargs) -> int:
    return 2 * _executed(q_offsets, kv_offsets, activation, causal, window, q.shape[1], q.shape[2])


@register_flop_formula(torch.ops.gemref.cpu_jagged_bwd, get_raw=True)
def _bwd_flop(grad_out, q, k, v, q_offsets, kv_offsets, activation, causal, window,
              *args, out_val=None, **kwargs) -> int:
    return 5 * _executed(q_offsets, kv_offsets, activation, causal, window, q.shape[1], q.shape[2])


# -------------------------------------------------------------------------- entry points
gdpa_cpu_jagged = OPS  # the gdpa entry point (KernelFn)


def cpu_jagged_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                              causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of the plan these lengths produce. The pointwise and
    the softmax plans execute the same score entries (plan.py), so the
    activation is not needed."""
    offsets = [lengths_to_offsets(x.reshape(-1).cpu()) for x in (q_lengths, kv_lengths)]
    one_pass = _executed(*offsets, "silu", causal, window or 0, heads, head_dim)
    return 2 * one_pass, 5 * one_pass


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if q.device.type != "cpu":
        return f"cpu_jagged is the CPU path and q is on {q.device.type} (use triton or sdpa there)"
    if not q.dtype.is_floating_point:
        return f"needs floating-point inputs, got {q.dtype}"
    assert activation in ACTIVATIONS
    return None


register_kernel("cpu_jagged", gdpa_cpu_jagged, _unavailable, cpu_jagged_executed_flops)
