"""Low-precision training GEMMs (float8, MXFP8) through torchao, behind one switch.

`apply_precision(model, precision, device=...)` converts the eligible nn.Linear layers of
any module tree in place and returns a `PrecisionReport` saying what ran and why:

  fp32               nothing converted; plain fp32 GEMMs.
  bf16               nothing converted; the loop runs under `report.autocast()`
                     (bf16 autocast: tensor cores on CUDA; on CPU oneDNN bf16, AMX tiles
                     where the CPU has them, slower than fp32 where it has not, which is
                     why precision "auto" stays fp32 on CPUs; `gemref bench
                     precision_step` measures the whole step both ways).
  float8_tensorwise  torchao Float8Linear: one scale per tensor; E4M3 input and weight,
                     E5M2 grad_output (wider range for gradients).
  float8_rowwise     torchao Float8Linear: one power-of-two scale per row, E4M3 everywhere.
  mxfp8              our MXFP8Linear (below) over torchao's MXFP8TrainingOpConfig: one
                     E8M0 scale per 32 values along each GEMM's reduction dim, E4M3
                     elements, scales rounded up (RCEIL); see gemref/precision/mx_reference.py for the format.

Kernels: "native" runs the hardware GEMMs (float8 needs CUDA SM89+, Ada/Hopper; MXFP8 needs
SM100+, Blackwell, CUDA 12.8+, Triton and torchao's mxfp8 CUDA extension). "emulated"
quantises exactly as native does, then dequantises and runs a high-precision GEMM: the
numerics of the recipe at no speed benefit, on any device. kernel="auto" picks native where
the hardware has it and otherwise falls back to emulated with a logged reason.

Composition (applied by the training loop, in torchtitan's order): apply_precision first,
on the full model (on the meta device is fine), then activation checkpointing, then
torch.compile (torchao's float8 and MXFP8 paths are compile-friendly; compile is what
fuses their amax/cast passes), then FSDP2 `fully_shard`. With FSDP2,
`fsdp_float8_all_gather=True` (tensorwise only) all-gathers weights already cast to float8,
halving all-gather bytes vs bf16; the loop must then call `report.after_optimizer_step(model)`
after every optimizer step (one all-reduce computes every layer's next weight scale).
MXFP8 weights all-gather in FSDP2's param dtype (torchao casts them inside the GEMM).

torchao is imported only when a float8/MXFP8 precision is requested.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..config import PRECISION_KERNELS, PRECISIONS
from ..errors import UsageError
from .fast_linear import FastLinear

log = logging.getLogger(__name__)

MX_BLOCK = 32           # MXFP8 scaling block (values per E8M0 scale)
FLOAT8_ALIGN = 16       # torch._scaled_mm needs both weight dims divisible by 16
MIN_DIM = 64            # default: below this a GEMM is too small to repay its casts
_RECIPES = {
    "fp32": "no quantisation",
    "bf16": "bf16 autocast, fp32 master weights",
    "float8_tensorwise": "per-tensor scales; E4M3 input/weight, E5M2 grad_output",
    "float8_rowwise": "per-row power-of-two scales; E4M3 input/weight/grad_output",
    "mxfp8": "per-32-value E8M0 scales (RCEIL) along each GEMM's reduction dim; E4M3",
}


class MXFP8Linear(nn.Linear):
    """nn.Linear whose weight torchao wraps (MXFP8TrainingOpConfig) so that the GEMMs of
    forward and backward run in MXFP8.

    Adds what torchao 0.18's weight wrapper lacks for general models: it adds the bias
    (the wrapper's linear override drops it), it takes any token count by zero-padding the
    flattened tokens to a multiple of 32 (the grad_weight GEMM quantises along tokens;
    padded zero rows change no block's amax, so real rows' results are unchanged), and
    under autocast it casts input and weight to the autocast dtype, as FSDP2's bf16 param
    dtype would. State-dict keys equal nn.Linear's. Built by apply_precision, which wraps
    the weight; with a plain weight it would be a plain Linear.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        x_MK = x.reshape(-1, self.in_features)
        tokens = x_MK.shape[0]
        pad = -tokens % MX_BLOCK
        if pad:
            x_MK = F.pad(x_MK, (0, 0, 0, pad))
        y_MN = F.linear(x_MK, weight)[:tokens]
        if self.bias is not None:
            y_MN = y_MN + self.bias.to(y_MN.dtype)
        return y_MN.reshape(*x.shape[:-1], self.out_features)


@dataclass
class SkippedLayer:
    fqn: str
    in_features: int
    out_features: int
    reason: str


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


def native_support(precision: str, device: torch.device | str) -> tuple[bool, str]:
    """Whether `device` runs `precision`'s GEMMs natively, and the requirement in words."""
    device = torch.device(device)
    if precision in ("fp32", "bf16"):
        return True, f"{precision} GEMMs run natively on {device.type}"
    need = ("float8 GEMMs (torch._scaled_mm) need an NVIDIA GPU of SM89+ (Ada/Hopper or newer)"
            if precision.startswith("float8") else
            "MXFP8 GEMMs need an NVIDIA GPU of SM100+ (Blackwell), CUDA 12.8+, Triton and "
            "torchao's mxfp8 CUDA extension")
    if device.type != "cuda" or torch.version.cuda is None or not torch.cuda.is_available():
        return False, f"{need}; this device is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    name = f"{torch.cuda.get_device_name(device)} (SM{major}{minor})"
    if precision.startswith("float8"):
        if (major, minor) >= (8, 9):
            return True, f"{name} has FP8 tensor cores"
        return False, f"{need}; found {name}"
    cuda_ok = tuple(int(v) for v in torch.version.cuda.split(".")[:2]) >= (12, 8)
    if major < 10 or not cuda_ok:
        return False, f"{need}; found {name}, CUDA {torch.version.cuda}"
    from torch.utils._triton import has_triton
    if not has_triton():
        return False, f"{need}; Triton is missing"
    _import_torchao(precision)
    import torchao.prototype.mx_formats.kernels  # noqa: F401  (defines torchao::mxfp8_quantize)
    if not (hasattr(torch.ops.torchao, "mxfp8_quantize") and
            torch._C._dispatch_has_kernel_for_dispatch_key("torchao::mxfp8_quantize", "CUDA")):
        return False, f"{need}; torchao's mxfp8 CUDA extension is not loaded (build it for this Python)"
    return True, f"{name} has MXFP8 tensor cores"


def _skip_reason(fqn: str, module: nn.Module, precision: str, min_dim: int,
                 exclude: tuple[str, ...]) -> str | None:
    if type(module) not in (nn.Linear, FastLinear):
        return f"{type(module).__name__} is a subclass of nn.Linear (its forward may not call F.linear)"
    if any(name in fqn for name in exclude):
        return "excluded by name (kept in high precision)"
    k, n = module.in_features, module.out_features
    if min(k, n) < min_dim:
        return f"too small: min(in, out) = {min(k, n)} < min_dim={min_dim}"
    align = MX_BLOCK if precision == "mxfp8" else FLOAT8_ALIGN
    if k % align or n % align:
        what = "the MX block size" if precision == "mxfp8" else "torch._scaled_mm's alignment"
        return f"in={k}, out={n} not both divisible by {align} ({what})"
    return None


def _choose_kernel(precision: str, device: torch.device, kernel: str) -> tuple[str, str]:
    ok, why = native_support(precision, device)
    if kernel == "native" and not ok:
        raise UsageError(f"kernel='native' for {precision}: {why}")   # the user's choice, not a bug
    if kernel == "emulated":
        return "emulated", "emulation requested (numerics only, no speed-up)"
    if ok:
        return "native", why
    log.info("%s falls back to emulated GEMMs: %s", precision, why)   # expected off Hopper/Blackwell; recorded
    return "emulated", f"fallback: {why}"


def apply_precision(model: nn.Module, precision: str, *, device: torch.device | str,
                    kernel: str = "auto", min_dim: int = MIN_DIM, exclude: tuple[str, ...] = (),
                    fsdp_float8_all_gather: bool = False) -> PrecisionReport:
    """Convert `model`'s eligible nn.Linear layers in place for `precision` (see module doc).

    device: where the model will run (decides native vs emulated). kernel: auto | native |
    emulated. min_dim: layers with min(in, out) below it stay in high precision. exclude:
    substrings of module names to keep in high precision (e.g. a numerically sensitive head).
    Converted layers may get new Parameter objects (MXFP8 wraps them): build the optimizer
    after this call.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if kernel not in PRECISION_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; valid: {', '.join(PRECISION_KERNELS)}")
    if min_dim < 0:
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
    if any(type(m).__module__.startswith("torchao") or isinstance(m, MXFP8Linear) for m in linears.values()):
        raise ValueError("model already has low-precision layers: apply_precision once, to a "
                         "high-precision model")

    if precision in ("fp32", "bf16"):
        kernel_used, reason = "native", native_support(precision, device)[1]
        autocast = torch.bfloat16 if precision == "bf16" else None
        return PrecisionReport(precision, kernel_used, reason, str(device), _RECIPES[precision], autocast)

    kernel_used, reason = _choose_kernel(precision, device, kernel)
    skipped, chosen = [], []
    for fqn, m in linears.items():
        why = _skip_reason(fqn, m, precision, min_dim, exclude)
        if why:
            skipped.append(SkippedLayer(fqn, m.in_features, m.out_features, why))
        else:
            chosen.append(fqn)
    for fqn in chosen:          # a converted layer leaves the fp32 fast path: plain Linear again
        if type(linears[fqn]) is FastLinear:
            linears[fqn].__class__ = nn.Linear
    if chosen and precision == "mxfp8":
        _convert_mxfp8(model, set(chosen), kernel_used)
    elif chosen:
        _convert_float8(model, set(chosen), precision, kernel_used, fsdp_float8_all_gather)
    flops = {fqn: m.in_features * m.out_features for fqn, m in linears.items()}
    share = sum(flops[f] for f in chosen) / sum(flops.values()) if flops else 0.0
    # CUDA: the rest of the model runs in bf16 autocast (as torchtitan does); CPU: emulated
    # numerics are measured against an fp32 baseline, so nothing else changes.
    autocast = torch.bfloat16 if device.type == "cuda" else None
    return PrecisionReport(precision, kernel_used, reason, str(device), _RECIPES[precision], autocast,
                           chosen, skipped, share, fsdp_float8_all_gather)


# What torchao 0.18 logs while it is imported, and why it is silenced there (and only there):
# "torchao": it tries to load its CUDA extensions (_C_mxfp8, _C_cutlass_90a) and warns, with
# their absolute paths, when torch has no CUDA; "torch.utils._pytree": its MX modules register
# Enum classes with pytree.register_constant, which torch 2.13 deprecates. Neither is gemref's
# to fix; gemref says in its own words what runs (PrecisionReport's kernel and reason).
_TORCHAO_IMPORT_NOISE = ("torchao", "torch.utils._pytree")
_TORCHAO_MODULES = ("torchao", "torchao.float8", "torchao.quantization", "torchao.prototype.mx_formats.config",
                    "torchao.prototype.moe_training.config")


def _import_torchao(precision: str):
    """Import torchao and the modules gemref uses from it, with the import noise above silenced."""
    import importlib

    loggers = [logging.getLogger(name) for name in _TORCHAO_IMPORT_NOISE]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        for name in _TORCHAO_MODULES:
            importlib.import_module(name)
    except ImportError:
        raise ValueError(f"precision={precision!r} needs torchao (pip install --no-deps "
                         "torchao, see requirements-nodeps.txt)") from None
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _convert_float8(model: nn.Module, fqns: set[str], precision: str, kernel: str,
                    fsdp_float8_all_gather: bool) -> None:
    _import_torchao(precision)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(precision.removeprefix("float8_"))
    # pad_inner_dim: torch._scaled_mm needs the reduction dim % 16, which for grad_weight
    # is the token count; torchao zero-pads it (native only: emulation has no such limit).
    config = dataclasses.replace(config, emulate=kernel == "emulated", pad_inner_dim=kernel == "native",
                                 enable_fsdp_float8_all_gather=fsdp_float8_all_gather)
    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in fqns, config=config)


def _convert_mxfp8(model: nn.Module, fqns: set[str], kernel: str) -> None:
    _import_torchao("mxfp8")
    import torchao
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common import KernelPreference
    preference = KernelPreference.AUTO if kernel == "native" else KernelPreference.EMULATED
    config = MXFP8TrainingOpConfig(kernel_preference=preference,
                                   scale_calculation_mode=ScaleCalculationMode.RCEIL)
    try:  # torchao asserts on torch builds it cannot train MXFP8 with: ask before swapping
        quantize_(nn.Sequential(nn.Linear(MX_BLOCK, MX_BLOCK, device="meta")), config)
    except AssertionError as e:
        raise ValueError(f"torchao {torchao.__version__} cannot train MXFP8 with torch "
                         f"{torch.__version__}: {e}") from None
    for fqn in fqns:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        with torch.device("meta"):  # no allocation: the new module takes the old parameters
            new = MXFP8Linear(old.in_features, old.out_features, bias=old.bias is not None)
        new.weight, new.bias = old.weight, old.bias
        setattr(parent, child, new)
    quantize_(model, config, filter_fn=lambda m, fqn: fqn in fqns and isinstance(m, MXFP8Linear))
