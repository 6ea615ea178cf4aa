"""`triton`: the Triton GDPA kernel, forward and backward, for every activation.

One kernel family serves softmax (online softmax, FlashAttention-2 style) and all pointwise
activations (silu, gelu, gelu_tanh, relu, relu2, leaky_relu, identity), causal and
sliding-window masks, jagged self and cross attention via int64 offsets, bf16/fp16/fp32
inputs with float32 accumulation, qk_scale and out_scale, head dims 16, 32, 64, 128. Inputs
may be strided views (only the last dimension must be contiguous, e.g. q, k, v split from one
fused projection); outputs and gradients are new contiguous tensors written with their own
strides. Element offsets are int64 (int64 offsets, heads widened), so T * H * D >= 2^31 is
fine; int32 offsets are a ValueError on every device.

Modules: fwd.py (forward kernel), bwd.py (dK/dV and dQ kernels),
act.py (activations), schedule.py (which program runs which
(sequence, tile, head): load balance on skewed lengths, cached per batch),
launch.py (guards, tiles, autotuning, launches), variant.py (the
kernel variants: fast-tanh SiLU, folded scale, grouped schedule, atomic-dQ backward, tiles,
autotuning; chosen by `variant=`, `use_variant(...)` or GEMREF_GDPA).

Performance design (goal at L = 2048, D = 128, bf16 on H100/H200: >= 450 TFLOP/s forward,
>= 250 backward; predicted from the code ~250-380 / 150-210 before the variants): tiles past
the causal diagonal, outside the window or past the sequence end are never visited, mask
arithmetic only on boundary tiles, exp2 with log2(e) folded into the scale. Known gap: cross
attention with a few queries per sample (e.g. 4 over a 4096-long history) gets one forward
program per (sample, head), each walking every key tile; a split-KV pass (flash-decoding)
would add parallelism there. Not done: TMA descriptors and warp specialisation. A jagged
tile needs a descriptor with its own sequence's bounds (device-side tl.make_tensor_descriptor
per program, which needs triton.set_allocator's global scratch on every call path, including
torch.compile's), and Triton's automatic warp specialisation on Hopper is built for the plain
tutorial loop with on-device descriptors, not three masked/full/masked runs per program. Each
would be one more variant to build and time with a GPU at hand, not blind.
NOT MEASURED here: this sandbox has no GPU; on CPU the kernels run under TRITON_INTERPRET=1
(the Triton interpreter) at tiny shapes; scripts/gpu_check.sh times every variant on a GPU.

Autograd and compile: the forward and backward are torch.library custom ops
(gemref::gdpa_triton_fwd / _bwd, carrying the variant as text) with fake implementations
(torch.compile treats them as opaque) and FlopCounterMode formulas giving their executed FLOPs.
"""
from __future__ import annotations

import importlib.util

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ...data.jagged import lengths_to_offsets, offsets_to_lengths
from ..api import register_kernel
from ..reference import default_qk_scale
from .launch import _interpret_env, _kernels, backward, forward, length_bucket, tiles_for_flops
from .schedule import build_schedule, tile_pairs, tile_range, visited_tiles  # noqa: F401
from .variant import Variant, resolve_variant, use_variant  # noqa: F401

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_parsed: dict[str, Variant] = {}


def _variant(text: str) -> Variant:
    """The op's variant text, parsed once per distinct text (the ops run 18 times a step)."""
    if text not in _parsed:
        _parsed[text] = Variant.parse(text)
    return _parsed[text]


