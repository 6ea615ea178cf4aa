"""`cpu_fused`: jagged GDPA with a pointwise activation as one fused C++ loop per (sequence, head).

cpu_jagged (attention/cpu_jagged/) already avoids the padded reference's waste, but it still writes
every score to a workspace and reads it back several times (activation, masks, one matmul per
product), and at the small head dims of a ranking model (16-64) a batched matmul runs far
below the CPU's peak. This kernel keeps each score block in registers from Q.K^T through the
activation to its last use, so a score costs arithmetic only:

  * forward: S = Q K^T, A = act(S) masked, O = out_scale A V;
  * backward, recomputing S (only q, k, v and the offsets are saved): dA = dO' V^T,
    dS = dA act'(S), dV += A^T dO', dK += dS^T Q, dQ += dS K', with K' = qk_scale K and
    dO' = out_scale dO folded in once per pair.

The loops and their geometry (query groups of QF or QB, key blocks of LANES, head dim padded
to LANES * {1, 2, 4, 8}) are described in kernel.cpp; `computed_entries` replays that
geometry, and the kernel returns what it computed, so the FLOP formula is checked against
the kernel itself. Executed matmul FLOPs per computed entry: forward 2 products, backward 5,
each 2 * padded head dim.

Scope: CPU, pointwise activations (softmax needs each row's statistics over all its keys:
cpu_jagged or sdpa run it), head dim <= 128. Dtypes: float32 and float64 natively; bfloat16
natively too, computed in float32: the kernel widens each bf16 value as it reads it and rounds
each result once as it writes it, so a bf16 model (autocast) pays no cast passes around the
kernel; float16 is cast to float32 and back. q, k and v may be row-strided views (the unbound
qkv projection): each input's row stride goes to the kernel, so they are not copied.
Threads: the (sequence, head) pairs are split across torch.get_num_threads() Python threads by longest-processing-time (ctypes releases the GIL), no OpenMP runtime of its
own. The kernel is built on first use (build.py); if it cannot be, the kernel is
unavailable with the reason and kernel="auto" takes cpu_jagged.

Like cpu_jagged, forward and backward are torch.library custom ops (attention/jagged_op.py:
gemref::cpu_fused_fwd, gemref::cpu_fused_bwd) with fake implementations and FLOP formulas:
torch.compile traces around one op, FlopCounterMode counts it, AutoAC's save_matmuls saves its output.
The memory tracker sees the torch tensors the op allocates; the C++ workspace (per thread, 2
or 5 x padded head dim x keys of one sequence) is not counted.
"""
from __future__ import annotations

import heapq
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from ...data.jagged import lengths_to_offsets, offsets_to_lengths
from ..api import register_kernel
from ..jagged_op import JaggedGDPAOps
from .build import ENTRY_POINTS, library
from ..cpu_jagged.tiles import compute_dtype
from ..reference import POINTWISE

ACT_IDS = {"silu": 1, "gelu": 2, "gelu_tanh": 3, "relu": 4, "relu2": 5, "leaky_relu": 6, "identity": 7}
QB, QF, LANES, MAX_HEAD_DIM = 4, 8, 16, 128  # kernel.cpp's QB, QF, L and 8 * L
assert set(ACT_IDS) == set(POINTWISE)

