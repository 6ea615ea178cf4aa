"""What inductor generates for a region: its fused kernels and the GEMMs it leaves to a library.

`generated_kernels(codes, labels)` reads inductor's output code (one string per graph, e.g.
from torch._inductor.utils.run_and_get_code); `fused_kernels(model, regions, forward)` compiles
each named region afresh, runs it forward and backward, and reports per pass the kernels
(a fused kernel's name lists the ops in its loop) and the matmuls (chapter 04 shows them).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .apply import inductor_backend
from .plan import region_inputs, run_region
from .regions import resolve_regions

_FUSED = r"\b(cpp_fused_\w+|triton_\w+_fused_\w+)\s*=\s*async_compile"
# the GEMMs a graph leaves to a library: inductor's extern BLAS calls, and gemref's FastLinear ops
_MATMULS = r"extern_kernels\.(?:mm|addmm|bmm|baddbmm)\b|torch\.ops\.fastlinear\.\w+"


def generated_kernels(codes: list[str], labels: list[str]) -> list[dict]:
    """Per graph of inductor's output code (e.g. from torch._inductor.utils.run_and_get_code):
    its fused kernels (a name lists the ops fused into one loop) and the GEMMs left to a library."""
    return [{"graph": label, "fused_kernels": re.findall(_FUSED, code), "matmuls": len(re.findall(_MATMULS, code))}
            for label, code in zip(labels, codes)]


def fused_kernels(model: nn.Module, regions: Sequence[str], forward: Callable[[], Any]) -> list[dict]:
    """What inductor generates for each named region (gemref/compile/regions.py) of any model: per
    pass, the fused kernels (a name lists the ops fused into one loop) and the matmuls left to the
    BLAS. `forward()` runs the model once (the regions' inputs, `region_inputs`); every region is
    then compiled afresh (in a temporary inductor cache) and run forward+backward. GEMRef's
    regions of the first layer: `gemref_regions(model, kinds, layers=[0])`."""
    from torch._inductor import utils as inductor_utils

    fresh_cache = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    inputs = region_inputs(model, regions, forward)
    rows = []
    for r in resolve_regions(model, regions):
        fn = torch.compile(getattr(r.owner, r.attr), backend=inductor_backend.__wrapped__(None))   # a new graph
        with fresh_cache():
            _, codes = inductor_utils.run_and_get_code(run_region, fn, inputs[r.name])
        for row in generated_kernels(codes, ["forward", "backward"]):
            rows.append({"region": r.name, "pass": row.pop("graph"), **row})
    return rows
