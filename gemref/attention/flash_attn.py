"""`flash_attn`: softmax attention through the flash-attn package's varlen kernel (CUDA only).

`flash_attn_varlen_func` takes the jagged (T, H, D) tensors and int32 cumulative offsets
directly: no padding, causal and sliding windows native. It needs the optional `flash-attn`
package, a CUDA device, fp16/bf16 inputs and a head dim that is a multiple of 8 up to 256.

NOT RUN in this repository's CI or sandbox: flash-attn is not installed here and there is
no GPU. What is tested on CPU is everything around the call: `unavailable` gives the reason
(package missing, wrong device, dtype or head dim), and `gdpa(kernel="flash_attn")` turns it
into a ValueError.

Windows: flash-attn aligns the window to the bottom-right corner of each (Lq, Lk) block;
gemref's window is top-left aligned (reference.py). They agree when Lq == Lk (self-
attention). Windowed cross attention with different lengths therefore runs through the
`sdpa` kernel's bucketed path, with a logged reason.
"""
from __future__ import annotations

import importlib.util
import logging

import torch
from torch import Tensor

from ..data.jagged import offsets_to_lengths
from .api import register_kernel
from .reference import default_qk_scale
from .sdpa import gdpa_sdpa, sdpa_executed_flops

log = logging.getLogger(__name__)
_logged_fallback = False


def _flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def gdpa_flash_attn(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                    activation: str, causal: bool = False, window: int | None = None,
                    qk_scale: float | None = None, out_scale: float = 1.0,
                    max_q: int | None = None, max_kv: int | None = None) -> Tensor:
    """Jagged softmax attention with flash_attn_varlen_func: q (Tq, H, D) -> (Tq, H, D)."""
    global _logged_fallback
    assert activation == "softmax", activation
    if qk_scale is None:
        qk_scale = default_qk_scale(q.shape[-1])
    if window is not None and kv_offsets is not q_offsets and not torch.equal(q_offsets, kv_offsets):
        if not _logged_fallback:
            _logged_fallback = True
            log.warning("flash_attn: windowed cross attention with Lq != Lk runs through sdpa "
                        "(flash-attn's window is bottom-right aligned, gemref's top-left)")
        return gdpa_sdpa(q, k, v, q_offsets, kv_offsets, activation=activation, causal=causal,
                         window=window, qk_scale=qk_scale, out_scale=out_scale)
    from flash_attn import flash_attn_varlen_func

    if max_q is None:
        max_q = int(offsets_to_lengths(q_offsets).max())
    if max_kv is None:
        max_kv = int(offsets_to_lengths(kv_offsets).max())
    if window is None:
        window_size = (-1, -1)
    else:
        window_size = (window - 1, 0 if causal else window - 1)
    out = flash_attn_varlen_func(q, k, v, q_offsets.to(torch.int32), kv_offsets.to(torch.int32),
                                 max_q, max_kv, dropout_p=0.0, softmax_scale=qk_scale,
                                 causal=causal, window_size=window_size)
    return out if out_scale == 1.0 else out * out_scale


def flash_attn_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                              causal: bool, window: int | None) -> tuple[int, int]:
    """Real-length rectangles per sequence (the count FlopCounterMode would see for the
    flash op; flash-attn skips causal/window tiles, so this overstates causal work)."""
    if window is not None and q_lengths.tolist() != kv_lengths.tolist():
        return sdpa_executed_flops(q_lengths, kv_lengths, heads, head_dim, causal, window)
    entries = int((q_lengths.to(torch.int64) * kv_lengths.to(torch.int64)).sum())
    per_matmul = 2 * heads * head_dim * entries
    return 2 * per_matmul, 5 * per_matmul


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if activation != "softmax":
        return f"flash-attn computes softmax attention only, not activation={activation!r}"
    if not _flash_attn_installed():
        return "the flash-attn package is not installed (pip install flash-attn on a CUDA host)"
    if q.device.type != "cuda":
        return f"flash-attn runs on CUDA only, q is on {q.device.type}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16/bfloat16, got {q.dtype}"
    head_dim = q.shape[-1]
    if head_dim % 8 or head_dim > 256:
        return f"flash-attn needs a head dim that is a multiple of 8 up to 256, got {head_dim}"
    return None


register_kernel("flash_attn", gdpa_flash_attn, _unavailable, flash_attn_executed_flops)
