"""`gdpa()`: the one attention entry point, validating inputs and dispatching to a kernel.

A kernel is registered with `register_kernel(name, fn, unavailable, executed_flops,
auto_skip=None)`, where `unavailable(q, activation, causal, window) -> str | None` returns the
reason it cannot run those inputs here (None when it can), `auto_skip` (same arguments) the
reason `kernel="auto"` passes it over although it can run (measured slower there; asking for
it by name still runs it), and `executed_flops(q_lengths, kv_lengths, heads,
head_dim, causal, window) -> (forward, backward)` gives the matmul FLOPs the kernel really
runs (padding, masked tiles and recomputation included; gemref/mfu/flops.py uses it for
`flops --verify`, and FlopCounterMode must see the same numbers). Asking for a kernel that cannot run is a ValueError
carrying that reason; `kernel="auto"` picks the first kernel of `AUTO_ORDER` that can, and
logs its choice once per (device, dtype, activation).

Inside `flops.counting_attention()` (opened by a meter, gemref/mfu/foreign.py) every call notes
its model FLOPs on the real lengths, and runs its kernel in a region whose FlopCounterMode count
is noted too, so the meter can set the kernel's executed work aside (`flops.counted_call`).
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from ..data.jagged import check_offsets, check_offsets_layout, offsets_to_lengths
from ..errors import UsageError
from .flops import counted_call, counting
from .reference import ACTIVATIONS, gdpa_reference

log = logging.getLogger(__name__)


class KernelFn(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                 activation: str, causal: bool, window: int | None, qk_scale: float | None,
                 out_scale: float, max_q: int | None, max_kv: int | None) -> Tensor: ...


ExecutedFlops = Callable[[Tensor, Tensor, int, int, bool, "int | None"], "tuple[int, int]"]


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: KernelFn
    unavailable: Callable[[Tensor, str, bool, int | None], str | None]
    executed_flops: ExecutedFlops
    auto_skip: Callable[[Tensor, str, bool, int | None], str | None] | None = None

    def auto_choice(self, q: Tensor, activation: str, causal: bool, window: int | None) -> bool:
        """Whether kernel="auto" may take this kernel for these inputs."""
        return self.unavailable(q, activation, causal, window) is None and (
            self.auto_skip is None or self.auto_skip(q, activation, causal, window) is None)


KERNELS: dict[str, Kernel] = {}
# Preference order for kernel="auto": fastest first; "reference" always works.
AUTO_ORDER: list[str] = ["flash_attn", "sdpa", "cpu_fused_amx", "cpu_fused", "cpu_jagged", "triton", "reference"]
# The modules that register the other kernels when imported (each calls register_kernel), and
# the order KERNELS lists gemref's kernels in, whichever module was imported first.
KERNEL_MODULES = ("cpu_fused", "cpu_jagged", "flash_attn", "sdpa", "triton")
KERNEL_ORDER = ("reference", "cpu_jagged", "cpu_fused", "cpu_fused_amx", "sdpa", "flash_attn", "triton")
_kernels_loaded = False
_auto_logged: set[tuple] = set()


def load_kernels() -> dict[str, Kernel]:
    """KERNELS with every kernel registered: imports each of KERNEL_MODULES once (gemref/attention/
    loads its names on first use, so nothing else guarantees they ran)."""
    global _kernels_loaded
    if not _kernels_loaded:
        _kernels_loaded = True     # first: a kernel module reading gemref.attention while it loads must not restart
        try:
            for name in KERNEL_MODULES:
                importlib.import_module(f"{__package__}.{name}")
        except BaseException:
            _kernels_loaded = False
            raise
    return KERNELS


def register_kernel(name: str, fn: KernelFn,
                    unavailable: Callable[[Tensor, str, bool, int | None], str | None],
                    executed_flops: ExecutedFlops,
                    auto_skip: Callable[[Tensor, str, bool, int | None], str | None] | None = None) -> None:
    KERNELS[name] = Kernel(name, fn, unavailable, executed_flops, auto_skip)
    rank = {name: i for i, name in enumerate(KERNEL_ORDER)}
    for known in sorted(KERNELS, key=lambda n: rank.get(n, len(rank))):   # a caller's own kernels last
        KERNELS[known] = KERNELS.pop(known)


def padded_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                          causal: bool, window: int | None) -> tuple[int, int]:
    """Materialised attention pads every sequence to the longest: B * Lq_max * Lk_max score
    entries, two matmuls (QK^T, PV) forward and four (dQ, dK, dP, dV) backward."""
    B = q_lengths.numel()
    entries = B * int(q_lengths.max()) * int(kv_lengths.max()) if B else 0
    forward = 2 * 2 * heads * head_dim * entries
    return forward, 2 * forward


register_kernel("reference", gdpa_reference, lambda q, act, causal, window: None,
                padded_executed_flops)


def kernel_names() -> tuple[str, ...]:
    return ("auto",) + tuple(load_kernels())


def resolve_kernel(kernel: str, q: Tensor, activation: str, causal: bool, window: int | None) -> str:
    """The kernel that will run: `kernel` itself if it can, the auto choice for "auto"."""
    if not _kernels_loaded:
        load_kernels()
    if kernel == "auto":
        for name in AUTO_ORDER:
            if KERNELS[name].auto_choice(q, activation, causal, window):
                key = (q.device.type, q.dtype, activation, causal, window is not None)
                if key not in _auto_logged:
                    _auto_logged.add(key)
                    log.info("gdpa kernel=auto chose %r for %s/%s activation=%s", name,
                             q.device.type, q.dtype, activation)
                return name
        raise AssertionError("the reference kernel always runs")
    if kernel not in KERNELS:
        raise UsageError(f"unknown gdpa kernel {kernel!r}; valid: {', '.join(kernel_names())}")
    reason = KERNELS[kernel].unavailable(q, activation, causal, window)
    if reason is not None:     # the caller's (user's) choice of kernel, not a bug: UsageError
        raise UsageError(f"gdpa kernel {kernel!r} cannot run here: {reason}")
    return kernel


def resolve_model_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype, heads: int, head_dim: int,
                         activation: str, window: int | None) -> str:
    """The one kernel a model runs for both of its attention calls (causal self-attention with
    `window`, and cross attention): `kernel` if it runs both, for "auto" the first of
    AUTO_ORDER that runs both. Resolved once, when the model is built (gemref/train/compose.py); the
    model then passes the concrete name to every gdpa call."""
    load_kernels()
    probe = torch.empty(0, heads, head_dim, device=device, dtype=dtype)
    cases = ((True, window), (False, None))
    if kernel != "auto":
        for causal, w in cases:
            resolve_kernel(kernel, probe, activation, causal, w)   # UsageError with the reason
        return kernel
    for name in AUTO_ORDER:
        if all(KERNELS[name].auto_choice(probe, activation, causal, w) for causal, w in cases):
            log.info("kernel=auto chose %r for %s/%s activation=%s", name, probe.device.type, dtype, activation)
            return name
    raise AssertionError("the reference kernel always runs")


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def gdpa(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, kv_offsets: Tensor | None = None,
         activation: str = "silu", causal: bool = False, window: int | None = None,
         qk_scale: float | None = None, out_scale: float = 1.0, kernel: str = "auto",
         max_len: int | None = None, kv_max_len: int | None = None) -> Tensor:
    """Jagged Generalized Dot-Product Attention (math: gemref/attention/reference.py).

    q: (Tq, H, D); k, v: (Tk, H, D); offsets: (B+1,) int64 query offsets; kv_offsets: key
    offsets (defaults to `offsets`: self-attention). Cross attention passes both, e.g. a few
    non-sequence queries per sample over that sample's history. `max_len` / `kv_max_len`
    are optional host-side hints of the longest sequence (saves a device sync).
    Returns (Tq, H, D) in q's dtype.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating-point torch.Tensor, got {got}")
    if k.dtype != q.dtype or v.dtype != q.dtype or k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must share dtype and device; got {q.dtype}/{q.device}, "
                         f"{k.dtype}/{k.device}, {v.dtype}/{v.device}")
    check_offsets_layout(offsets, "offsets")
    if kv_offsets is None:
        kv_offsets = offsets
    check_offsets_layout(kv_offsets, "kv_offsets")
    for name, t in (("offsets", offsets), ("kv_offsets", kv_offsets)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be (T, H, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q and k must share (H, D); got {tuple(q.shape[1:])} vs {tuple(k.shape[1:])}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1 (keys per query), got {window!r}")
    for name, value, optional in (("qk_scale", qk_scale, True), ("out_scale", out_scale, False)):
        if not (optional and value is None) and not _finite_number(value):
            raise ValueError(f"{name} must be a finite number{' or None' if optional else ''}, got {value!r}")
    for name, value in (("max_len", max_len), ("kv_max_len", kv_max_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be None or an int >= 0 (a hint of the longest sequence), got {value!r}")
    if offsets.numel() != kv_offsets.numel():
        raise ValueError(f"offsets and kv_offsets must have the same batch size; got "
                         f"{offsets.numel() - 1} and {kv_offsets.numel() - 1}")
    if offsets.numel() < 2:
        raise ValueError("offsets describe an empty batch (B = 0)")
    if q.device.type != "cuda":  # value checks need a host sync: free on CPU, skipped on CUDA
        check_offsets(offsets, q.shape[0], "offsets")
        check_offsets(kv_offsets, k.shape[0], "kv_offsets")
        for name, hint, t in (("max_len", max_len, offsets), ("kv_max_len", kv_max_len, kv_offsets)):
            longest = int(offsets_to_lengths(t).max()) if hint is not None else 0
            if hint is not None and hint < longest:    # a kernel sizing its tiles by it would drop keys
                raise ValueError(f"{name}={hint} is shorter than the longest sequence ({longest})")
    if causal and kv_offsets is not offsets and not torch.equal(offsets, kv_offsets):
        raise ValueError("causal attention needs the same query and key offsets (self-attention)")
    name = resolve_kernel(kernel, q, activation, causal, window)

    def run() -> Tensor:
        return KERNELS[name].fn(q, k, v, offsets, kv_offsets, activation=activation, causal=causal,
                                window=window, qk_scale=qk_scale, out_scale=out_scale,
                                max_q=max_len, max_kv=kv_max_len if kv_max_len is not None else
                                (max_len if kv_offsets is offsets else None))
    if not torch.compiler.is_compiling() and counting():   # a meter's tally is open (flops.py)
        return counted_call(run, q, offsets, kv_offsets, causal, window)
    return run()
