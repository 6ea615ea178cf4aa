"""Launching the Triton GDPA kernels: input guards, tile choice (fixed or autotuned), schedules.

Tiles per pass come from, first match wins: the variant's fixed tiles (fwd=/dkdv=/dq=); the
interpreter's 16 x 16; with autotune=0 the first of TILE_CANDIDATES that fits the head dim and
dtype (resources.py: no register spill, shared memory within sm_90's); else the fastest of the
fitting candidates, timed once per key (head dim, activation, mask, dtype, variant, and the bucket of the mean
query and key lengths: the power of two >= T / B, from shapes alone, no host sync). A
candidate that does not fit the GPU (OutOfResources, ptxas errors) is skipped. The tiles a pass last ran
with are remembered per (variant, head dim, mask, buckets) for the executed-FLOP count.
"""
from __future__ import annotations

import importlib
import os

import torch
from torch import Tensor

from .schedule import cached_schedule
from .resources import candidates, default_tiles
from .variant import INTERPRET_TILES, Tiles, Variant

LOG2E = 1.4426950408889634
_kernels: dict[str, object] = {}
_tuned: dict[tuple, Tiles] = {}
_last_tiles: dict[tuple, Tiles] = {}


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _load_kernels() -> dict[str, object]:
    """Import (and so decorate) the kernels on first use, after TRITON_INTERPRET is read."""
    if not _kernels:
        fwd = importlib.import_module(".fwd", __package__)
        bwd = importlib.import_module(".bwd", __package__)
        _kernels.update(interpreted=_interpret_env(), fwd=fwd.gdpa_fwd_kernel,
                        dkdv=bwd.gdpa_bwd_dkdv_kernel, dq=bwd.gdpa_bwd_dq_kernel)
    return _kernels


def interpreted() -> bool:
    return bool(_kernels.get("interpreted", _interpret_env()))


def length_bucket(rows: int, batch: int) -> int:
    """Power of two >= the mean length rows / batch, within [16, 8192]."""
    mean, bucket = -(-rows // max(batch, 1)), 16
    while bucket < mean and bucket < 8192:
        bucket *= 2
    return bucket


def element_bytes(dtype: torch.dtype) -> int:
    return 4 if dtype == torch.float32 else 2


def planned_tiles(pass_name: str, variant: Variant, device_type: str, head_dim: int, dtype: torch.dtype) -> Tiles | None:
    """Tiles known without timing anything; None: autotune decides."""
    fixed = variant.fixed_tiles(pass_name)
    if fixed is not None:
        return fixed
    if device_type != "cuda" or interpreted():
        return INTERPRET_TILES
    return None if variant.autotune else default_tiles(pass_name, head_dim, element_bytes(dtype))


def _flop_key(pass_name, variant, head_dim, causal, has_window, buckets) -> tuple:
    return (pass_name, variant.spec(), head_dim, causal, has_window, buckets)


def tiles_for_flops(pass_name: str, device_type: str, variant: Variant, head_dim: int, causal: bool,
                    has_window: bool, buckets: tuple[int, int], dtype: torch.dtype = torch.bfloat16) -> Tiles:
    """The tiles a pass runs with: planned, else the last tuned choice for this key, else the default."""
    planned = planned_tiles(pass_name, variant, device_type, head_dim, dtype)
    key = _flop_key(pass_name, variant, head_dim, causal, has_window, buckets)
    return planned or _last_tiles.get(key) or default_tiles(pass_name, head_dim, element_bytes(dtype))


def _tune(pass_name: str, launch, head_dim: int, dtype: torch.dtype) -> Tiles:
    """The fastest fitting candidate; those that still fail to fit or compile are skipped (as
    triton.autotune does)."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError
    from triton.testing import do_bench

    times = {}
    tried = candidates(pass_name, head_dim, element_bytes(dtype))
    for tiles in tried:
        try:
            times[tiles] = do_bench(lambda: launch(tiles), warmup=5, rep=20, return_mode="median")
        except (OutOfResources, CompileTimeAssertionFailure, PTXASError):
            continue
    if not times:
        raise RuntimeError(f"no tile candidate of the {pass_name} pass fits this GPU: {[str(t) for t in tried]}")
    return min(times, key=times.get)


def _run(pass_name: str, variant: Variant, q: Tensor, flags: dict, buckets, launch) -> Tiles:
    """Choose the pass's tiles (tuning on first use of a key) and launch it with them."""
    tiles = planned_tiles(pass_name, variant, q.device.type, q.shape[-1], q.dtype)
    if tiles is None:
        key = (pass_name, variant.spec(), q.dtype, *sorted(flags.items()), buckets)
        if key not in _tuned:
            _tuned[key] = _tune(pass_name, launch, q.shape[-1], q.dtype)
        tiles = _tuned[key]
    _last_tiles[_flop_key(pass_name, variant, q.shape[-1], flags["CAUSAL"], flags["HAS_WINDOW"], buckets)] = tiles
    launch(tiles)
    return tiles


def check_offsets(q: Tensor, q_offsets: Tensor, kv_offsets: Tensor) -> None:
    """ValueError unless both offsets are 1-D int64 on q's device (int32 offsets would make
    the kernels' row arithmetic int32 and overflow past 2^31 elements). No host sync."""
    for name, off in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if off.dtype != torch.int64 or off.dim() != 1:
            raise ValueError(f"Triton GDPA: {name} must be 1-D int64, got {off.dtype} of shape {tuple(off.shape)}")
        if off.device != q.device:
            raise ValueError(f"Triton GDPA: {name} is on {off.device}, the inputs on {q.device}")


def _precision(dtype: torch.dtype) -> str:
    """tl.dot precision: fp32 inputs use TF32 only if torch allows it; "upcast" is for the
    interpreter, whose bf16 dot is broken (see fwd._dot)."""
    if dtype == torch.bfloat16 and interpreted():
        return "upcast"
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _flags(q: Tensor, activation: str, causal: bool, window: int | None, variant: Variant) -> dict:
    silu_tanh = 0
    if variant.silu_tanh and activation == "silu":   # PTX tanh.approx: CUDA, fp16/bf16 only
        fast = q.device.type == "cuda" and not interpreted() and q.dtype != torch.float32
        silu_tanh = 2 if fast else 1
    return dict(HEAD_DIM=q.shape[-1], ACT=activation, CAUSAL=causal, HAS_WINDOW=window is not None,
                PRECISION=_precision(q.dtype), SILU_TANH=silu_tanh, FOLD_SCALE=variant.fold_scale)


def _launch_meta(tiles: Tiles) -> dict:
    return dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
                num_stages=tiles.num_stages)


