"""Triton GDPA forward kernel and the helpers its backward shares (see triton_gdpa.py).

FlashAttention-style: one program owns BLOCK_M query rows of one sequence and one head,
keeps them in registers, and streams the keys and values of that sequence in tiles of
BLOCK_N, accumulating out = sum_j act(s_ij) v_j in float32 (online softmax for "softmax").
Tiles outside the mask (past the causal diagonal, outside the window, past the sequence's
end) are never visited; the visited tiles are split into three runs: masked tiles, then
*full* tiles that need no mask at all (the bulk of the work at long lengths), then masked
tiles again; masks and bounds checks are compiled only into the masked runs.

Imported lazily (triton_gdpa.py) so that TRITON_INTERPRET=1 can be set before the kernels
are decorated. Integer divisions only ever see non-negative operands (Triton's integer `//`
truncates toward zero on GPU, the interpreter floors).
"""
import triton
import triton.language as tl


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """a @ b in float32. PRECISION "upcast" emulates a bf16 MMA in float32 (the interpreter's
    bf16 dot is broken; bf16 x bf16 products are exact in float32, so results agree)."""
    if PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _dot_acc(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b (the accumulate form lets the compiler keep acc in the MMA registers)."""
    if PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _act(x, ACT: tl.constexpr):
    if ACT == "silu":
        return x * tl.sigmoid(x)
    elif ACT == "gelu":
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        t = 2.0 * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x)) - 1.0  # tanh(z) = 2 sigmoid(2z) - 1
        return 0.5 * x * (1.0 + t)
    elif ACT == "relu":
        return tl.maximum(x, 0.0)
    elif ACT == "relu2":
        r = tl.maximum(x, 0.0)
        return r * r
    elif ACT == "leaky_relu":
        return tl.where(x > 0, x, 0.01 * x)
    else:  # identity
        return x


@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """d act / dx, matching torch's autograd (relu'(0) = 0, leaky_relu'(0) = 0.01)."""
    if ACT == "silu":
        sig = tl.sigmoid(x)
        return sig * (1.0 + x * (1.0 - sig))
    elif ACT == "gelu":
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
        return cdf + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
    elif ACT == "gelu_tanh":
        t = 2.0 * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x)) - 1.0
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x)
    elif ACT == "relu":
        return tl.where(x > 0, 1.0, 0.0)
    elif ACT == "relu2":
        return 2.0 * tl.maximum(x, 0.0)
    elif ACT == "leaky_relu":
        return tl.where(x > 0, 1.0, 0.01)
    else:
        return tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def _allowed(rows, cols, len_q, len_k, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """(len(rows), len(cols)) bool: query rows[i] may attend key cols[j] (reference.py's mask)."""
    ok = (rows[:, None] < len_q) & (cols[None, :] < len_k)
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None])
    if HAS_WINDOW:
        ok = ok & (rows[:, None] - cols[None, :] < window)
        if not CAUSAL:
            ok = ok & (cols[None, :] - rows[:, None] < window)
    return ok


