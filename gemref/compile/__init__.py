"""torch.compile as a rung, from outside the model: apply it, plan which regions win, inspect what it made.

    regions.py  regions by name on any model: module names (their forward), "module.method",
                fnmatch patterns per segment ("stack.*"); gemref_regions: GEMRef's kinds as names
    apply.py    compile_model(model, regions): each named region compiled on its own, dim 0
                dynamic (and the loss); CompiledRegion, CompileStats, the inductor backend
    plan.py     plan_regions(model, names, step_fn): each region eager vs compiled on this machine,
                the ones that win; plan_gemref_regions: GEMRef's kinds; call_overhead: a compiled
                call's fixed cost
    inspect.py  the fused kernels and library GEMMs inductor generated for each region
    config.py   the switches (CompileConfig: --compile, --compile-regions, and the region kinds)

Names load on first use (runtime/lazy.py): `import gemref.train` loads apply.py and regions.py,
what a trainer calls; planning and inspecting measure what compile made and load only when used.
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".apply": ("CompiledRegion", "CompileStats", "compile_model", "compile_stats", "inductor_backend", "loss_function"),
    ".config": ("COMPILE_REGIONS", "CompileConfig", "parse_compile_regions"),
    ".inspect": ("fused_kernels", "generated_kernels"),
    ".plan": ("PLAN_MARGIN", "PLAN_REPS", "RegionPlan", "call_overhead", "eager_vs_compiled", "plan_gemref_regions",
              "plan_regions", "region_inputs", "run_region"),
    ".regions": ("REGION_KINDS", "Region", "gemref_regions", "resolve_regions")})
