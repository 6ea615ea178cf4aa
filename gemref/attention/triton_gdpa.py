"""`triton`: the Triton GDPA kernel, forward and backward, for every activation.

One kernel family serves softmax (online softmax, FlashAttention-2 style) and all pointwise
activations (silu, gelu, gelu_tanh, relu, relu2, leaky_relu, identity), causal and
sliding-window masks, jagged self and cross attention via offsets, bf16/fp16/fp32 inputs
with float32 accumulation, qk_scale and out_scale, head dims 16, 32, 64, 128. The kernels
are in triton_gdpa_fwd.py (forward) and triton_gdpa_bwd.py (dK/dV and dQ).

Load balance on skewed lengths. A grid of (max_len / BLOCK_M, B) programs would launch
mostly empty programs and leave the longest sequences' tiles scattered. Instead the wrapper
builds, on the device and without a host sync, a *schedule*: one slot per (sequence, tile)
pair that exists (grid bound: ceil(T / BLOCK) + B slots, padding slots exit at once), each
with its cost (the number of tiles it will visit: causal tiles near the end of a long
sequence cost the most), sorted costliest first. Programs are launched in that order (one
per slot and head, heads of one tile adjacent), so the GPU starts the longest work first
and fills the tail with short tiles: longest-processing-time-first scheduling.

Performance design (target ~300 TFLOP/s forward on H100, bf16, L = 2048, D = 128): tiles
of 128 x 64 (forward, dQ) and 32 x 128 (dK/dV), tiles past the causal diagonal, outside
the window or past the sequence end are never visited, mask arithmetic only on boundary
tiles, exp2 with log2(e) folded into the scale, num_warps/num_stages autotuned on CUDA.
The tile shapes are fixed per pass (not autotuned) so that the schedule and the executed
FLOP count are known before launch. Known gap: cross attention with a few queries per
sample (e.g. 4 over a 4096-long history) gets one forward program per (sample, head), each
walking every key tile; a split-KV pass (flash-decoding) would add parallelism there. NOT MEASURED here: this sandbox has no GPU; on CPU the
kernels are verified under TRITON_INTERPRET=1 (the Triton interpreter) at tiny shapes, with
16 x 16 tiles.

Autograd and compile: the forward and backward are torch.library custom ops
(gemref::gdpa_triton_fwd / _bwd) with fake implementations (torch.compile treats them as
opaque) and FlopCounterMode formulas giving their executed FLOPs.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .api import register_kernel
from .reference import default_qk_scale

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (BLOCK_M query rows, BLOCK_N keys) per pass on CUDA; the interpreter uses 16 x 16.
CUDA_TILES = {"fwd": (128, 64), "dkdv": (32, 128), "dq": (128, 32)}
INTERPRET_TILES = {"fwd": (16, 16), "dkdv": (16, 16), "dq": (16, 16)}
LOG2E = 1.4426950408889634
_kernels: dict[str, object] = {}


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _load_kernels() -> dict[str, object]:
    """Import (and so decorate) the kernels on first use; autotune them when compiled."""
    if _kernels:
        return _kernels
    import triton

    fwd: ModuleType = importlib.import_module(".triton_gdpa_fwd", __package__)
    bwd: ModuleType = importlib.import_module(".triton_gdpa_bwd", __package__)
    interpreted = _interpret_env()
    _kernels["interpreted"] = interpreted
    key = ["HEAD_DIM", "ACT", "CAUSAL", "HAS_WINDOW"]
    configs = [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3, 4)]
    for name, fn in (("fwd", fwd.gdpa_fwd_kernel), ("dkdv", bwd.gdpa_bwd_dkdv_kernel),
                     ("dq", bwd.gdpa_bwd_dq_kernel)):
        _kernels[name] = fn if interpreted else triton.autotune(configs, key=key)(fn)
    return _kernels


def tile_shape(pass_name: str, device_type: str) -> tuple[int, int]:
    return (CUDA_TILES if device_type == "cuda" and not _kernels.get("interpreted", _interpret_env())
            else INTERPRET_TILES)[pass_name]


# ----------------------------------------------------------------- schedule and FLOP counting
def tile_range(kind: str, start: Tensor, len_q: Tensor, len_k: Tensor, block_m: int,
               block_n: int, causal: bool, window: int | None) -> tuple[Tensor, Tensor]:
    """Inner tiles [t_lo, t_hi) each outer tile visits; mirrors _key_tiles / _query_tiles.

    kind "keys": outer query tiles starting at `start` visit key tiles of block_n;
    kind "queries": outer key tiles starting at `start` are visited by query tiles of block_m.
    """
    zero = torch.zeros_like(start)
    if kind == "keys":
        lo, hi, block = zero, len_k.clone(), block_n
        if causal:
            hi = torch.minimum(hi, start + block_m)
        if window is not None:
            lo = torch.clamp(start - window + 1, min=0)
            if not causal:
                hi = torch.minimum(hi, start + block_m + window - 1)
        hi = torch.where(start < len_q, hi, zero)
    else:
        lo, hi, block = zero, len_q.clone(), block_m
        if causal:
            lo = start.clone()
        if window is not None:
            hi = torch.minimum(hi, start + block_n + window - 1)
            if not causal:
                lo = torch.clamp(start - window + 1, min=0)
        hi = torch.where(start < len_k, hi, zero)
    t_lo = lo // block
    return t_lo, torch.where(hi > lo, (hi + block - 1) // block, t_lo)


def visited_tiles(kind: str, start: Tensor, len_q: Tensor, len_k: Tensor, block_m: int,
                  block_n: int, causal: bool, window: int | None) -> Tensor:
    t_lo, t_hi = tile_range(kind, start, len_q, len_k, block_m, block_n, causal, window)
    return t_hi - t_lo


def _tiles(offsets: Tensor, block: int, total_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every (sequence, tile) of the jagged rows, padded to ceil(T/block) + B slots."""
    lengths = offsets[1:] - offsets[:-1]
    B = lengths.numel()
    tiles = (lengths + block - 1) // block
    cum = torch.cumsum(tiles, 0)
    slot = torch.arange((total_rows + block - 1) // block + B, device=offsets.device)
    seq = torch.searchsorted(cum, slot, right=True).clamp_(max=B - 1)
    tile = slot - (cum[seq] - tiles[seq])
    valid = slot < cum[-1]
    return seq, tile, valid


def build_schedule(offsets: Tensor, q_offsets: Tensor, kv_offsets: Tensor, kind: str, block_m: int,
                   block_n: int, causal: bool, window: int | None, total_rows: int) -> Tensor:
    """(slots, 2) int32 rows (sequence, tile), costliest first; padding rows have sequence -1."""
    outer_block = block_m if kind == "keys" else block_n
    seq, tile, valid = _tiles(offsets, outer_block, total_rows)
    len_q = (q_offsets[1:] - q_offsets[:-1])[seq]
    len_k = (kv_offsets[1:] - kv_offsets[:-1])[seq]
    cost = visited_tiles(kind, tile * outer_block, len_q, len_k, block_m, block_n, causal, window)
    cost = torch.where(valid, cost, -1)
    order = torch.sort(cost, descending=True, stable=True).indices
    sched = torch.stack([torch.where(valid, seq, -1), tile], dim=1)[order]
    return sched.to(torch.int32).contiguous()


def triton_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                          causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of the tiles the kernels visit (tile shapes of the
    lengths' device): forward 2 matmuls per (query tile, key tile), backward 4 in dK/dV + 3 in dQ."""
    device_type = q_lengths.device.type
    q_off = torch.cat([q_lengths.new_zeros(1), torch.cumsum(q_lengths.to(torch.int64), 0)]).cpu()
    kv_off = torch.cat([kv_lengths.new_zeros(1), torch.cumsum(kv_lengths.to(torch.int64), 0)]).cpu()

    def pairs(pass_name: str, kind: str) -> tuple[int, int, int]:
        bm, bn = tile_shape(pass_name, device_type)
        offsets = q_off if kind == "keys" else kv_off
        seq, tile, valid = _tiles(offsets, bm if kind == "keys" else bn, int(offsets[-1]))
        start = tile * (bm if kind == "keys" else bn)
        n = visited_tiles(kind, start, (q_off[1:] - q_off[:-1])[seq], (kv_off[1:] - kv_off[:-1])[seq],
                          bm, bn, causal, window)
        return int(n[valid].sum()), bm, bn

    def flops(pass_name: str, kind: str, matmuls: int) -> int:
        count, bm, bn = pairs(pass_name, kind)
        return matmuls * 2 * bm * bn * head_dim * heads * count

    return flops("fwd", "keys", 2), flops("dkdv", "queries", 4) + flops("dq", "keys", 3)


# -------------------------------------------------------------------------------- launches
def _precision(dtype: torch.dtype) -> str:
    """tl.dot precision: fp32 inputs use TF32 only if torch allows it; "upcast" is for the
    interpreter, whose bf16 dot is broken (see triton_gdpa_fwd._dot)."""
    if dtype == torch.bfloat16 and _kernels.get("interpreted"):
        return "upcast"
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _meta(q: Tensor, activation: str, causal: bool, window: int | None, pass_name: str) -> dict:
    bm, bn = tile_shape(pass_name, q.device.type)
    return dict(HEAD_DIM=q.shape[-1], BLOCK_M=bm, BLOCK_N=bn, ACT=activation, CAUSAL=causal,
                HAS_WINDOW=window is not None, PRECISION=_precision(q.dtype))


def _forward(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale):
    kernels = _load_kernels()
    T, H, _ = q.shape
    softmax = activation == "softmax"
    out = torch.empty_like(q)
    lse = torch.empty((T, H) if softmax else (0,), device=q.device, dtype=torch.float32)
    meta = _meta(q, activation, causal, window, "fwd")
    sched = build_schedule(q_offsets, q_offsets, kv_offsets, "keys", meta["BLOCK_M"], meta["BLOCK_N"],
                           causal, window, T)
    scale = qk_scale * LOG2E if softmax else qk_scale
    kernels["fwd"][(sched.shape[0] * H,)](
        q, k, v, out, lse, q_offsets, kv_offsets, sched, H, scale, out_scale, window or 0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), **meta)
    return out, lse


def _backward(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window,
              qk_scale, out_scale):
    kernels = _load_kernels()
    T, H, _ = q.shape
    softmax = activation == "softmax"
    delta = (grad_out.float() * out.float()).sum(-1).contiguous() if softmax else lse
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = qk_scale * LOG2E if softmax else qk_scale
    for pass_name, kind, offsets, rows in (("dkdv", "queries", kv_offsets, k.shape[0]),
                                           ("dq", "keys", q_offsets, T)):
        meta = _meta(q, activation, causal, window, pass_name)
        sched = build_schedule(offsets, q_offsets, kv_offsets, kind, meta["BLOCK_M"], meta["BLOCK_N"],
                               causal, window, rows)
        outputs = (dk, dv) if pass_name == "dkdv" else (dq,)
        kernels[pass_name][(sched.shape[0] * H,)](
            q, k, v, grad_out, lse, delta, *outputs, q_offsets, kv_offsets, sched, H,
            scale, qk_scale, out_scale, window or 0,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            grad_out.stride(0), grad_out.stride(1), **meta)
    return dq, dk, dv


# ------------------------------------------------------------------ custom ops and autograd
@torch.library.custom_op("gemref::gdpa_triton_fwd", mutates_args=())
def gdpa_triton_fwd(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                    activation: str, causal: bool, window: int, qk_scale: float,
                    out_scale: float) -> tuple[Tensor, Tensor]:
    """(out (T, H, D), lse (T, H) float32 log2-sum-exp for softmax, else empty). window 0: none."""
    return _forward(q, k, v, q_offsets, kv_offsets, activation, causal, window or None, qk_scale, out_scale)


@gdpa_triton_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale):
    lse_shape = (q.shape[0], q.shape[1]) if activation == "softmax" else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("gemref::gdpa_triton_bwd", mutates_args=())
