"""AutoAC (rung 4, chapter notebooks/05_autoac.ipynb): choose, per block of any model, how to
keep its activations for backward so a step fits a memory budget at the least recompute time,
and apply the choice from outside the model. Three calls:

    profile = profile_blocks(model, ["stack.0", "stack.1"], lambda: my_loss(model(batch), batch))
    plan = solve(profile, budget_bytes=profile.base_bytes // 2)        # objective="time"
    apply_plan(model, plan)          # applied_plan(model) reads it back; remove_plan(model) undoes it

(`auto_checkpoint` does the three.) Blocks are module paths (`model.get_submodule`); the step
runs the forward and returns the loss. GEMRef names its own blocks
(`GEMRef.checkpoint_blocks()`: "layers.{i}.sequence|interaction|cross").

Options, one per block:
  * "none": the block keeps everything it saves for backward;
  * "full": torch.utils.checkpoint (non-reentrant) of the whole block: only its inputs stay
    alive, its forward runs again in backward (torchtitan's "full" AC, per block);
  * "save_matmuls": the same checkpoint with a policy (create_selective_checkpoint_contexts):
    the outputs of every op that costs FLOPs (matmuls, attention, any custom kernel) are saved,
    the rest (norms, activations, element-wise) recomputed: zero recomputed FLOPs. Not called
    "selective": torchtitan's selective AC is op-level SAC over the whole model with another
    policy;
  * "compressed": nothing recomputed; what the block saves is stored as FP8 / MXFP8 and
    expanded in backward (gemref/activation_compression.py, a technique of its own, imported
    only when this option is used). Approximate: gradients carry the E4M3 rounding.

Two files: profile.py measures per block and option the bytes freed, the FLOPs and the seconds
recomputed; plan.py solves the multiple-choice knapsack (least recompute time, or FLOPs, whose
bytes fit the budget; exact) and wraps each chosen block in a `CheckpointedBlock`, as
torchtitan's checkpoint_wrapper does. PyTorch 2's `activation_memory_budget` (ac mode
"memory_budget", torchtitan's name) decides inside compiled graphs instead; the chapter compares
them. config.py holds the switches (ActivationCheckpointConfig: --ac, --ac-budget, --ac-plan,
--ac-compress) and a plan's text, the --ac-plan value (`parse_plan`, `Plan.summary()`). The
lab spends freed memory on a larger batch (gemref/measure/batch_search.py).
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".plan": ("APPROXIMATE_OPTIONS", "OPTIONS", "ActivationProfile", "BlockProfile", "CheckpointedBlock",
              "Plan", "applied_plan", "apply_plan", "plan_of", "remove_plan", "saved_compression", "solve"),
    ".config": ("AC_COMPRESSIONS", "AC_MODES", "AC_PLAN_PATTERN", "LETTERS", "ActivationCheckpointConfig",
                "parse_plan", "plan_text"),
    ".profile": ("activation_bytes", "auto_checkpoint", "profile_blocks")})
