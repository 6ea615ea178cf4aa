"""Applying an AutoAC plan: each chosen block is replaced, in its parent, by a `CheckpointedBlock`
that holds it and runs it under its option (the idea and the options: gemref/autoac/__init__.py).

The wrapper holds the block as `_checkpoint_wrapped_module`, the name torch's own checkpoint
wrapper uses (torch.distributed.algorithms._checkpoint.checkpoint_wrapper, torchtitan's AC),
so torch.distributed.checkpoint's state dicts drop it from parameter names; `state_dict()` drops
it too (hooks below), so a checkpoint written with one plan loads under another or none.
`named_parameters()` does show it. The plan lives on the wrappers: `applied_plan(model)` reads
it back, `remove_plan(model)` puts every block back where its wrapper was.
"""
from __future__ import annotations

from collections import Counter
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts,
                                    noop_context_fn)
from torch.utils.flop_counter import flop_registry

from .compress import CompressionSpec, SavedCompression

OPTIONS = ("none", "save_matmuls", "full")  # exact: gradients unchanged bit for bit
APPROXIMATE_OPTIONS = ("compressed",)       # gradients within the compression format's error
LETTERS = {"none": "-", "save_matmuls": "S", "full": "F", "compressed": "C"}   # Plan.summary()
PREFIX = "_checkpoint_wrapped_module."


def saves_output(op) -> bool:
    """The save_matmuls policy: keep the output of ops that cost FLOPs or whose cost is unknown.

    "Cost FLOPs" = priced by FlopCounterMode (matmul family, convolution, attention); any other
    aten op named *attention* / *scaled_dot_product* too. Non-aten ops (custom kernels such as
    gemref::cpu_jagged_fwd) are saved: the policy sees them as one op, so their FLOPs are never
    recomputed. Aten ops that write into a tensor they are given (`out=` variants, in-place
    ops) are never saved: what they write may be a reused workspace, not an activation.
    """
    if op.namespace == "aten" and op._schema.is_mutable:
        return False
    if op.namespace != "aten":
        return True
    name = op.overloadpacket.__name__
    return op.overloadpacket in flop_registry or "attention" in name or "scaled_dot_product" in name


def _save_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if saves_output(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _strip_prefix(module, state_dict, prefix, local_metadata):
    for key in [k for k in state_dict if k.startswith(prefix + PREFIX)]:
        state_dict[prefix + key[len(prefix + PREFIX):]] = state_dict.pop(key)
    return state_dict


def _add_prefix(state_dict, prefix, *args):
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + PREFIX)]:
        state_dict[prefix + PREFIX + key[len(prefix):]] = state_dict.pop(key)


