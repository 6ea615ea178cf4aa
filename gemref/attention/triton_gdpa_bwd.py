"""Triton GDPA backward: one kernel for dK, dV (per key tile), one for dQ (per query tile).

Splitting the backward in two avoids atomics (each program owns the rows it writes, so the
result is deterministic) at the price of recomputing S = QK^T and dO V^T in both:
dK/dV kernel: S^T, dV += A^T dO, dA^T = V dO^T, dK += dS^T Q (4 matmuls per tile pair);
dQ kernel: S, dA = dO V^T, dQ += dS K (3 matmuls). So backward executes 3.5x the forward's
2 matmuls, as FlashAttention-2's Triton backward does.

Gradients, with s = qk_scale * q.k and out = out_scale * sum_j w_ij v_j:
  pointwise: w = act(s), dS = out_scale * (dO . v) * act'(s)
  softmax:   w = P,      dS = P * (out_scale * (dO . v) - delta),  delta_i = dO_i . out_i
then dQ = qk_scale * dS K, dK = qk_scale * dS^T Q, dV = out_scale * W^T dO.
"""
import triton
import triton.language as tl

from .triton_gdpa_fwd import _act, _act_grad, _allowed, _dot, _dot_acc, _key_tiles, _query_tiles, _sequence


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_start, len_q, len_k, h, n_heads,
                stride_qt, stride_qh, stride_dot, stride_doh, cols, t_begin, t_end,
                scale, out_scale, window, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                MASKED: tl.constexpr, PRECISION: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        rows = t * BLOCK_M + offs_m
        q_ptrs = Q + (q_start + rows)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
        do_ptrs = DO + (q_start + rows)[:, None] * stride_dot + h * stride_doh + offs_d[None, :]
        if MASKED:
            q = tl.load(q_ptrs, mask=(rows < len_q)[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=(rows < len_q)[:, None], other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
        s_t = _dot(k, tl.trans(q), PRECISION) * scale       # (BLOCK_N, BLOCK_M)
        dw_t = _dot(v, tl.trans(do), PRECISION) * out_scale  # dA^T or dP^T
        if ACT == "softmax":
            if MASKED:
                lse = tl.load(Lse + (q_start + rows) * n_heads + h, mask=rows < len_q, other=0.0)
                delta = tl.load(Delta + (q_start + rows) * n_heads + h, mask=rows < len_q, other=0.0)
            else:
                lse = tl.load(Lse + (q_start + rows) * n_heads + h)
                delta = tl.load(Delta + (q_start + rows) * n_heads + h)
            if MASKED:  # mask before exp2: a blocked score may exceed the row's lse by a lot
                s_t = tl.where(tl.trans(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW)),
                               s_t, float("-inf"))
            w_t = tl.exp2(s_t - lse[None, :])
            ds_t = w_t * (dw_t - delta[None, :])
        else:
            w_t = _act(s_t, ACT)
            g_t = _act_grad(s_t, ACT)
            if MASKED:
                allowed_t = tl.trans(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW))
                w_t = tl.where(allowed_t, w_t, 0.0)
                g_t = tl.where(allowed_t, g_t, 0.0)
            ds_t = dw_t * g_t
        dv = _dot_acc(w_t.to(do.dtype), do, dv, PRECISION)
        dk = _dot_acc(ds_t.to(q.dtype), q, dk, PRECISION)
    return dk, dv


@triton.jit
def gdpa_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, QOff, KOff, Sched, n_heads,
                         scale, qk_scale, out_scale, window,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_dot, stride_doh,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                         PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid // n_heads
    h = pid % n_heads
    tile, q_start, len_q, k_start, len_k = _sequence(QOff, KOff, Sched, slot)
    n0 = tile * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = (cols < len_k)[:, None]
    k = tl.load(K + (k_start + cols)[:, None] * stride_kt + h * stride_kh + offs_d[None, :], mask=col_ok, other=0.0)
    v = tl.load(V + (k_start + cols)[:, None] * stride_vt + h * stride_vh + offs_d[None, :], mask=col_ok, other=0.0)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    t_lo, t_full_lo, t_full_hi, t_hi = _query_tiles(n0, len_q, len_k, window, BLOCK_M, BLOCK_N,
                                                    CAUSAL, HAS_WINDOW)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, cols, t_lo, t_full_lo,
                         scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL, HAS_WINDOW,
                         True, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, cols, t_full_lo, t_full_hi,
                         scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL, HAS_WINDOW,
                         False, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, Lse, Delta, q_start, len_q, len_k, h, n_heads,
                         stride_qt, stride_qh, stride_dot, stride_doh, cols, t_full_hi, t_hi,
                         scale, out_scale, window, HEAD_DIM, BLOCK_M, ACT, CAUSAL, HAS_WINDOW,
                         True, PRECISION)
    # dK and dV rows share K's and V's (T, H, D) layout (the wrapper allocates them alike).
    tl.store(DK + (k_start + cols)[:, None] * stride_kt + h * stride_kh + offs_d[None, :],
             (dk * qk_scale).to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + (k_start + cols)[:, None] * stride_vt + h * stride_vh + offs_d[None, :],
             (dv * out_scale).to(DV.dtype.element_ty), mask=col_ok)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
              stride_vt, stride_vh, rows, t_begin, t_end, scale, out_scale, window,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
              PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        cols = t * BLOCK_N + offs_n
        k_ptrs = K + (k_start + cols)[:, None] * stride_kt + h * stride_kh + offs_d[None, :]
        v_ptrs = V + (k_start + cols)[:, None] * stride_vt + h * stride_vh + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=(cols < len_k)[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(cols < len_k)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, tl.trans(k), PRECISION) * scale
        dw = _dot(do, tl.trans(v), PRECISION) * out_scale
        if ACT == "softmax":
            if MASKED:
                s = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), s, float("-inf"))
            ds = tl.exp2(s - lse[:, None]) * (dw - delta[:, None])
        else:
            ds = dw * _act_grad(s, ACT)
            if MASKED:
                ds = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), ds, 0.0)
        dq = _dot_acc(ds.to(k.dtype), k, dq, PRECISION)
    return dq


@triton.jit
def gdpa_bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, QOff, KOff, Sched, n_heads,
                       scale, qk_scale, out_scale, window,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_dot, stride_doh,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                       PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid // n_heads
    h = pid % n_heads
    tile, q_start, len_q, k_start, len_k = _sequence(QOff, KOff, Sched, slot)
    m0 = tile * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < len_q
    q = tl.load(Q + (q_start + rows)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + (q_start + rows)[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
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
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                   stride_vt, stride_vh, rows, t_full_lo, t_full_hi, scale, out_scale, window,
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, False, PRECISION)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                   stride_vt, stride_vh, rows, t_full_hi, t_hi, scale, out_scale, window,
                   HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION)
    # dQ shares Q's (T, H, D) layout.
    tl.store(DQ + (q_start + rows)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
             (dq * qk_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
