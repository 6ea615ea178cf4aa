"""torchao's low-precision Linears as gemref converts to them (gemref/precision/apply.py decides which).

  MXFP8Linear      nn.Linear whose weight torchao's MXFP8TrainingOpConfig wraps (bias, any token
                   count, autocast: what torchao 0.18's wrapper lacks for general models)
  convert_float8   torchao Float8Linear for the chosen module names (tensorwise or rowwise recipe)
  convert_mxfp8    MXFP8Linear for the chosen module names
  import_torchao   torchao, imported only when a float8/MXFP8 precision is requested, quietly
                   (import_torchao_quietly: the same, raising the import's own error)
"""
from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F
from torch import nn

MX_BLOCK = 32           # MXFP8 scaling block (values per E8M0 scale)


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


# What torchao 0.18 logs while it is imported, and why it is silenced there (and only there):
# "torchao": it tries to load its CUDA extensions (_C_mxfp8, _C_cutlass_90a) and warns, with
# their absolute paths, when torch has no CUDA; "torch.utils._pytree": its MX modules register
# Enum classes with pytree.register_constant, which torch 2.13 deprecates. Neither is gemref's
# to fix; gemref says in its own words what runs (PrecisionReport's kernel and reason).
_TORCHAO_IMPORT_NOISE = ("torchao", "torch.utils._pytree")
_TORCHAO_MODULES = ("torchao", "torchao.float8", "torchao.quantization", "torchao.prototype.mx_formats.config",
                    "torchao.prototype.moe_training.config")


def import_torchao_quietly() -> None:
    """Import torchao and the modules gemref uses from it, with the import noise above silenced;
    an import that fails raises its own error."""
    import importlib

    loggers = [logging.getLogger(name) for name in _TORCHAO_IMPORT_NOISE]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        for name in _TORCHAO_MODULES:
            importlib.import_module(name)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def import_torchao(precision: str):
    """import_torchao_quietly, with a missing torchao as a ValueError naming the precision."""
    try:
        import_torchao_quietly()
    except ImportError as e:
        raise ValueError(f"precision={precision!r} needs torchao, which does not import here ({e}; pip install "
                         "--no-deps torchao, see requirements-nodeps.txt)") from None


def convert_float8(model: nn.Module, fqns: set[str], precision: str, kernel: str,
                    fsdp_float8_all_gather: bool) -> None:
    import_torchao(precision)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(precision.removeprefix("float8_"))
    # pad_inner_dim: torch._scaled_mm needs the reduction dim % 16, which for grad_weight
    # is the token count; torchao zero-pads it (native only: emulation has no such limit).
    config = dataclasses.replace(config, emulate=kernel == "emulated", pad_inner_dim=kernel == "native",
                                 enable_fsdp_float8_all_gather=fsdp_float8_all_gather)
    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in fqns, config=config)


def convert_mxfp8(model: nn.Module, fqns: set[str], kernel: str) -> None:
    import_torchao("mxfp8")
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