_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernel computes with: LANES * the smallest of 1, 2, 4, 8 that fits."""
    for width in (1, 2, 4, 8):
        if head_dim <= LANES * width:
            return LANES * width
    raise ValueError(f"head dim {head_dim} > {MAX_HEAD_DIM}")


def query_groups(head_dim: int) -> tuple[int, int]:
    """Queries per group in the (forward, backward) loops: QF in the forward while the padded
    head dim is at most 2 * LANES (its accumulators fit in registers), else QB."""
    return (QF if padded_head_dim(head_dim) <= 2 * LANES else QB), QB


def computed_entries(q_lengths: Tensor, kv_lengths: Tensor, causal: bool, window: int | None,
                     group: int, lanes: int = LANES, by_keys: bool = False) -> int:
    """Score entries a kernel computes for one head: per group of `group` rows, the `lanes`-wide
    blocks that cover the union of its rows' allowed columns, group * lanes each. Rows are
    queries and columns keys (kernel.cpp; amx.cpp's forward), or with `by_keys` rows are keys
    and columns the queries that may attend them (amx.cpp's backward)."""
    lq, lk = (x.reshape(-1).long().cpu() for x in (q_lengths, kv_lengths))
    n_rows, n_cols = (lk, lq) if by_keys else (lq, lk)
    groups = (n_rows + group - 1) // group
    if int(groups.sum()) == 0:
        return 0
    seq = torch.repeat_interleave(torch.arange(n_rows.numel()), groups)
    start = lengths_to_offsets(groups)[:-1]
    rank = torch.arange(int(groups.sum())) - torch.repeat_interleave(start, groups)
    i = (rank * group)[:, None] + torch.arange(group)    # (groups, group) row indices
    n_r, n_c = n_rows[seq][:, None], n_cols[seq][:, None]
    lo, hi = torch.zeros_like(i), n_c.expand_as(i)
    if by_keys:               # the queries that attend key i (kernel's queries_of)
        if causal:
            lo = i.clone()
        if window is not None:
            hi = torch.minimum(hi, i + window)
            if not causal:
                lo = (i - window + 1).clamp(min=0)
    else:                     # the keys query i attends (keys_of)
        if causal:
            hi = torch.minimum(hi, i + 1)
        if window is not None:
            lo = (i - window + 1).clamp(min=0)
            if not causal:
                hi = torch.minimum(hi, i + window)
    rows = (i < n_r) & (hi > lo)
    lo_g = torch.where(rows, lo, n_c).amin(dim=1)
    hi_g = torch.where(rows, hi, 0).amax(dim=1)
    blocks = torch.where(rows.any(dim=1), (hi_g + lanes - 1) // lanes - lo_g // lanes, 0)
    return int(blocks.sum()) * group * lanes


def _split(q_offsets: Tensor, kv_offsets: Tensor, heads: int, parts: int) -> list[Tensor]:
    """The (sequence, head) pair ids b * heads + h in `parts` lists of about equal work
    (longest first, each to the least loaded list)."""
    if parts == 1:
        return [torch.arange((q_offsets.numel() - 1) * heads)]
    work = (offsets_to_lengths(q_offsets) + 1) * (offsets_to_lengths(kv_offsets) + 1)
    cost = work.repeat_interleave(heads)
    bins: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, b) for b in range(parts)]
    for pair in torch.argsort(cost, descending=True).tolist():
        load, b = heapq.heappop(heap)
        bins[b].append(pair)
        heapq.heappush(heap, (load + int(cost[pair]), b))
    return [torch.tensor(b, dtype=torch.int64) for b in bins if b]


def launch(entry: str, activation: str, grads: tuple | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None,
           q_offsets: Tensor, kv_offsets: Tensor, causal: bool, window: int, qk_scale: float,
           out_scale: float) -> int:
    """Runs the library's `entry` over every pair, split across torch's thread count; entries
    computed. grads: None (forward into out) or (grad_out, dq, dk, dv)."""
    global _pool, _pool_size
    lib = library()
    assert not isinstance(lib, str), lib  # the kernel's unavailable() refused it before dispatch
    fn = getattr(lib, entry)
    go, dq, dk, dv = grads if grads is not None else (None, None, None, None)
    for name, t in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if t.dtype != torch.int64 or t.device.type != "cpu":   # the C++ loops read int64_t on the host
            raise ValueError(f"cpu_fused needs int64 CPU offsets, got {name} {t.dtype} on {t.device.type}")
    q_offsets, kv_offsets = q_offsets.contiguous(), kv_offsets.contiguous()
    H, D = q.shape[1], q.shape[2]
    for t in (go, q, k, v):
        assert t is None or rows_contiguous(t), "inputs need contiguous (H, D) rows (_kernel_input)"
    for t in (out, dq, dk, dv):
        assert t is None or t.is_contiguous()
    ptr = [t.data_ptr() if t is not None else None for t in (go, q, k, v, out, dq, dk, dv, q_offsets, kv_offsets)]
    strides = [t.stride(0) if t is not None else 0 for t in (go, q, k, v)]

    def call(pairs: Tensor) -> int:
        got = fn(ACT_IDS[activation], int(grads is not None), *ptr, pairs.data_ptr(), pairs.numel(), H, D,
                 int(causal), window, qk_scale, out_scale, *strides)
        if got < 0:
            raise AssertionError(f"{entry} refused activation={activation} head_dim={D} (returned {got})")
        return got

    parts = _split(q_offsets, kv_offsets, H, max(1, min(torch.get_num_threads(), (q_offsets.numel() - 1) * H)))
    if len(parts) <= 1:
        return sum(call(p) for p in parts)
    if _pool is None or _pool_size < len(parts):
        _pool, _pool_size = ThreadPoolExecutor(len(parts), thread_name_prefix="gemref-cpu-fused"), len(parts)
    return sum(_pool.map(call, parts))


# ------------------------------------------------------------------ custom ops and autograd
def _dtype_name(x: Tensor) -> str:
    """x's dtype as build.ENTRY_POINTS names it ("float32", "bfloat16", ...)."""
    return str(x.dtype).removeprefix("torch.")


def rows_contiguous(x: Tensor) -> bool:
    """True when each token's (H, D) block is contiguous: the kernel then reads x in place,
    whatever its row stride."""
    return x.dim() == 3 and x.stride(2) == 1 and (x.shape[1] <= 1 or x.stride(1) == x.shape[2])


def _kernel_input(x: Tensor) -> Tensor:
    """x as the kernel reads it: its own dtype where the library has one (float32, float64,
    bfloat16), else float32; copied only when its (H, D) rows are not contiguous."""
    x = x if _dtype_name(x) in ENTRY_POINTS else x.to(compute_dtype(x))
    return x if rows_contiguous(x) else x.contiguous()


def _fwd_body(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, activation: str,
              causal: bool, window: int, qk_scale: float, out_scale: float) -> Tensor:
    """out (Tq, H, D) in q's dtype. window 0: none."""
    q_, k_, v_ = (_kernel_input(x) for x in (q, k, v))
    out = torch.empty(q_.shape, dtype=q_.dtype)
    launch(ENTRY_POINTS[_dtype_name(q_)], activation, None, q_, k_, v_, out, q_offsets, kv_offsets, causal, window,
           qk_scale, out_scale)
    return out.to(q.dtype)


def _bwd_body(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
              activation: str, causal: bool, window: int, qk_scale: float,
              out_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in the inputs' dtypes, contiguous."""
    go, q_, k_, v_ = (_kernel_input(x) for x in (grad_out, q, k, v))
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (q_, k_, v_))
    launch(ENTRY_POINTS[_dtype_name(q_)], activation, (go, dq, dk, dv), q_, k_, v_, None, q_offsets, kv_offsets,
           causal, window, qk_scale, out_scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


OPS = JaggedGDPAOps("cpu_fused", _fwd_body, _bwd_body)


def cpu_fused_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                             causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs the kernel runs: 2 and 5 products of 2 * padded head
    dim FLOPs per computed entry (forward and backward group their queries differently)."""
    per_entry = 2 * padded_head_dim(head_dim) * heads
    fwd, bwd = (computed_entries(q_lengths, kv_lengths, causal, window, g) for g in query_groups(head_dim))
    return 2 * per_entry * fwd, 5 * per_entry * bwd


OPS.count_flops(cpu_fused_executed_flops)


# -------------------------------------------------------------------------- entry points
gdpa_cpu_fused = OPS  # the gdpa entry point (KernelFn)


def fused_unavailable(kernel: str, q: Tensor, activation: str) -> str | None:
    """What the cpu_fused family (this kernel and amx_op's) cannot run: another device, softmax,
    a head dim above MAX_HEAD_DIM, a library that did not build."""
    if q.device.type != "cpu":
        return f"{kernel} is a CPU kernel and q is on {q.device.type}"
    if activation not in ACT_IDS:
        return (f"pointwise activations only, got {activation!r} (softmax rows need statistics over all "
                "their keys: use cpu_jagged or sdpa)")
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} > {MAX_HEAD_DIM}"
    lib = library()
    return lib if isinstance(lib, str) else None


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    return fused_unavailable("cpu_fused", q, activation)


register_kernel("cpu_fused", gdpa_cpu_fused, _unavailable, cpu_fused_executed_flops)
