"""Triton GDPA backward: a dK/dV kernel (per key tile) and a dQ kernel (per query tile).

bwd=split (deterministic, the default): each program owns the rows it writes, no atomics, at
the price of recomputing S = QK^T and dO V^T in both kernels:
  dK/dV kernel: S^T, dA^T = V dO^T, dV += A^T dO, dK += dS^T Q   (4 matmuls per tile pair);
  dQ kernel:    S, dA = dO V^T, dQ += dS K                        (3 matmuls),
so backward executes 3.5x the forward's 2 matmuls, as FlashAttention-2's Triton backward does.
bwd=atomic: the dK/dV kernel also computes dS K for each query tile it visits and adds it
into a float32 dQ buffer with atomics (5 matmuls per tile pair, no dQ kernel); the order of
the additions, hence the last bits of dQ, changes from run to run.

Gradients, with s = qk_scale * q.k and out = out_scale * sum_j w_ij v_j:
  pointwise: w = act(s), dS = out_scale * (dO . v) * act'(s)
  softmax:   w = P,      dS = P * (out_scale * (dO . v) - delta),  delta_i = dO_i . out_i
then dQ = qk_scale * dS K, dK = qk_scale * dS^T Q, dV = out_scale * W^T dO. With FOLD_SCALE the
score scale is folded into the resident K (dK/dV) or Q (dQ) tile once per program; the atomic
dQ then holds dS (scale K), and the wrapper rescales it. Gradients are written with their own
strides (they need not share Q/K/V's layout).
"""
import triton
import triton.language as tl

