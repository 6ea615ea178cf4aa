"""torch.compile as a rung, from outside the model: apply it, plan which regions win, inspect what it made.

    regions.py  regions by name on any model: module names (their forward), "module.method",
                fnmatch patterns per segment ("stack.*"); gemref_regions: GEMRef's kinds as names
    apply.py    compile_model(model, regions): each named region compiled on its own, dim 0
                dynamic (and the loss); CompiledRegion, CompileStats, the inductor backend
    plan.py     plan_regions(model, names, step_fn): each region eager vs compiled on this machine,
                the ones that win; plan_gemref_regions: GEMRef's kinds; call_overhead: a compiled
                call's fixed cost
    inspect.py  the fused kernels and library GEMMs inductor generated for each region

The package exports what a trainer calls (apply.py, regions.py); planning and inspecting measure
what compile made, so they are imported from their modules (`from gemref.compile.plan import
plan_regions`) and `import gemref.train` does not load them.
"""
from .apply import CompiledRegion, CompileStats, compile_model, compile_stats, inductor_backend, loss_function
from .regions import REGION_KINDS, Region, gemref_regions, resolve_regions

__all__ = ["REGION_KINDS", "CompiledRegion", "CompileStats", "compile_model", "compile_stats", "inductor_backend",
           "loss_function", "Region", "gemref_regions", "resolve_regions"]
