"""Low-precision training GEMMs (float8, MXFP8) through torchao, behind one switch.

`apply_precision(model, precision, device=...)` converts the eligible nn.Linear layers of any module
tree in place and returns a `PrecisionReport`: what was converted and to what (`conversions`), what
was skipped and why (`skipped`), `lines()` in words. Eligible, in this order (the first rule failed is the reason):
  1. exactly nn.Linear (a subclass's forward may not call F.linear);
  2. not named by `filter_fqns` (torchtitan's: substrings of module names kept in high precision);
  3. K = in_features and N = out_features multiples of 16 (torch._scaled_mm's need; 32 for
     MXFP8, its scaling block), whatever the filter says;
  4. `module_filter(fqn, linear)` is True (torchtitan's kind of filter). Without one: for native
     float8, `gpu_pays_filter`, torchao's auto filter from its H100 measurements (torchtitan's
     `auto_filter_small_kn`; rowwise: in > 2048, out > 1024, not both in <= 4096 and out <= 2048;
     tensorwise: not both out <= 4096 and in <= 1024), below which the casts cost more than the
     GEMM saves; otherwise, or with a `min_dim` given, `default_module_filter`: K and N >= min_dim
     (MIN_DIM = 64, gemref's threshold for its small models, whose emulated runs are about numerics).

  fp32 / bf16        nothing converted; bf16 runs under `report.autocast()` (CUDA tensor cores;
                     on CPU oneDNN bf16, AMX where present: `gemref bench precision_step`).
  float8_tensorwise  torchao Float8Linear: one scale per tensor; E4M3 input and weight, E5M2 grad_output.
  float8_rowwise     torchao Float8Linear: one power-of-two scale per row, E4M3 everywhere.
  mxfp8              our MXFP8Linear (torchao_layers.py) over torchao's MXFP8TrainingOpConfig: one E8M0
                     scale per 32 values along each GEMM's reduction dim, E4M3, scales rounded up
                     (RCEIL; the format: gemref/precision/mx_reference.py).

Kernels: "native" runs the hardware GEMMs (float8: CUDA SM89+; MXFP8: SM100+, CUDA 12.8+, Triton and
torchao's mxfp8 extension; gemref/precision/support.py checks these gates and the versions before a
run). "emulated" quantises as native does, then runs a high-precision GEMM: the recipe's numerics
at no speed-up, anywhere. "auto": native where the hardware has it, else emulated, reason logged.

Composition (torchtitan's order): apply_precision on the full model (meta is fine), then
activation checkpointing, torch.compile (it fuses the amax/cast passes), FSDP2 `fully_shard`.
`fsdp_float8_all_gather=True` (tensorwise only) all-gathers float8 weights, half of bf16's bytes;
then call `report.after_optimizer_step(model)` after every step (one all-reduce sets the next
weight scales). MXFP8 weights all-gather in FSDP2's param dtype (torchao casts inside the GEMM).

torchao is imported only when a float8/MXFP8 precision is requested.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from ..errors import UsageError
from .config import HIGH_PRECISIONS, PRECISION_KERNELS, PRECISIONS, high_precision_reason


log = logging.getLogger(__name__)

FLOAT8_ALIGN = 16       # torch._scaled_mm needs both weight dims divisible by 16
MIN_DIM = 64            # default: below this a GEMM is too small to repay its casts
_RECIPES = {
    "fp32": "no quantisation",
    "bf16": "bf16 autocast, fp32 master weights",
    "float8_tensorwise": "per-tensor scales; E4M3 input/weight, E5M2 grad_output",
    "float8_rowwise": "per-row power-of-two scales; E4M3 input/weight/grad_output",
    "mxfp8": "per-32-value E8M0 scales (RCEIL) along each GEMM's reduction dim; E4M3",
}


@dataclass
class SkippedLayer:
    fqn: str
    in_features: int
    out_features: int
    reason: str


@dataclass
class ConvertedLayer:
    fqn: str
    in_features: int
    out_features: int
    to: str            # what it became, e.g. "Float8Linear (float8_rowwise, emulated)"


@dataclass
class PrecisionReport:
    """What `apply_precision` did; `as_record()` goes into the run record."""

    precision: str
    kernel: str                      # "native" or "emulated" (fp32/bf16: "native")
    reason: str                      # why that kernel ran
    device: str
    recipe: str
    autocast_dtype: torch.dtype | None
    converted: list[str] = field(default_factory=list)
    skipped: list[SkippedLayer] = field(default_factory=list)
    converted_flops_share: float = 0.0   # converted Linear FLOPs / all Linear FLOPs, per token
    fsdp_float8_all_gather: bool = False
    conversions: list[ConvertedLayer] = field(default_factory=list)   # `converted`, with shapes and type

    def lines(self) -> list[str]:
        """The conversion in words: one line per Linear, converted (to what) or skipped (why)."""
        head = f"{self.precision} ({self.kernel}: {self.reason})"
        return [head] + [f"  converted {c.fqn} ({c.in_features} -> {c.out_features}) to {c.to}"
                         for c in self.conversions] + [f"  skipped {s.fqn} ({s.in_features} -> {s.out_features}): "
                                                      f"{s.reason}" for s in self.skipped]

    @property
    def is_emulated(self) -> bool:
        """True when the GEMMs only emulate the recipe: its numerics, never its speed."""
        return self.kernel == "emulated"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context the forward pass runs under (nullcontext when none)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(self.device).type, dtype=self.autocast_dtype)

    def after_optimizer_step(self, model: nn.Module) -> None:
        """Call after every optimizer step: with FSDP2 float8 all-gather, precompute the
        weight scales of all Float8Linear layers in one all-reduce. A no-op otherwise."""
        if self.fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
            precompute_float8_dynamic_scale_for_fsdp(model)

    def as_record(self) -> dict:
        record = dataclasses.asdict(self)
        record["autocast_dtype"] = str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else None
        return record


def _alignment(precision: str) -> int:
    if precision == "mxfp8":
        from .torchao_layers import MX_BLOCK   # the MX layers: loaded only for MXFP8
        return MX_BLOCK
    return FLOAT8_ALIGN


def gpu_pays_filter(precision: str) -> Callable[[str, nn.Linear], bool]:
    """torchao's auto filter for a native float8 recipe (module doc, rule 4): True where a
    Linear's float8 GEMM repays its casts on an H100. `filter(fqn, linear) -> bool`."""
    if precision not in ("float8_rowwise", "float8_tensorwise"):
        raise ValueError(f"gpu_pays_filter is float8's (rowwise, tensorwise), got {precision!r}")

    def keep(fqn: str, linear: nn.Linear) -> bool:
        k, n = linear.in_features, linear.out_features
        if k % FLOAT8_ALIGN or n % FLOAT8_ALIGN:
            return False
        if precision == "float8_rowwise":
            return k > 2048 and n > 1024 and not (k <= 4096 and n <= 2048)
        return not (n <= 4096 and k <= 1024)
    keep.rule = ("in > 2048, out > 1024, not (in <= 4096 and out <= 2048)" if precision == "float8_rowwise"
                 else "not (out <= 4096 and in <= 1024)")
    return keep


