"""Compressed saved activations: what a block keeps for backward is stored as FP8 (E4M3) and
expanded again when backward reads it.

`SavedCompression` is a pair of torch.autograd.graph.saved_tensors_hooks: `pack` runs when
an op saves a tensor for backward, `unpack` when backward needs it. Formats (`FORMATS`):
  fp8_tensor  E4M3 values, one float32 scale per tensor (amax / 448): 1 byte per value
  fp8_block   E4M3 values, one float32 scale per `block` values in memory order: 1 + 4/block
  mxfp8       OCP MXFP8 from the project's reference (gemref/precision/mx_reference.py): E4M3
              values, one E8M0 power-of-two scale per `block` (32) values, "rceil" scale
              rule (never saturates): 1 + 1/block bytes per value
Against float32 that is ~4x fewer bytes, against bf16 ~2x.

Where: AutoAC's "compressed" option (gemref/autoac/plan.py CheckpointedBlock) runs the whole
block under the hooks, attention's saved q, k, v (and, for softmax, its output O) included.
That is fine for pointwise attention; softmax attention's backward recomputes
P = softmax(q k^T) and subtracts rowsum(dO * O): an E4M3 error in q or k moves every score by
~2^-4 |q||k|, and in O it lands in a difference of nearly equal terms (measured: the last
cross block's q projection gradient at ~0 dB SQNR). `compressing(model)` puts the hooks around
a whole model's forward and refuses a softmax GEMRef; `wrap_compressed(fn, compression,
module)` makes every call of any fn (with grad) run under them.

Which saved tensors are compressed: floating point, at least `min_bytes` bytes, a last dim
of at least `min_last_dim`, not a parameter of the wrapped module nor a view of one (the
weight.t() a Linear saves: it stays alive anyway, a copy would only add bytes), and finite.
A dense tensor (possibly permuted, as a transposed view is) comes back with its strides; a
view with gaps (q of a fused qkv projection) comes back contiguous, which backward formulas
accept (they read values, not strides). Everything else is kept as it is: integer and bool
tensors (offsets, indices, masks), small tensors, per-row statistics with a narrow last dim
(LayerNorm's mean and rstd, an attention log-sum-exp: an error there is amplified by exp).
Inside a compiled region the hooks see what AOTAutograd saves (detached intermediates) and
apply the same rules. A tensor saved twice while alive (the same storage, offset, shape and
strides) is compressed once.

Error (what tests/test_compress.py checks): E4M3 has 3 mantissa bits, so rounding to nearest
leaves a relative error of at most u = 2^-4 on every value in the normal range, and an
absolute error of at most 2^-10 * scale below it (subnormal spacing 2^-9). For values spread
over a binade the mean squared relative error is at most (ulp^2 / 12) / x^2 <= 4^-3 / 12,
hence an SQNR of at least 10 log10(768) = 28.9 dB for any data that neither saturates nor
falls below the normal range (N(0, 1) with a per-tensor scale: about 31 dB).
"""
from __future__ import annotations

import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn
from torch.multiprocessing.reductions import StorageWeakRef

from .precision.mx_reference import from_mx, to_mx

FORMATS = ("fp8_tensor", "fp8_block", "mxfp8")
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY = torch.finfo(torch.float32).tiny    # a scale never underflows to 0 (amax below 448 * TINY)


