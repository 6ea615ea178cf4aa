"""Regions by name: which callables of a model `compile_model` and `plan_regions` take.

A region is named as the caller sees the model, never by a kind gemref invented:

  * a module's fully qualified name (`model.named_modules()`: "head", "stack.0"): its `forward`
    is the region (torchtitan compiles each transformer block this way);
  * a module's name and one of its methods ("layers.0.sequence.project"; a method of the model
    itself by its name alone, "mix"): that method, for a block whose dense parts sit on either
    side of something that should stay eager;
  * a pattern of either, matched segment by segment with fnmatch ("stack.*" is every direct
    child of `stack`, not their children; "layers.*.cross.mix").

A name (or pattern) that matches nothing is a ValueError naming it, as is a region nested in
another (a module whose forward is a region, and a module or method inside it): compiling both
would trace one compiled function inside another.

A block AutoAC has wrapped keeps its name: the region is the block inside the wrapper.
GEMRef's own path names its regions explicitly: `gemref_regions(model, kinds)` maps the
`compile_regions` kinds (gemref/compile/config.py) to these names for every layer.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Sequence

from torch import nn

# GEMRef's region kind -> (block, method) of every GEMLayer; COMPILE_REGIONS (gemref/compile/config.py) adds "loss"
REGION_KINDS = {"sequence.project": ("sequence", "project"), "sequence.mix": ("sequence", "mix"),
                "interaction": ("interaction", "forward"), "cross.project": ("cross", "project"),
                "cross.mix": ("cross", "mix")}
_PATTERN = set("*?[")
WRAPPED = "_checkpoint_wrapped_module"    # where a checkpoint wrapper holds its block (torch's name)


@dataclass(frozen=True)
class Region:
    """One resolved region: `getattr(owner, attr)` is the callable compiled (attr "forward" for a
    module region), `name` the name it is reported under."""

    name: str
    owner: nn.Module
    owner_name: str
    attr: str


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names))


def _method(module: nn.Module, attr: str) -> bool:
    """Whether `attr` is a callable of `module` other than a submodule or a tensor (a method, or a
    method already wrapped, e.g. checkpointed)."""
    if attr.startswith("_") or attr in module._modules or attr in module._parameters or attr in module._buffers:
        return False
    return callable(getattr(module, attr, None))


def resolve_regions(model: nn.Module, names: Sequence[str]) -> list[Region]:
    """The regions `names` pick in `model`, in the order given (module doc); a ValueError names
    every name that matches nothing, and any nesting."""
    if isinstance(names, str):
        raise ValueError(f"regions must be a sequence of names, got the string {names!r} (wrap it in a list)")
    if not names:
        raise ValueError("no region named: give module names (or 'module.method', or patterns)")
    # a block inside a checkpoint wrapper (AutoAC's CheckpointedBlock, torch's checkpoint_wrapper) is
    # named as the wrapper is; the region is the block itself, the checkpoint staying eager around it
    modules = {fqn: getattr(m, WRAPPED, m) for fqn, m in model.named_modules()
               if fqn and WRAPPED not in fqn.split(".")}
    found: dict[str, Region] = {}
    unknown = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a region name must be a non-empty string, got {name!r}")
        hits = []
        if _PATTERN & set(name):
            hits = [Region(f, m, f, "forward") for f, m in modules.items() if _matches(name, f)]
        elif name in modules:
            hits = [Region(name, modules[name], name, "forward")]
        if not hits:                                       # "module.method" (or a pattern of it), "method"
            owner_pattern, _, attr = name.rpartition(".")
            owners = ([f for f in modules if _matches(owner_pattern, f)] if _PATTERN & set(owner_pattern)
                      else [owner_pattern] if owner_pattern in modules or not owner_pattern else [])
            hits = [Region(f"{f}.{attr}".lstrip("."), modules.get(f, model), f, attr) for f in owners
                    if _method(modules.get(f, model), attr)]
        if not hits:
            unknown.append(name)
        for region in hits:
            found.setdefault(region.name, region)
    if unknown:
        sample = ", ".join(list(modules)[:8]) + (", ..." if len(modules) > 8 else "")
        raise ValueError(f"unknown region(s) {unknown}: not a submodule of {type(model).__name__}, a method of one, "
                         f"or a pattern matching one (its modules: {sample})")
    regions = list(found.values())
    for outer in regions:
        if outer.attr != "forward":
            continue
        inner = [r.name for r in regions if r is not outer and (not outer.owner_name or r.owner_name == outer.owner_name
                                                                or r.owner_name.startswith(outer.owner_name + "."))]
        if inner:
            raise ValueError(f"region {outer.name!r} contains region(s) {inner}: compile the outer one or the inner "
                             "ones, not both")
    return regions


def gemref_regions(model: nn.Module, kinds: Sequence[str], layers: Sequence[int] | None = None) -> list[str]:
    """GEMRef's region names for its `compile_regions` kinds ("loss" is not a module region: the
    caller compiles the loss itself), in every layer (or those listed):
    "sequence.mix" -> ["layers.0.sequence.mix", "layers.1.sequence.mix", ...]."""
    if unknown := [k for k in kinds if k not in REGION_KINDS and k != "loss"]:
        raise ValueError(f"unknown GEMRef region kind(s) {unknown}; valid: {', '.join(REGION_KINDS)}, loss")
    if not hasattr(model, "layers"):
        raise ValueError(f"{type(model).__name__} is not a GEMRef (no `layers`): name its regions instead")
    indices = range(len(model.layers)) if layers is None else layers
    return [f"layers.{i}.{block}.{method}".removesuffix(".forward") for i in indices
            for kind, (block, method) in REGION_KINDS.items() if kind in kinds]