from .act import _act_and_grad, _act_grad
from .fwd import (NO_SPECIALIZE, _allowed, _dot, _dot_acc, _key_tiles, _offsets, _query_tiles,
                              _sequence)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, DQAcc, q_start, len_q, len_k, h, n_heads,
                stride_qt, stride_qh, stride_dot, stride_doh, stride_at, stride_ah, cols, t_begin, t_end,
                scale, out_scale, window, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                MASKED: tl.constexpr, PRECISION: tl.constexpr, SILU_TANH: tl.constexpr,
                FOLD_SCALE: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        rows = t * BLOCK_M + offs_m
        q_ptrs = Q + _offsets(q_start, rows, stride_qt, h, stride_qh, offs_d)
        do_ptrs = DO + _offsets(q_start, rows, stride_dot, h, stride_doh, offs_d)
        if MASKED:
            q = tl.load(q_ptrs, mask=(rows < len_q)[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=(rows < len_q)[:, None], other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
        s_t = _dot(k, tl.trans(q), PRECISION)                # (BLOCK_N, BLOCK_M)
        if not FOLD_SCALE:
            s_t = s_t * scale
        dw_t = _dot(v, tl.trans(do), PRECISION) * out_scale  # dA^T or dP^T
        if ACT == "softmax":
            if MASKED:
                lse = tl.load(Lse + (q_start + rows) * n_heads + h, mask=rows < len_q, other=0.0)
                delta = tl.load(Delta + (q_start + rows) * n_heads + h, mask=rows < len_q, other=0.0)
                # mask before exp2: a blocked score may exceed the row's lse by a lot
                s_t = tl.where(tl.trans(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW)),
                               s_t, float("-inf"))
            else:
                lse = tl.load(Lse + (q_start + rows) * n_heads + h)
                delta = tl.load(Delta + (q_start + rows) * n_heads + h)
            w_t = tl.exp2(s_t - lse[None, :])
            ds_t = w_t * (dw_t - delta[None, :])
        else:
            w_t, g_t = _act_and_grad(s_t, ACT, SILU_TANH)
            if MASKED:
                allowed_t = tl.trans(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW))
                w_t = tl.where(allowed_t, w_t, 0.0)
                g_t = tl.where(allowed_t, g_t, 0.0)
            ds_t = dw_t * g_t
        dv = _dot_acc(w_t.to(do.dtype), do, dv, PRECISION)
        dk = _dot_acc(ds_t.to(q.dtype), q, dk, PRECISION)
        if ATOMIC_DQ:
            dq_part = _dot(tl.trans(ds_t.to(k.dtype)), k, PRECISION)   # (BLOCK_M, HEAD_DIM)
            dq_ptrs = DQAcc + _offsets(q_start, rows, stride_at, h, stride_ah, offs_d)
            if MASKED:
                tl.atomic_add(dq_ptrs, dq_part, mask=(rows < len_q)[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq_part, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gdpa_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQAcc, QOff, KOff, Sched, n_heads,
                         scale, qk_scale, out_scale, window,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_dot, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                         stride_at, stride_ah,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                         PRECISION: tl.constexpr, SILU_TANH: tl.constexpr, FOLD_SCALE: tl.constexpr,
                         ATOMIC_DQ: tl.constexpr):
    tile, h, q_start, len_q, k_start, len_k = _sequence(QOff, KOff, Sched, tl.program_id(0))
    n0 = tile * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = (cols < len_k)[:, None]
    k = tl.load(K + _offsets(k_start, cols, stride_kt, h, stride_kh, offs_d), mask=col_ok, other=0.0)
    v = tl.load(V + _offsets(k_start, cols, stride_vt, h, stride_vh, offs_d), mask=col_ok, other=0.0)
    if FOLD_SCALE:
        k = (k.to(tl.float32) * scale).to(K.dtype.element_ty)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    t_lo, t_full_lo, t_full_hi, t_hi = _query_tiles(n0, len_q, len_k, window, BLOCK_M, BLOCK_N,
                                                    CAUSAL, HAS_WINDOW)
    # Masked query tiles, then full ones (no mask code compiled in), then masked again.
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, DQAcc, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, stride_at, stride_ah, cols,
                         t_lo, t_full_lo, scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL,
                         HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE, ATOMIC_DQ)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, DQAcc, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, stride_at, stride_ah, cols,
                         t_full_lo, t_full_hi, scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL,
                         HAS_WINDOW, False, PRECISION, SILU_TANH, FOLD_SCALE, ATOMIC_DQ)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, DQAcc, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, stride_at, stride_ah, cols,
                         t_full_hi, t_hi, scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL,
                         HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE, ATOMIC_DQ)
    tl.store(DK + _offsets(k_start, cols, stride_dkt, h, stride_dkh, offs_d),
             (dk * qk_scale).to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + _offsets(k_start, cols, stride_dvt, h, stride_dvh, offs_d),
             (dv * out_scale).to(DV.dtype.element_ty), mask=col_ok)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
              stride_vt, stride_vh, rows, t_begin, t_end, scale, out_scale, window,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
              PRECISION: tl.constexpr, SILU_TANH: tl.constexpr, FOLD_SCALE: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        cols = t * BLOCK_N + offs_n
        k_ptrs = K + _offsets(k_start, cols, stride_kt, h, stride_kh, offs_d)
        v_ptrs = V + _offsets(k_start, cols, stride_vt, h, stride_vh, offs_d)
        if MASKED:
            k = tl.load(k_ptrs, mask=(cols < len_k)[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(cols < len_k)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, tl.trans(k), PRECISION)
        if not FOLD_SCALE:
            s = s * scale
        dw = _dot(do, tl.trans(v), PRECISION) * out_scale
        if ACT == "softmax":
            if MASKED:
                s = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), s, float("-inf"))
            ds = tl.exp2(s - lse[:, None]) * (dw - delta[:, None])
        else:
            ds = dw * _act_grad(s, ACT, SILU_TANH)
            if MASKED:
                ds = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), ds, 0.0)
        dq = _dot_acc(ds.to(k.dtype), k, dq, PRECISION)
    return dq


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gdpa_bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, QOff, KOff, Sched, n_heads,
                       scale, qk_scale, out_scale, window,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_dot, stride_doh, stride_dqt, stride_dqh,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                       PRECISION: tl.constexpr, SILU_TANH: tl.constexpr, FOLD_SCALE: tl.constexpr):
    tile, h, q_start, len_q, k_start, len_k = _sequence(QOff, KOff, Sched, tl.program_id(0))
    m0 = tile * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < len_q
    q = tl.load(Q + _offsets(q_start, rows, stride_qt, h, stride_qh, offs_d), mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + _offsets(q_start, rows, stride_dot, h, stride_doh, offs_d), mask=row_ok[:, None], other=0.0)
    if FOLD_SCALE:
        q = (q.to(tl.float32) * scale).to(Q.dtype.element_ty)
    if ACT == "softmax":
        lse = tl.load(Lse + (q_start + rows) * n_heads + h, mask=row_ok, other=0.0)
        delta = tl.load(Delta + (q_start + rows) * n_heads + h, mask=row_ok, other=0.0)
    else:
        lse = tl.zeros((BLOCK_M,), dtype=tl.float32)
        delta = lse
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    t_lo, t_full_lo, t_full_hi, t_hi = _key_tiles(m0, len_q, len_k, window, BLOCK_M, BLOCK_N,
                                                  CAUSAL, HAS_WINDOW)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                   stride_vt, stride_vh, rows, t_lo, t_full_lo, scale, out_scale, window,
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                   stride_vt, stride_vh, rows, t_full_lo, t_full_hi, scale, out_scale, window,
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, False, PRECISION, SILU_TANH, FOLD_SCALE)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                   stride_vt, stride_vh, rows, t_full_hi, t_hi, scale, out_scale, window,
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE)
    tl.store(DQ + _offsets(q_start, rows, stride_dqt, h, stride_dqh, offs_d),
             (dq * qk_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