def triton_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                          causal: bool, window: int | None, *,
                          variant: Variant | str | None = None,
                          dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of the tiles the kernels visit, with the tiles the
    variant runs on the lengths' device for inputs of `dtype` (the tiles that fit depend on it):
    forward 2 matmuls per (query tile, key tile), backward 4 in dK/dV + 3 in dQ (bwd=split) or
    5 in one kernel (bwd=atomic)."""
    variant = resolve_variant(variant)
    device_type = q_lengths.device.type
    q_off, kv_off = (lengths_to_offsets(lens.to(torch.int64)).cpu() for lens in (q_lengths, kv_lengths))
    batch = q_lengths.numel()
    buckets = (length_bucket(int(q_off[-1]), batch), length_bucket(int(kv_off[-1]), batch))

    def flops(pass_name: str, kind: str, matmuls: int) -> int:
        t = tiles_for_flops(pass_name, device_type, variant, head_dim, causal, window is not None, buckets, dtype)
        pairs = tile_pairs(q_off, kv_off, kind, t.block_m, t.block_n, causal, window)
        return matmuls * 2 * t.block_m * t.block_n * head_dim * heads * pairs

    if variant.bwd == "atomic":
        return flops("fwd", "keys", 2), flops("dkdv", "queries", 5)
    return flops("fwd", "keys", 2), flops("dkdv", "queries", 4) + flops("dq", "keys", 3)


# ------------------------------------------------------------------ custom ops and autograd
@torch.library.custom_op("gemref::gdpa_triton_fwd", mutates_args=())
def gdpa_triton_fwd(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                    activation: str, causal: bool, window: int, qk_scale: float,
                    out_scale: float, variant: str) -> tuple[Tensor, Tensor]:
    """(out (T, H, D), lse (T, H) float32 log2-sum-exp for softmax, else empty). window 0: none."""
    return forward(q, k, v, q_offsets, kv_offsets, activation, causal, window or None, qk_scale,
                   out_scale, _variant(variant))


@gdpa_triton_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale, variant):
    lse_shape = (q.shape[0], q.shape[1]) if activation == "softmax" else (0,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("gemref::gdpa_triton_bwd", mutates_args=())
def gdpa_triton_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    q_offsets: Tensor, kv_offsets: Tensor, activation: str, causal: bool,
                    window: int, qk_scale: float, out_scale: float,
                    variant: str) -> tuple[Tensor, Tensor, Tensor]:
    return backward(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal,
                    window or None, qk_scale, out_scale, _variant(variant))


@gdpa_triton_bwd.register_fake
def _(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window, qk_scale,
      out_scale, variant):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale, variant = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out if activation == "softmax" else lse, lse, q_offsets, kv_offsets)
    ctx.args = (activation, causal, window, qk_scale, out_scale, variant)


def _backward_op(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    dq, dk, dv = torch.ops.gemref.gdpa_triton_bwd(grad_out, q, k, v, out, lse, q_offsets, kv_offsets,
                                                  *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None


gdpa_triton_fwd.register_autograd(_backward_op, setup_context=_setup_context)


@register_flop_formula(torch.ops.gemref.gdpa_triton_fwd, get_raw=True)
def _fwd_flop(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale, variant,
              *args, out_val=None, **kwargs) -> int:
    return triton_executed_flops(offsets_to_lengths(q_offsets), offsets_to_lengths(kv_offsets), q.shape[1],
                                 q.shape[2], causal, window or None, variant=variant, dtype=q.dtype)[0]


@register_flop_formula(torch.ops.gemref.gdpa_triton_bwd, get_raw=True)
def _bwd_flop(grad_out, q, k, v, out, lse, q_offsets, kv_offsets, activation, causal, window,
              qk_scale, out_scale, variant, *args, out_val=None, **kwargs) -> int:
    return triton_executed_flops(offsets_to_lengths(q_offsets), offsets_to_lengths(kv_offsets), q.shape[1],
                                 q.shape[2], causal, window or None, variant=variant, dtype=q.dtype)[1]


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def gdpa_triton(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                activation: str, causal: bool = False, window: int | None = None,
                qk_scale: float | None = None, out_scale: float = 1.0,
                max_q: int | None = None, max_kv: int | None = None,
                variant: Variant | str | None = None) -> Tensor:
    """Jagged GDPA with the Triton kernels: q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D).
    `variant`: a Variant or its text (variant.py); default: use_variant / GEMREF_GDPA."""
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    out, _ = torch.ops.gemref.gdpa_triton_fwd(
        _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v), q_offsets, kv_offsets,
        activation, causal, window or 0, float(qk_scale), float(out_scale), resolve_variant(variant).spec())
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