class CheckpointedBlock(nn.Module):
    """One block run under one option: "full" or "save_matmuls" through
    torch.utils.checkpoint (non-reentrant), "compressed" under `compression`'s hooks. Without
    grad (evaluation) the block runs as it is. `clock`, when set (the profiler), is called
    with "start" / "stop" around every run of the block, the recompute in backward included."""

    def __init__(self, block: nn.Module, option: str, compression: SavedCompression | None = None):
        super().__init__()
        if option not in OPTIONS[1:] + APPROXIMATE_OPTIONS:
            raise ValueError(f"unknown checkpoint option {option!r}; valid: {', '.join(OPTIONS + APPROXIMATE_OPTIONS)}")
        if (option == "compressed") != (compression is not None):
            raise ValueError("a 'compressed' block needs its SavedCompression (and only it does)")
        self._checkpoint_wrapped_module = block
        self.option = option
        self.compression = compression
        self.clock = None
        self.plan = None      # the Plan this wrapper belongs to (apply_plan), if a solver made one
        self._register_state_dict_hook(_strip_prefix)
        self._register_load_state_dict_pre_hook(_add_prefix)

    def _run(self, *args, **kwargs):
        if self.clock is None:
            return self._checkpoint_wrapped_module(*args, **kwargs)
        self.clock("start")
        try:
            return self._checkpoint_wrapped_module(*args, **kwargs)
        finally:
            self.clock("stop")

    # Under torch.compile of a caller's whole model the hooks must run eagerly around what is
    # compiled (a traced pack fails: inductor's CPU backend has no E8M0), so skip this frame.
    @torch.compiler.disable(recursive=False)
    def _compressed(self, *args, **kwargs):
        with self.compression.hooks(self._checkpoint_wrapped_module):
            return self._run(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._checkpoint_wrapped_module(*args, **kwargs)
        if self.option == "compressed":
            return self._compressed(*args, **kwargs)
        context = (partial(create_selective_checkpoint_contexts, _save_matmuls_policy)
                   if self.option == "save_matmuls" else noop_context_fn)
        return checkpoint(self._run, *args, use_reentrant=False, context_fn=context, **kwargs)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    try:
        return model.get_submodule(parent_name), child
    except AttributeError:
        raise ValueError(f"no block {name!r} in the model (no module {parent_name!r})") from None


def find_blocks(model: nn.Module, blocks) -> dict[str, nn.Module]:
    """{name: module} of the blocks named by fully qualified name (`model.get_submodule`);
    ValueError naming the first that is missing or is the model itself."""
    found = {}
    for name in blocks:
        if not isinstance(name, str) or not name:
            raise ValueError(f"block names are module paths such as 'layers.0', got {name!r}")
        parent, child = _parent(model, name)
        module = parent._modules.get(child)
        if module is None:
            where = repr(name.rpartition(".")[0]) if "." in name else "the model"
            raise ValueError(f"no block {name!r} in the model: {where} has no submodule {child!r}")
        found[name] = module
    return found


def apply_plan(model: nn.Module, plan, *, compression: CompressionSpec | None = None) -> None:
    """Wrap each block of `plan` (a Plan or {block fqn: option}; "none" and blocks left out stay
    as they are) in a CheckpointedBlock placed where the block was. "compressed" blocks share
    one SavedCompression in `compression`'s format (default CompressionSpec()); its counters:
    `saved_compression(model).stats`. Apply before torch.compile and FSDP."""
    choices = dict(getattr(plan, "choices", plan))
    blocks = find_blocks(model, choices)
    for name, option in choices.items():
        if option not in OPTIONS + APPROXIMATE_OPTIONS:
            raise ValueError(f"unknown checkpoint option {option!r} for {name}; "
                             f"valid: {', '.join(OPTIONS + APPROXIMATE_OPTIONS)}")
        if isinstance(blocks[name], CheckpointedBlock):
            raise ValueError(f"{name} is already checkpointed ({blocks[name].option}); remove_plan first")
    shared = saved_compression(model)
    if "compressed" in choices.values():
        spec = compression or (shared.spec if shared is not None else CompressionSpec())
        if shared is not None and shared.spec != spec:
            raise ValueError(f"the model already compresses with {shared.spec}; remove_plan first")
        shared = shared or SavedCompression(spec)
    for name, option in choices.items():
        if option != "none":
            parent, child = _parent(model, name)
            setattr(parent, child, CheckpointedBlock(blocks[name], option,
                                                     shared if option == "compressed" else None))
    for wrapper in wrappers(model).values():
        wrapper.plan = plan if hasattr(plan, "choices") else None   # the solver's Plan, for plan_record


def wrappers(model: nn.Module) -> dict[str, CheckpointedBlock]:
    """{module path: wrapper} of every wrapped block, in module order (a path passes through
    the wrappers above it, if blocks are nested)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, CheckpointedBlock)}


def applied_plan(model: nn.Module) -> dict[str, str]:
    """{block fqn: option} of the wrapped blocks, read off the model."""
    return {_fqn(name): m.option for name, m in wrappers(model).items()}


def _fqn(name: str) -> str:
    return name.replace(PREFIX, "")


def remove_plan(model: nn.Module) -> None:
    """Undo `apply_plan`: every wrapped block goes back in its parent's place."""
    for name, wrapper in sorted(wrappers(model).items(), key=lambda kv: -kv[0].count(".")):
        parent, child = _parent(model, name)
        setattr(parent, child, wrapper._checkpoint_wrapped_module)


def saved_compression(model: nn.Module) -> SavedCompression | None:
    """The hooks (and counters) of the model's "compressed" blocks, if any."""
    return next((m.compression for m in wrappers(model).values() if m.compression is not None), None)


def plan_record(model: nn.Module) -> dict | None:
    """The run-record entry of the plan applied to the model (None when nothing is)."""
    choices = applied_plan(model)
    plan = next((m.plan for m in wrappers(model).values() if m.plan is not None), None)
    if plan is not None and plan.choices == choices:
        return plan.as_record()
    return {"choices": choices, "counts": dict(Counter(choices.values()))} if choices else None
