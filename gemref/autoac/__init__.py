"""AutoAC (rung 4, chapter notebooks/05_autoac.ipynb): choose, per block of any model, how to
keep its activations for backward so a step fits a memory budget at the least recompute time,
and apply the choice from outside the model.

Use it on your own model in three calls:

    profile = profile_blocks(model, ["stack.0", "stack.1"], lambda: my_loss(model(batch), batch))
    plan = solve(profile, budget_bytes=profile.base_bytes // 2)        # objective="time"
    apply_plan(model, plan)          # applied_plan(model) reads it back; remove_plan(model) undoes it

(`auto_checkpoint` does the three.) Blocks are module paths (`model.get_submodule`); `step`
runs the forward and returns the loss, the profiler calls backward. GEMRef names its own
blocks (`GEMRef.checkpoint_blocks()`: "layers.{i}.sequence|interaction|cross") and its step
(gemref/train/compose.py build_model).

Options, one per block (units: bytes, FLOPs, seconds of the profiled step):
  * "none": the block keeps everything it saves for backward;
  * "full": torch.utils.checkpoint (non-reentrant) of the whole block: only its inputs stay
    alive, its forward runs again in backward (torchtitan's "full" AC, per block);
  * "save_matmuls": the same checkpoint with a policy (create_selective_checkpoint_contexts):
    the outputs of every op that costs FLOPs (matmuls, attention, anything FlopCounterMode
    prices, any custom kernel) are saved, everything else (norms, activations, masks,
    element-wise) is recomputed. Zero recomputed FLOPs; the recompute is memory-bound work.
    Not called "selective": torchtitan's selective AC ("op" mode) is op-level SAC over the
    whole model with another policy (a save list of attention and every other matmul);
  * "compressed": nothing recomputed; what the block saves is stored as FP8 / MXFP8 and
    expanded in backward (gemref/autoac/compress.py). Approximate: gradients carry the
    E4M3 rounding of the activations (attention's saved q, k, v included).
Plan.summary() writes one letter per block: - none, S save_matmuls, F full, C compressed.

The profiler (profile.py) measures per block and option the activation bytes it frees, the
FLOPs it recomputes (FlopCounterMode) and the seconds its recompute takes (median of a few
steps). The solver (solver.py) picks one option per block: a multiple-choice knapsack,

    minimise  sum cost(block, option)  subject to  base_bytes - sum freed(block, option) <= budget

solved exactly by a dynamic programme over Pareto sets. Cost is the measured recompute time
by default (objective="time"): a FLOP of element-wise recompute is far dearer than a FLOP of
matmul, so minimising FLOPs (objective="flops", kept for comparison) picks plans that are
slower than they look. The FLOPs stay recorded on the plan for HFU. The wrapper (apply.py)
puts each chosen block inside a `CheckpointedBlock` in its parent, as torchtitan's
checkpoint_wrapper does. PyTorch 2's `activation_memory_budget` (gemref's ac mode
"memory_budget", torchtitan's name) decides inside compiled graphs instead; the chapter
compares them. batch_search.py spends freed memory on a larger batch. config.py holds the
switches (ActivationCheckpointConfig: --ac, --ac-budget, --ac-plan, --ac-compress).
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".apply": ("APPROXIMATE_OPTIONS", "LETTERS", "OPTIONS", "CheckpointedBlock", "applied_plan", "apply_plan",
               "plan_record", "remove_plan", "saved_compression"),
    ".config": ("AC_COMPRESSIONS", "AC_MODES", "AC_PLAN_PATTERN", "ActivationCheckpointConfig"),
    ".profile": ("activation_bytes", "auto_checkpoint", "profile_blocks"),
    ".solver": ("ActivationProfile", "BlockProfile", "Plan", "parse_plan", "plan_of", "solve")})
