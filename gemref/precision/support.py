"""Whether a precision runs here, and how: the gates checked before a run, the failing one in words.

    precision_support(precision, device) -> Support(runs, native, reason)

`runs`: gemref can train in `precision` here at all, natively or emulated. fp32 and bf16 always
run. float8 and MXFP8 need torchao, of a version that pairs with this torch (gemref.env
TORCHAO_MIN_TORCH), with the classes gemref uses from it (torchao 0.18's API); MXFP8 also
needs the torch symbols torchao 0.18 uses to wrap a weight (MXFP8_TORCH_SYMBOLS: its weight
wrapper asserts two DTensor strategy hooks, which torch 2.11 may lack, and its MX tensor imports
two scaled-GEMM enums). The symbols are looked up in torch, never found out by letting torchao
assert or fail on import.

`native`: the GEMMs run on the hardware: float8 on a CUDA GPU of capability SM89+ (Ada, Hopper),
MXFP8 on SM100+ (Blackwell) with CUDA 12.8+, Triton, and torchao's mxfp8 CUDA extension
loaded. Otherwise a recipe that runs is emulated (its numerics, not its speed).

`reason` names the first gate that fails (or what lets it run natively). `native_support`
is the (native, reason) pair apply_precision and the waterfall's low-precision rung decide by.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass

import torch

from ..env import TORCHAO_MIN_TORCH
from .config import HIGH_PRECISIONS, high_precision_reason

# (module, attribute) that torchao 0.18's MXFP8 training needs in torch: the DTensor hooks its
# weight wrapper asserts before swapping a parameter, and the enums its MX tensor imports.
MXFP8_TORCH_SYMBOLS = (("torch.distributed.tensor._ops", "scaled_mm_single_dim_strategy"),
                       ("torch.distributed.tensor._dispatch", "is_pinned_handler"),
                       ("torch.nn.functional", "ScalingType"),
                       ("torch.nn.functional", "SwizzleType"))
# (module, attribute) gemref uses from torchao, per recipe family (torchao_layers.py).
TORCHAO_SYMBOLS = {"float8": (("torchao.float8", "Float8LinearConfig"),
                              ("torchao.float8", "convert_to_float8_training")),
                   "mxfp8": (("torchao.prototype.moe_training.config", "MXFP8TrainingOpConfig"),
                             ("torchao.prototype.mx_formats.config", "ScaleCalculationMode"),
                             ("torchao.quantization", "quantize_"),
                             ("torchao.quantization.quantize_.common", "KernelPreference"))}
FLOAT8_CAPABILITY = (8, 9)      # SM89: Ada; Hopper is SM90
MXFP8_CAPABILITY = (10, 0)      # SM100: Blackwell
MXFP8_CUDA = (12, 8)


@dataclass(frozen=True)
class Support:
    """What `precision_support` found: runs at all, runs natively, and why (in words)."""

    runs: bool
    native: bool
    reason: str


def _family(precision: str) -> str:
    return "mxfp8" if precision == "mxfp8" else "float8"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


def missing_symbols(symbols) -> list[str]:
    """The "module.attribute" names of `symbols` that do not exist here (a module that fails to
    import counts as missing, with its error)."""
    missing = []
    for module, attribute in symbols:
        try:
            found = hasattr(importlib.import_module(module), attribute)
        except Exception as e:   # noqa: BLE001  (a module that cannot import: every symbol in it is missing)
            missing.append(f"{module}.{attribute} ({type(e).__name__}: {e})")
            continue
        if not found:
            missing.append(f"{module}.{attribute}")
    return missing


def software_support(precision: str) -> tuple[bool, str]:
    """(runs, why not): the version and symbol gates of the module doc, independent of the device."""
    if precision in HIGH_PRECISIONS:
        return True, f"{precision} needs nothing beyond torch"
    if importlib.util.find_spec("torchao") is None:
        return False, f"{precision} needs torchao, which is not installed (requirements-gpu.txt pins it)"
    try:
        ao = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        ao = None
    need = TORCHAO_MIN_TORCH.get(".".join(ao.split(".")[:2])) if ao else None
    if need and _version_tuple(torch.__version__) < _version_tuple(need):
        return False, f"torchao {ao} needs torch >= {need}, torch is {torch.__version__}"
    if precision == "mxfp8":
        missing = missing_symbols(MXFP8_TORCH_SYMBOLS)
        if missing:
            return False, (f"torchao {ao}'s MXFP8 training needs symbols torch {torch.__version__} lacks: "
                           f"{', '.join(missing)} (a newer torch has them)")
    from .torchao_layers import import_torchao_quietly   # torchao logs while it loads its extensions
    try:
        import_torchao_quietly()
    except Exception as e:   # noqa: BLE001  (an import that fails is the reason, not a crash)
        return False, f"torchao {ao} does not import here: {type(e).__name__}: {e}"
    missing = missing_symbols(TORCHAO_SYMBOLS[_family(precision)])
    if missing:
        return False, f"torchao {ao} lacks what gemref uses for {precision} (torchao 0.18's API): {', '.join(missing)}"
    return True, f"torchao {ao} with torch {torch.__version__}"


def mxfp8_extension_loaded() -> bool:
    """torchao's mxfp8 CUDA extension is loaded: torchao::mxfp8_quantize has a CUDA kernel."""
    try:
        importlib.import_module("torchao.prototype.mx_formats.kernels")   # defines torchao::mxfp8_quantize
    except Exception:   # noqa: BLE001  (an extension that does not load is "not loaded")
        return False
    return bool(hasattr(torch.ops.torchao, "mxfp8_quantize") and
                torch._C._dispatch_has_kernel_for_dispatch_key("torchao::mxfp8_quantize", "CUDA"))