def default_module_filter(precision: str, min_dim: int = MIN_DIM) -> Callable[[str, nn.Linear], bool]:
    """The default filter (module doc, rule 4): K and N both >= `min_dim` and multiples of 16
    (32 for MXFP8). `filter(fqn, linear) -> bool`, True to convert."""
    align = _alignment(precision)

    def keep(fqn: str, linear: nn.Linear) -> bool:
        k, n = linear.in_features, linear.out_features
        return min(k, n) >= min_dim and k % align == 0 and n % align == 0
    keep.min_dim = min_dim
    return keep


def _skip_reason(fqn: str, module: nn.Module, precision: str, module_filter: Callable[[str, nn.Linear], bool],
                 filter_fqns: Sequence[str]) -> str | None:
    """Why `module` stays in high precision (module doc's rules, in order), None to convert it."""
    if type(module) is not nn.Linear and not getattr(type(module), "computes_as_linear", False):
        return f"{type(module).__name__} is a subclass of nn.Linear (its forward may not call F.linear)"
    if any(name in fqn for name in filter_fqns):
        return "named by filter_fqns (kept in high precision)"
    k, n = module.in_features, module.out_features
    align = _alignment(precision)
    if k % align or n % align:
        what = "the MX block size" if precision == "mxfp8" else "torch._scaled_mm's alignment"
        return f"in={k}, out={n} not both divisible by {align} ({what})"
    if module_filter(fqn, module):
        return None
    min_dim = getattr(module_filter, "min_dim", None)
    if min_dim is not None and min(k, n) < min_dim:
        return f"too small: min(in, out) = {min(k, n)} < min_dim={min_dim}"
    if getattr(module_filter, "rule", None):
        return f"too small to repay float8's casts on a GPU (torchao's H100 rule: {module_filter.rule})"
    return "module_filter returned False"


def _choose_kernel(precision: str, device: torch.device, kernel: str) -> tuple[str, str]:
    from .support import precision_support   # the gates: loaded only for a low-precision recipe
    support = precision_support(precision, device)
    ok, why = support.native, support.reason
    if not support.runs:    # neither native nor emulated: torchao or torch lacks what the recipe needs
        raise UsageError(f"{precision} cannot run here: {why}")
    if kernel == "native" and not ok:
        raise UsageError(f"kernel='native' for {precision}: {why}")   # the user's choice, not a bug
    if kernel == "emulated":
        return "emulated", "emulation requested (numerics only, no speed-up)"
    if ok:
        return "native", why
    log.info("%s falls back to emulated GEMMs: %s", precision, why)   # expected off Hopper/Blackwell; recorded
    return "emulated", f"fallback: {why}"