@dataclass(frozen=True)
class CompressionSpec:
    """How saved activations are stored (module docstring)."""

    format: str = "mxfp8"
    block: int = 32              # values per scale (fp8_block, mxfp8)
    min_bytes: int = 4096        # smaller saved tensors stay as they are
    min_last_dim: int = 16       # narrower last dims (per-row statistics) stay as they are

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r}; valid: {', '.join(FORMATS)}")
        for name, low in (("block", 1), ("min_bytes", 0), ("min_last_dim", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def bytes_per_value(self) -> float:
        return {"fp8_tensor": 1.0, "fp8_block": 1.0 + 4.0 / self.block, "mxfp8": 1.0 + 1.0 / self.block}[self.format]


@dataclass
class Packed:
    """A compressed saved tensor: E4M3 values in memory order, their scales, and the layout."""

    values: Tensor           # float8_e4m3fn, flat (padded to a multiple of the block)
    scale: Tensor            # float32 (fp8_*) or float8_e8m0fnu (mxfp8)
    shape: torch.Size        # the tensor in memory order (permuted to be contiguous)
    inverse: tuple[int, ...]  # permutation back to the saved tensor's dim order
    dtype: torch.dtype
    format: str
    block: int

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.scale.numel() * self.scale.element_size()


def _memory_order(t: Tensor) -> tuple[int, ...]:
    """Dims sorted by stride (outermost first) if that makes t contiguous, else t's own order."""
    perm = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d])))
    return perm if t.permute(perm).is_contiguous() else tuple(range(t.dim()))


