"""Triton GDPA forward kernel and the helpers its backward shares (see op.py).

FlashAttention-style: one program owns BLOCK_M query rows of one sequence and one head,
keeps them in registers, and streams the keys and values of that sequence in tiles of
BLOCK_N, accumulating out = sum_j act(s_ij) v_j in float32 (online softmax for "softmax").
Tiles outside the mask (past the causal diagonal, outside the window, past the sequence's
end) are never visited; the visited tiles are split into three runs: masked tiles, then
*full* tiles that need no mask at all (the bulk of the work at long lengths), then masked
tiles again; masks and bounds checks are compiled only into the masked runs.

Each program reads its (sequence, tile, head) from the schedule (schedule.py).
Variant constexprs (variant.py): FOLD_SCALE multiplies the score scale into the
resident Q tile once instead of into every score tile; SILU_TANH picks SiLU's sigmoid
(act.py).

Imported lazily (launch.py) so that TRITON_INTERPRET=1 can be set before the kernels
are decorated. Integer divisions only ever see non-negative operands (Triton's integer `//`
truncates toward zero on GPU, the interpreter floors).
"""
import triton
import triton.language as tl

from .act import _act

# Runtime ints that vary between calls but never change the code: not specialised, so one
# compiled kernel serves every head count and window (and a warm cache serves them all).
NO_SPECIALIZE = ["n_heads", "window"]


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
    """Key tiles a query tile [m0, m0+BLOCK_M) visits (mirrored by schedule.tile_range)."""
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
    """Query tiles that see a key tile [n0, n0+BLOCK_N) (mirrored by schedule.tile_range)."""
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
def _sequence(QOff, KOff, Sched, pid):
    """(tile, head, q_start, len_q, k_start, len_k) of schedule row `pid`; padding rows get no
    rows. q_start/k_start come from int64 offsets and the head is widened to int64, so every
    element offset below is int64: tensors with T * H * D >= 2^31 elements index correctly."""
    seq = tl.load(Sched + 3 * pid)
    tile = tl.load(Sched + 3 * pid + 1)
    head = tl.load(Sched + 3 * pid + 2).to(tl.int64)
    valid = seq >= 0
    seq = tl.maximum(seq, 0)
    q_start = tl.load(QOff + seq)
    k_start = tl.load(KOff + seq)
    len_q = tl.where(valid, tl.load(QOff + seq + 1) - q_start, 0)
    len_k = tl.where(valid, tl.load(KOff + seq + 1) - k_start, 0)
    return tile, head, q_start, len_q, k_start, len_k


@triton.jit
def _offsets(start, rows, stride_t, h, stride_h, offs_d):
    """Element offsets of a (len(rows), len(offs_d)) tile of a (T, H, D) tensor (int64)."""
    return (start + rows)[:, None] * stride_t + h * stride_h + offs_d[None, :]


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
               stride_vt, stride_vh, rows, t_begin, t_end, scale, window,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
               PRECISION: tl.constexpr, SILU_TANH: tl.constexpr, FOLD_SCALE: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for t in range(t_begin, t_end):
        cols = t * BLOCK_N + offs_n
        kt_ptrs = K + (k_start + cols)[None, :] * stride_kt + h * stride_kh + offs_d[:, None]
        v_ptrs = V + _offsets(k_start, cols, stride_vt, h, stride_vh, offs_d)
        if MASKED:
            kt = tl.load(kt_ptrs, mask=(cols < len_k)[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=(cols < len_k)[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, kt, PRECISION)
        if not FOLD_SCALE:
            s = s * scale
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
            p = _act(s, ACT, SILU_TANH)
            if MASKED:
                p = tl.where(_allowed(rows, cols, len_q, len_k, window, CAUSAL, HAS_WINDOW), p, 0.0)
        acc = _dot_acc(p.to(v.dtype), v, acc, PRECISION)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gdpa_fwd_kernel(Q, K, V, Out, Lse, QOff, KOff, Sched, n_heads, scale, out_scale, window,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    PRECISION: tl.constexpr, SILU_TANH: tl.constexpr, FOLD_SCALE: tl.constexpr):
    tile, h, q_start, len_q, k_start, len_k = _sequence(QOff, KOff, Sched, tl.program_id(0))
    m0 = tile * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < len_q
    q = tl.load(Q + _offsets(q_start, rows, stride_qt, h, stride_qh, offs_d), mask=row_ok[:, None], other=0.0)
    if FOLD_SCALE:  # once per program instead of once per score tile (in fp32, then rounded)
        q = (q.to(tl.float32) * scale).to(Q.dtype.element_ty)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)  # finite: fully masked rows stay NaN-free
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_lo, t_full_lo, t_full_hi, t_hi = _key_tiles(m0, len_q, len_k, window, BLOCK_M, BLOCK_N,
                                                  CAUSAL, HAS_WINDOW)
    # Masked tiles, then full tiles (no mask code compiled in), then masked tiles again.
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_lo, t_full_lo, scale, window, HEAD_DIM,
                               BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_full_lo, t_full_hi, scale, window, HEAD_DIM,
                               BLOCK_N, ACT, CAUSAL, HAS_WINDOW, False, PRECISION, SILU_TANH, FOLD_SCALE)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, k_start, len_q, len_k, h, stride_kt, stride_kh,
                               stride_vt, stride_vh, rows, t_full_hi, t_hi, scale, window, HEAD_DIM,
                               BLOCK_N, ACT, CAUSAL, HAS_WINDOW, True, PRECISION, SILU_TANH, FOLD_SCALE)
    if ACT == "softmax":
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no allowed key output 0
        acc = acc / l_safe[:, None]
        # log2-sum-exp; +inf for rows with no allowed key, so backward's exp2(s - lse) is 0 there.
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("inf"))
        tl.store(Lse + (q_start + rows) * n_heads + h, lse, mask=row_ok)
    out = acc * out_scale
    tl.store(Out + _offsets(q_start, rows, stride_ot, h, stride_oh, offs_d), out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])