def apply_precision(model: nn.Module, precision: str, *, device: torch.device | str,
                    kernel: str = "auto", module_filter: Callable[[str, nn.Linear], bool] | None = None,
                    min_dim: int | None = None, filter_fqns: Sequence[str] = (),
                    fsdp_float8_all_gather: bool = False) -> PrecisionReport:
    """Convert `model`'s eligible nn.Linear layers in place for `precision` (see module doc).

    device: where the model will run (decides native vs emulated). kernel: auto | native |
    emulated. module_filter(fqn, linear) -> bool: True to convert (default:
    `gpu_pays_filter(precision)` for native float8, else `default_module_filter(precision,
    min_dim)`); min_dim: the latter's threshold (MIN_DIM when None; given, it applies whatever
    the kernel; giving it with a module_filter is an error: it would be ignored).
    filter_fqns: substrings of module names to keep in high precision. Converted layers may get
    new Parameter objects (MXFP8 wraps them): build the optimizer after this call.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if kernel not in PRECISION_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; valid: {', '.join(PRECISION_KERNELS)}")
    if module_filter is not None and min_dim is not None:
        raise ValueError("give module_filter or min_dim, not both: min_dim is the default filter's threshold")
    if module_filter is not None and not callable(module_filter):
        raise ValueError(f"module_filter must be callable (fqn, linear) -> bool, got {type(module_filter).__name__}")
    if isinstance(filter_fqns, str):
        raise ValueError(f"filter_fqns must be a sequence of names, got the string {filter_fqns!r}")
    if min_dim is not None and min_dim < 0:
        raise ValueError(f"min_dim must be >= 0, got {min_dim}")
    if fsdp_float8_all_gather and precision != "float8_tensorwise":
        raise ValueError(f"fsdp_float8_all_gather needs precision='float8_tensorwise', got {precision!r}")
    device = torch.device(device)
    for name, p in model.named_parameters():
        if p.device.type not in (device.type, "meta"):
            raise ValueError(f"parameter {name} is on {p.device}, but device={device}")
    if isinstance(model, nn.Linear):
        raise ValueError("the root module is an nn.Linear, which cannot be swapped in place; "
                         "wrap it, e.g. nn.Sequential(layer)")
    linears = {fqn: m for fqn, m in model.named_modules() if isinstance(m, nn.Linear)}
    if any(type(m) is not nn.Linear for m in linears.values()):   # a converted layer subclasses nn.Linear
        from .torchao_layers import MXFP8Linear   # so gemref's MX layer is loaded only when a subclass is there
        if any(type(m).__module__.startswith("torchao") or isinstance(m, MXFP8Linear) for m in linears.values()):
            raise ValueError("model already has low-precision layers: apply_precision once, to a "
                             "high-precision model")

    if precision in HIGH_PRECISIONS:
        kernel_used, reason = "native", high_precision_reason(precision, device.type)
        autocast = torch.bfloat16 if precision == "bf16" else None
        return PrecisionReport(precision, kernel_used, reason, str(device), _RECIPES[precision], autocast)

    from .torchao_layers import convert_float8, convert_mxfp8   # the low-precision layers: loaded only now
    kernel_used, reason = _choose_kernel(precision, device, kernel)
    if module_filter is None:
        module_filter = (gpu_pays_filter(precision) if kernel_used == "native" and min_dim is None
                         and precision.startswith("float8") else default_module_filter(precision, MIN_DIM if min_dim is None else min_dim))
    skipped, chosen = [], []
    for fqn, m in linears.items():
        why = _skip_reason(fqn, m, precision, module_filter, filter_fqns)
        if why:
            skipped.append(SkippedLayer(fqn, m.in_features, m.out_features, why))
        else:
            chosen.append(fqn)
    for fqn in chosen:          # a converted layer leaves the fp32 fast path: plain Linear again
        if type(linears[fqn]) is not nn.Linear:    # a CPU fast-path Linear (precision/fast_linear.py)
            linears[fqn].__class__ = nn.Linear
    if chosen and precision == "mxfp8":
        convert_mxfp8(model, set(chosen), kernel_used)
    elif chosen:
        convert_float8(model, set(chosen), precision, kernel_used, fsdp_float8_all_gather)
    flops = {fqn: m.in_features * m.out_features for fqn, m in linears.items()}
    share = sum(flops[f] for f in chosen) / sum(flops.values()) if flops else 0.0
    # CUDA: the rest of the model runs in bf16 autocast (as torchtitan does); CPU: emulated
    # numerics are measured against an fp32 baseline, so nothing else changes.
    autocast = torch.bfloat16 if device.type == "cuda" else None
    to = f"{'MXFP8Linear' if precision == 'mxfp8' else 'Float8Linear'} ({precision}, {kernel_used})"
    conversions = [ConvertedLayer(f, linears[f].in_features, linears[f].out_features, to) for f in chosen]
    return PrecisionReport(precision, kernel_used, reason, str(device), _RECIPES[precision], autocast,
                           chosen, skipped, share, fsdp_float8_all_gather, conversions)
