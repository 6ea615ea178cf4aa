"""torch.compile as a rung, from outside the model: apply it, plan which regions win, inspect what it made.

    apply.py    compile_model: GEMRef's dense regions (and the loss) compiled one region kind at a
                time, dim 0 dynamic; CompiledRegion, CompileStats, the inductor backend
    plan.py     plan_regions: each region kind eager vs compiled on this machine, the ones that win;
                call_overhead: a compiled call's fixed cost
    inspect.py  the fused kernels and library GEMMs inductor generated for each region
"""
from .apply import (REGION_KINDS, CompiledRegion, CompileStats, compile_model, compile_stats, inductor_backend,
                    loss_function)
from .inspect import fused_kernels, generated_kernels
from .plan import PLAN_MARGIN, PLAN_REPS, RegionPlan, call_overhead, eager_vs_compiled, plan_regions, region_inputs, run_region

__all__ = ["REGION_KINDS", "CompiledRegion", "CompileStats", "compile_model", "compile_stats", "inductor_backend",
           "loss_function", "fused_kernels", "generated_kernels", "PLAN_MARGIN", "PLAN_REPS", "RegionPlan",
           "call_overhead", "eager_vs_compiled", "plan_regions", "region_inputs", "run_region"]
