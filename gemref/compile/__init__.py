"""torch.compile as a rung, from outside the model: apply it, plan which regions win, inspect what it made.

    regions.py  regions by name on any model: module names (their forward), "module.method",
                fnmatch patterns per segment ("stack.*"); gemref_regions: GEMRef's kinds as names
    apply.py    compile_model(model, regions): each named region compiled on its own, dim 0
                dynamic (and the loss); CompiledRegion, CompileStats, the inductor backend
    plan.py     plan_regions(model, names, step_fn): each region eager vs compiled on this machine,
                the ones that win; plan_gemref_regions: GEMRef's kinds; call_overhead: a compiled
                call's fixed cost
    inspect.py  the fused kernels and library GEMMs inductor generated for each region
"""
from .apply import CompiledRegion, CompileStats, compile_model, compile_stats, inductor_backend, loss_function
from .inspect import fused_kernels, generated_kernels
from .plan import (PLAN_MARGIN, PLAN_REPS, RegionPlan, call_overhead, eager_vs_compiled, plan_gemref_regions,
                   plan_regions, region_inputs, run_region)
from .regions import REGION_KINDS, Region, gemref_regions, resolve_regions

__all__ = ["REGION_KINDS", "CompiledRegion", "CompileStats", "compile_model", "compile_stats", "inductor_backend",
           "loss_function", "fused_kernels", "generated_kernels", "PLAN_MARGIN", "PLAN_REPS", "RegionPlan",
           "call_overhead", "eager_vs_compiled", "plan_gemref_regions", "plan_regions", "region_inputs", "run_region",
           "Region", "gemref_regions", "resolve_regions"]