def gdpa_triton_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    q_offsets: Tensor, kv_offsets: Tensor, activation: str, causal: bool,
                    window: int, qk_scale: float, out_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    return _backward(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal,
                     window or None, qk_scale, out_scale)


@gdpa_triton_bwd.register_fake
def _(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out if activation == "softmax" else lse, lse, q_offsets, kv_offsets)
    ctx.args = (activation, causal, window, qk_scale, out_scale)


def _backward_op(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    dq, dk, dv = torch.ops.gemref.gdpa_triton_bwd(grad_out.contiguous(), q, k, v, out, lse,
                                                  q_offsets, kv_offsets, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


gdpa_triton_fwd.register_autograd(_backward_op, setup_context=_setup_context)


def _lengths(offsets: Tensor) -> Tensor:
    return offsets[1:] - offsets[:-1]


@register_flop_formula(torch.ops.gemref.gdpa_triton_fwd, get_raw=True)
def _fwd_flop(q, k, v, q_offsets, kv_offsets, activation, causal, window, *args, out_val=None, **kwargs) -> int:
    return triton_executed_flops(_lengths(q_offsets), _lengths(kv_offsets), q.shape[1], q.shape[2],
                                 causal, window or None)[0]


@register_flop_formula(torch.ops.gemref.gdpa_triton_bwd, get_raw=True)
def _bwd_flop(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window,
              *args, out_val=None, **kwargs) -> int:
    return triton_executed_flops(_lengths(q_offsets), _lengths(kv_offsets), q.shape[1], q.shape[2],
                                 causal, window or None)[1]


def gdpa_triton(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                activation: str, causal: bool = False, window: int | None = None,
                qk_scale: float | None = None, out_scale: float = 1.0,
                max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged GDPA with the Triton kernels: q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D)."""
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    out, _ = torch.ops.gemref.gdpa_triton_fwd(q.contiguous(), k.contiguous(), v.contiguous(),
                                              q_offsets, kv_offsets, activation, causal,
                                              window or 0, float(qk_scale), float(out_scale))
    return out


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if q.device.type == "cpu":
        if not _interpret_env():
            return ("Triton kernels run on CUDA; on CPU only in the Triton interpreter "
                    "(set TRITON_INTERPRET=1 before the first Triton call; slow, for tests)")
        if _kernels and not _kernels["interpreted"]:
            return "the Triton kernels were already compiled for CUDA before TRITON_INTERPRET=1 was set"
    elif q.device.type != "cuda":
        return f"Triton GDPA runs on CUDA (or the CPU interpreter), not {q.device.type}"
    if q.dtype not in DTYPES:
        return f"Triton GDPA takes float16, bfloat16 or float32 inputs, got {q.dtype}"
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        return (f"head dim {head_dim} is not supported: Triton GDPA needs a power of two in "
                f"16..128 (one register tile per row; tl.dot needs >= 16)")
    if window is not None and window >= 2 ** 30:
        return f"window={window} does not fit the kernel's int32 arithmetic"
    return None


register_kernel("triton", gdpa_triton, _unavailable, triton_executed_flops)