def quantize(flat: Tensor, spec: CompressionSpec) -> tuple[Tensor, Tensor]:
    """1-D float tensor -> (E4M3 values padded to a multiple of the block, scales)."""
    x = flat.float()
    if spec.format == "fp8_tensor":
        amax = x.abs().max() if x.numel() else x.new_zeros(())
        scale = torch.where(amax > 0, (amax / E4M3_MAX).clamp_min(TINY), torch.ones_like(amax))
        return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale.reshape(1)
    blocks = torch.nn.functional.pad(x, (0, -x.numel() % spec.block)).view(-1, spec.block)
    if spec.format == "mxfp8":
        scale, values = to_mx(blocks, spec.block, E4M3, "rceil")
        return values.reshape(-1), scale
    amax = blocks.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, (amax / E4M3_MAX).clamp_min(TINY), torch.ones_like(amax))
    return (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(-1), scale.reshape(-1)


def dequantize(values: Tensor, scale: Tensor, numel: int, spec_format: str, block: int,
               dtype: torch.dtype) -> Tensor:
    """Inverse of `quantize`: the first `numel` values, in `dtype`."""
    if spec_format == "fp8_tensor":
        out = values.float() * scale
    elif spec_format == "mxfp8":
        out = from_mx(scale, values.view(-1, block), block).reshape(-1)
    else:
        out = (values.float().view(-1, block) * scale[:, None]).reshape(-1)
    return out[:numel].to(dtype)


def compress(t: Tensor, spec: CompressionSpec) -> Packed:
    """The Packed form of t (values in memory order when t is dense, else in t's dim order)."""
    perm = _memory_order(t)
    dense = t.permute(perm)
    values, scale = quantize(dense.reshape(-1), spec)
    inverse = tuple(sorted(range(t.dim()), key=lambda d: perm[d]))
    return Packed(values, scale, dense.shape, inverse, t.dtype, spec.format, spec.block)


def decompress(p: Packed) -> Tensor:
    """The saved tensor again: same shape and dtype, values rounded to E4M3; same strides if
    it was dense, else contiguous."""
    flat = dequantize(p.values, p.scale, p.shape.numel(), p.format, p.block, p.dtype)
    return flat.view(p.shape).permute(p.inverse)


class SavedCompression:
    """saved_tensors_hooks that compress what qualifies (module docstring), with counters.

    `stats`: tensors and bytes seen, compressed (original and stored bytes), and kept
    (by reason: "not_float", "small", "narrow", "parameter", "non_finite").
    """

    def __init__(self, spec: CompressionSpec | None = None):
        self.spec = spec or CompressionSpec()
        self.stats: Counter = Counter()
        # (storage, offset, shape, strides, dtype) -> (the storage, weakly; the Packed, weakly:
        # autograd's saved slot owns it, so backward frees it as it would the tensor)
        self._alive: dict[tuple, tuple[StorageWeakRef, weakref.ref]] = {}
        self._parameters: set[int] = set()     # storages of the wrapped module's parameters

    def reason_to_keep(self, t: Tensor) -> str | None:
        if not t.is_floating_point():
            return "not_float"
        if t.numel() * t.element_size() < self.spec.min_bytes:
            return "small"
        if t.dim() == 0 or t.shape[-1] < self.spec.min_last_dim:
            return "narrow"
        if isinstance(t, nn.Parameter) or t.untyped_storage().data_ptr() in self._parameters:
            return "parameter"
        return None

    # The hooks are never traced, so they run eagerly even when entered inside a compiled
    # region: inductor's CPU backend has no float8_e8m0fnu (the MX scale dtype), and counting
    # bytes and keying storages is host-side bookkeeping, not graph code.
    @torch.compiler.disable
    def pack(self, t: Tensor):
        nbytes = t.numel() * t.element_size()
        self.stats["tensors"] += 1
        self.stats["bytes"] += nbytes
        reason = self.reason_to_keep(t)
        if reason is None:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            known = self._alive.get(key)
            packed = known[1]() if known is not None and not known[0].expired() else None
            if packed is not None:
                self.stats["deduplicated"] += 1
                return packed
            if not bool(torch.isfinite(t).all()):
                reason = "non_finite"
            else:
                packed = compress(t.detach(), self.spec)
                self._prune()
                self._alive[key] = (StorageWeakRef(t.untyped_storage()), weakref.ref(packed))
                self.stats["compressed"] += 1
                self.stats["compressed_bytes"] += nbytes
                self.stats["stored_bytes"] += packed.nbytes
                return packed
        self.stats[f"kept_{reason}"] += 1
        self.stats["kept_bytes"] += nbytes
        return t

    @staticmethod
    @torch.compiler.disable
    def unpack(obj):
        return decompress(obj) if isinstance(obj, Packed) else obj

    def _prune(self) -> None:
        if len(self._alive) > 64:
            self._alive = {k: v for k, v in self._alive.items() if not v[0].expired() and v[1]() is not None}

    @contextmanager
    def hooks(self, module: nn.Module | None = None) -> Iterator["SavedCompression"]:
        """`with compression.hooks(module): forward`; `module`'s parameters are never compressed."""
        outer = self._parameters
        self._parameters = outer | {p.untyped_storage().data_ptr() for p in module.parameters()} \
            if module is not None else outer
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield self
        finally:
            self._parameters = outer


def wrap_compressed(fn, compression: SavedCompression, module: nn.Module):
    """fn, but every call with grad enabled runs under `compression.hooks(module)`."""
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with compression.hooks(module):
            return fn(*args, **kwargs)

    # torch.compile(wrapper) (gemref/compile/apply.py compiles a block's regions after AC is applied)
    # must compile fn but run the hooks eagerly around it: skip this frame only.
    run = torch.compiler.disable(run, recursive=False)
    run.gemref_compressed = fn
    return run


@contextmanager
def compressing(model: nn.Module, spec: CompressionSpec | None = None) -> Iterator[SavedCompression]:
    """While active, every forward of `model` (with grad) compresses what it saves for backward.

    Everything the forward saves qualifies, attention's q, k, v included: fine for pointwise
    (silu) attention, refused for softmax (module docstring). Installed as an instance
    `forward`, so a checkpoint plan applied inside (gemref/autoac/plan.py) still works: a
    checkpointed block's own hooks are innermost and win, so its saved tensors are dropped and
    recomputed, not compressed. Yields the hooks (counters).
    """
    if "forward" in model.__dict__:
        raise ValueError("model.forward is already wrapped (compressing twice?)")
    if getattr(getattr(model, "cfg", None), "activation", None) == "softmax":
        raise ValueError("compressing a whole softmax-attention model puts attention's saved q, k, v and O in "
                         "E4M3, which softmax's backward amplifies; compress its blocks' dense regions instead "
                         "(apply_plan with 'compressed', pointwise attention only)")
    compression = SavedCompression(spec)
    model.forward = wrap_compressed(model.forward, compression, model)
    try:
        yield compression
    finally:
        del model.forward