def _buckets(q: Tensor, k: Tensor, q_offsets: Tensor) -> tuple[int, int]:
    batch = q_offsets.numel() - 1
    return length_bucket(q.shape[0], batch), length_bucket(k.shape[0], batch)


def _strides(*tensors: Tensor) -> list[int]:
    return [s for t in tensors for s in (t.stride(0), t.stride(1))]


def forward(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale,
            variant: Variant) -> tuple[Tensor, Tensor]:
    """(out (T, H, D), lse (T, H) float32 log2-sum-exp for softmax, else empty)."""
    check_offsets(q, q_offsets, kv_offsets)
    kernel = _load_kernels()["fwd"]
    T, H, _ = q.shape
    softmax = activation == "softmax"
    out = q.new_empty(q.shape)
    lse = torch.empty((T, H) if softmax else (0,), device=q.device, dtype=torch.float32)
    flags = _flags(q, activation, causal, window, variant)
    scale = qk_scale * LOG2E if softmax else qk_scale

    def launch(tiles: Tiles) -> None:
        sched = cached_schedule(q_offsets, kv_offsets, "keys", tiles.block_m, tiles.block_n, causal, window,
                                T, H, variant.schedule, variant.cache_schedule)
        kernel[(sched.shape[0],)](q, k, v, out, lse, q_offsets, kv_offsets, sched, H, scale, out_scale,
                                  window or 0, *_strides(q, k, v, out), **flags, **_launch_meta(tiles))

    _run("fwd", variant, q, flags, _buckets(q, k, q_offsets), launch)
    return out, lse


def backward(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window,
             qk_scale, out_scale, variant: Variant) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), each a new contiguous tensor. `out` is only read for softmax (delta)."""
    check_offsets(q, q_offsets, kv_offsets)
    kernels = _load_kernels()
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    T, H, _ = q.shape
    softmax = activation == "softmax"
    delta = (grad_out.float() * out.float()).sum(-1).contiguous() if softmax else lse
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    flags = _flags(q, activation, causal, window, variant)
    scale = qk_scale * LOG2E if softmax else qk_scale
    buckets = _buckets(q, k, q_offsets)
    atomic = variant.bwd == "atomic"
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if atomic else dk

    def sched(kind: str, tiles: Tiles, rows: int) -> Tensor:
        return cached_schedule(q_offsets, kv_offsets, kind, tiles.block_m, tiles.block_n, causal, window,
                               rows, H, variant.schedule, variant.cache_schedule)

    def launch_dkdv(tiles: Tiles) -> None:
        s = sched("queries", tiles, k.shape[0])
        if atomic:
            dq_acc.zero_()
        kernels["dkdv"][(s.shape[0],)](
            q, k, v, grad_out, lse, delta, dk, dv, dq_acc, q_offsets, kv_offsets, s, H, scale, qk_scale,
            out_scale, window or 0, *_strides(q, k, v, grad_out, dk, dv, dq_acc), **flags,
            ATOMIC_DQ=atomic, **_launch_meta(tiles))

    def launch_dq(tiles: Tiles) -> None:
        s = sched("keys", tiles, T)
        kernels["dq"][(s.shape[0],)](
            q, k, v, grad_out, lse, delta, dq, q_offsets, kv_offsets, s, H, scale, qk_scale, out_scale,
            window or 0, *_strides(q, k, v, grad_out, dq), **flags, **_launch_meta(tiles))

    _run("dkdv", variant, q, flags, buckets, launch_dkdv)
    if atomic:   # dq_acc holds dS K, or dS (scale K) when the scale was folded into K
        dq = dq_acc.mul_(qk_scale / scale if variant.fold_scale else qk_scale).to(q.dtype)
    else:
        _run("dq", variant, q, flags, buckets, launch_dq)
    return dq, dk, dv
