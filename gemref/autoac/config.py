"""The activation-checkpointing section (rung 4): none, full, AutoAC or PyTorch 2's budget, and
saved activations stored compressed; a solved plan as the ac_plan switch's text and back
(`plan_text`, `parse_plan`: gemref/autoac/plan.py solves it).

Mode "memory_budget" is torchtitan's name for torch._functorch.config.activation_memory_budget
(it was "pt2" before; records that say "pt2" still load, gemref/train/record.py RENAMED)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..config.section import Section, switch
from ..errors import UsageError

AC_MODES = ("none", "full", "auto", "memory_budget")
# Saved activations stored compressed (gemref/activation_compression.py FORMATS; a test keeps them equal):
# with ac "none" every block's dense regions, with ac "auto" one more option AutoAC weighs per block.
AC_COMPRESSIONS = ("none", "fp8_tensor", "fp8_block", "mxfp8")
# The ac_plan switch's text (Plan.summary(), parse_plan): one letter per block and option,
LETTERS = {"none": "-", "save_matmuls": "S", "full": "F", "compressed": "C"}
# and for GEMRef's blocks (GEMRef.checkpoint_blocks(), grouped by kind) this pattern.
AC_PLAN_PATTERN = r"sequence:[-SFC]+ interaction:[-SFC]+ cross:[-SFC]+"


@dataclass(frozen=True)
class ActivationCheckpointConfig(Section):
    mode: str = switch("none", "ac", "rung 4: activation checkpointing (auto = AutoAC; memory_budget = "
                       "torch's activation_memory_budget, needs --compile)", AC_MODES)
    budget: float = switch(1.0, "ac_budget", "auto/memory_budget: activation memory budget, a fraction in (0, 1] of the "
                           "no-checkpoint bytes")
    compress: str = switch("none", "ac_compress", "rung 4: store saved activations as FP8/MX (with --ac none: every "
                           "block; with --ac auto: one more option per block)", AC_COMPRESSIONS)
    plan: str = switch("", "ac_plan", "with --ac auto: apply this solved plan instead of solving at setup (the "
                       "record's ac_plan.summary, e.g. 'sequence:SF interaction:-- cross:F-')")

    def check(self) -> None:
        if not 0.0 < self.budget <= 1.0:
            raise UsageError(f"ac_budget must be in (0, 1] (a fraction of the no-AC activation bytes), "
                             f"got {self.budget}")
        if self.compress != "none" and self.mode not in ("none", "auto"):
            raise UsageError(f"ac_compress={self.compress!r} needs ac 'none' (every block compressed) or 'auto' "
                             f"(compression one more option per block), not ac={self.mode!r}: "
                             + ("a fully checkpointed block keeps only its inputs, which the recompute needs exact"
                                if self.mode == "full" else "PyTorch 2's memory_budget decides inside compiled graphs"))
        if self.budget != 1.0 and self.mode not in ("auto", "memory_budget"):
            raise UsageError(f"ac_budget={self.budget} is read only by ac 'auto' and 'memory_budget', "
                             f"not ac={self.mode!r}")
        if self.plan and self.mode != "auto":
            raise UsageError(f"ac_plan is AutoAC's solved plan: it needs ac 'auto', not ac={self.mode!r}")
        if self.plan and not re.fullmatch(AC_PLAN_PATTERN, self.plan):
            raise UsageError(f"ac_plan={self.plan!r} must look like 'sequence:SF interaction:-- cross:F-' "
                             "(per block kind, one letter per layer: - none, S save_matmuls, F full, C compressed)")
        if "C" in self.plan and self.compress == "none":
            raise UsageError("ac_plan compresses blocks (C): set ac_compress to the format (e.g. mxfp8)")


def groups(blocks) -> dict[str, list[str]]:
    """Block names grouped by their last non-numeric part ("layers.3.cross" -> "cross"; a name
    with none, e.g. "stack.0", by its first part), in order of first appearance."""
    out: dict[str, list[str]] = {}
    for name in blocks:
        out.setdefault(([p for p in name.split(".") if not p.isdigit()] or [name])[-1], []).append(name)
    return out


def parse_plan(text: str, blocks) -> dict[str, str]:
    """Plan.summary() text -> {block fqn: option} of the blocks it wraps, for the blocks in
    forward order (`blocks`); ValueError naming what is wrong."""
    letters = {v: k for k, v in LETTERS.items()}
    expected = groups(blocks)
    parts = dict(part.split(":", 1) for part in text.split() if ":" in part)
    if sorted(parts) != sorted(expected) or len(text.split()) != len(expected):
        raise ValueError(f"plan {text!r}: expected one 'group:letters' per block group "
                         f"({', '.join(expected)}), e.g. {' '.join(k + ':' + '-' * len(v) for k, v in expected.items())!r}")
    choices = {}
    for key, row in parts.items():
        if len(row) != len(expected[key]) or any(c not in letters for c in row):
            raise ValueError(f"plan {text!r}: {key} needs {len(expected[key])} letters of "
                             f"{''.join(letters)} (one per block), got {row!r}")
        choices.update({n: letters[c] for n, c in zip(expected[key], row) if letters[c] != "none"})
    return choices


def plan_text(choices, blocks) -> str:
    """{block fqn: option} (blocks left out: "none") as text: one letter per block (LETTERS) in
    forward order, grouped (`groups`): GEMRef's "layers.{i}.{kind}" give "sequence:SF interaction:-- cross:F-"."""
    return " ".join(f"{key}:" + "".join(LETTERS[choices.get(n, "none")] for n in names)
                    for key, names in groups(blocks).items())