@triton.jit
def _split(lo, hi, full_lo, full_hi_start, BLOCK: tl.constexpr):
    """Tiles [t_lo, t_hi) covering positions [lo, hi); the full ones are [t_full_lo, t_full_hi)."""
    t_lo = lo // BLOCK
    t_hi = tl.where(hi > lo, (hi + BLOCK - 1) // BLOCK, t_lo)
    t_full_lo = tl.minimum(tl.maximum((full_lo + BLOCK - 1) // BLOCK, t_lo), t_hi)
    t_full_hi = tl.where(full_hi_start >= 0, full_hi_start // BLOCK + 1, 0)
    t_full_hi = tl.minimum(tl.maximum(t_full_hi, t_full_lo), t_hi)
    return t_lo, t_full_lo, t_full_hi, t_hi


@triton.jit
def _key_tiles(m0, len_q, len_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key tiles a query tile [m0, m0+BLOCK_M) visits (mirrored by triton_gdpa.visited_tiles)."""
    lo = m0 * 0
    hi = len_k
    full_lo = m0 * 0
    full_hi_start = len_k - BLOCK_N                    # the tile ends inside the sequence
    if CAUSAL:
        hi = tl.minimum(hi, m0 + BLOCK_M)
        full_hi_start = tl.minimum(full_hi_start, m0 - BLOCK_N + 1)   # below the diagonal
    if HAS_WINDOW:
        lo = tl.maximum(m0 - window + 1, 0)
        full_lo = tl.maximum(m0 + BLOCK_M - window, 0)
        if not CAUSAL:
            hi = tl.minimum(hi, m0 + BLOCK_M + window - 1)
            full_hi_start = tl.minimum(full_hi_start, m0 + window - BLOCK_N)
    hi = tl.where(m0 < len_q, hi, 0)
    return _split(lo, hi, full_lo, full_hi_start, BLOCK_N)


@triton.jit
def _query_tiles(n0, len_q, len_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Query tiles that see a key tile [n0, n0+BLOCK_N) (mirrored by triton_gdpa.visited_tiles)."""
    lo = n0 * 0
    hi = len_q
    full_lo = n0 * 0
    full_hi_start = len_q - BLOCK_M                    # every row of the tile is real
    if CAUSAL:
        lo = n0
        full_lo = n0 + BLOCK_N - 1
    if HAS_WINDOW:
        hi = tl.minimum(hi, n0 + BLOCK_N + window - 1)
        full_hi_start = tl.minimum(full_hi_start, n0 + window - BLOCK_M)
        if not CAUSAL:
            lo = tl.maximum(n0 - window + 1, 0)
            full_lo = tl.maximum(n0 + BLOCK_N - window, 0)
    hi = tl.where(n0 < len_k, hi, 0)
    return _split(lo, hi, full_lo, full_hi_start, BLOCK_M)


@triton.jit
def _sequence(QOff, KOff, Sched, slot):
    """(seq, tile, q_start, len_q, k_start, len_k) of a schedule slot; padding slots get no rows."""
    seq = tl.load(Sched + 2 * slot)
    tile = tl.load(Sched + 2 * slot + 1)
    valid = seq >= 0
    seq = tl.maximum(seq, 0)
    q_start = tl.load(QOff + seq)
    k_start = tl.load(KOff + seq)
    len_q = tl.where(valid, tl.load(QOff + seq + 1) - q_start, 0)
    len_k = tl.where(valid, tl.load(KOff + seq + 1) - k_start, 0)
    return tile, q_start, len_q, k_start, len_k


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
               stride_vt, stride_vh, rows, t_begin, t_end, scale, window,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
               PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        cols = t * BLOCK_N + offs_n
        kt_ptrs = K + (k_start + cols)[None, :] * stride_kt + h * stride_kh + offs_d[:, None]
        v_ptrs = V + (k_start + cols)[:, None] * stride_vt + h * stride_vh + offs_d[None, :]
        if MASKED:
            kt = tl.load(kt_ptrs, mask=(cols < len_k)[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=(cols < len_k)[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, kt, PRECISION) * scale
        if ACT == "softmax":  # s is in log2 units: scale includes log2(e)
            if MASKED:
                s = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        else:
            p = _act(s, ACT)
            if MASKED:
                p = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), p, 0.0)
        acc = _dot_acc(p.to(v.dtype), v, acc, PRECISION)
    return acc, m_i, l_i


@triton.jit
def gdpa_fwd_kernel(Q, K, V, Out, Lse, QOff, KOff, Sched, n_heads, scale, out_scale, window,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh,
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
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)  # finite: fully masked rows stay NaN-free
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_lo, t_full_lo, t_full_hi, t_hi = _key_tiles(m0, len_q, len_k, window, BLOCK_M, BLOCK_N,
                                                  CAUSAL, HAS_WINDOW)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_lo, t_full_lo, scale, window,
                               HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_full_lo, t_full_hi, scale, window,
                               HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, False, PRECISION)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_full_hi, t_hi, scale, window,
                               HEAD_DIM, BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION)
    if ACT == "softmax":
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no allowed key output 0
        acc = acc / l_safe[:, None]
        # log2-sum-exp; +inf for rows with no allowed key, so backward's exp2(s - lse) is 0 there.
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("inf"))
        tl.store(Lse + (q_start + rows) * n_heads + h, lse, mask=row_ok)
    out = acc * out_scale
    tl.store(Out + (q_start + rows)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None])