def _hardware(precision: str, device: torch.device) -> tuple[bool, str]:
    """(native, why): the device gates of the module doc."""
    need = (f"float8 GEMMs (torch._scaled_mm) need an NVIDIA GPU of SM{''.join(map(str, FLOAT8_CAPABILITY))}+ "
            "(Ada/Hopper or newer)" if precision.startswith("float8") else
            "MXFP8 GEMMs need an NVIDIA GPU of SM100+ (Blackwell), CUDA 12.8+, Triton and torchao's mxfp8 CUDA extension")
    if device.type != "cuda" or torch.version.cuda is None or not torch.cuda.is_available():
        return False, f"{need}; this device is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    name = f"{torch.cuda.get_device_name(device)} (SM{major}{minor})"
    if precision.startswith("float8"):
        if (major, minor) >= FLOAT8_CAPABILITY:
            return True, f"{name} has FP8 tensor cores"
        return False, f"{need}; found {name}"
    if (major, minor) < MXFP8_CAPABILITY or _version_tuple(torch.version.cuda) < MXFP8_CUDA:
        return False, f"{need}; found {name}, CUDA {torch.version.cuda}"
    from torch.utils._triton import has_triton
    if not has_triton():
        return False, f"{need}; Triton is missing"
    if not mxfp8_extension_loaded():
        return False, f"{need}; torchao's mxfp8 CUDA extension is not loaded (build it for this Python)"
    return True, f"{name} has MXFP8 tensor cores"


def precision_support(precision: str, device: torch.device | str) -> Support:
    """Whether `precision` runs on `device` here at all and natively, and why (module doc)."""
    device = torch.device(device)
    if precision in HIGH_PRECISIONS:
        return Support(True, True, high_precision_reason(precision, device.type))
    runs, why = software_support(precision)
    if not runs:
        return Support(False, False, why)
    native, why = _hardware(precision, device)
    return Support(True, native, why)


def native_support(precision: str, device: torch.device | str) -> tuple[bool, str]:
    """Whether `device` runs `precision`'s GEMMs natively, and the requirement in words."""
    support = precision_support(precision, device)
    return support.native, support.reason
