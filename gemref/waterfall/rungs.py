"""How each rung of the ladder (gemref/ladder.py) changes the TrainConfig of the rung before it.

A rung returns the next TrainConfig, or a sentence saying why it does not apply here (then
the next rung builds on the last rung that ran). Rungs change how the model runs, never
what it computes, so model FLOPs per sample are the same on every rung; a rung that raises
the batch size (AutoAC spends the memory it frees on a larger batch) changes FLOPs per
*step* only. The AutoAC rung's memory budget is the activation memory (CPU; peak step
memory on CUDA) the previous rung's step used at its batch size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..autoac.profile import find_batch_size, step_bytes
from ..config import Preset, TrainConfig, override
from ..data.batches import representative_batch
from ..ladder import RUNGS, RungSpec
from ..precision.apply import native_support
from ..train import build_model


@dataclass(frozen=True)
class Context:
    preset: Preset
    device: torch.device
    ranks: int


@dataclass(frozen=True)
class Rung:
    spec: RungSpec
    # Returns the next TrainConfig, or a string: why the rung does not apply here.
    configure: Callable[[TrainConfig, Context], "TrainConfig | str"]

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def title(self) -> str:
        return self.spec.title


def _low_precision(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """MXFP8 where the GPU has it (Blackwell), else row-wise float8 (Hopper/Ada); never emulated."""
    for precision in ("mxfp8", "float8_rowwise"):
        ok, _ = native_support(precision, ctx.device)
        if ok:
            return override(train, precision=precision, precision_kernel="native")
    _, why = native_support("float8_rowwise", ctx.device)
    return f"n/a here: {why} (emulation reproduces the numerics, not the speed)"


def _autoac(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """Keep the activation memory the previous rung's step used, let AutoAC checkpoint just
    enough that a larger batch fits in it (autoac.profile.find_batch_size), train that batch."""
    device, per_rank = ctx.device, train.batch_size // ctx.ranks
    model = build_model(ctx.preset, override(train, compile=False, ac="none"), device)[0]   # eager twin
    batch_of = lambda n: representative_batch(ctx.preset, n, device, seed=train.seed)  # noqa: E731
    budget = step_bytes(model, batch_of(per_rank))
    options = ("full",) if train.compile else ("selective", "full")
    found = find_batch_size(model, batch_of, budget, max_batch=4 * per_rank, options=options)
    if found.autoac_batch <= per_rank:
        return "n/a here: checkpointing frees no room for a larger batch in this memory budget"
    no_ac_bytes = step_bytes(model, batch_of(found.autoac_batch))
    return override(train, ac="auto", ac_budget=min(1.0, budget / no_ac_bytes),
                    batch_size=found.autoac_batch * ctx.ranks)


def _needs_ranks(configure):
    """A data-parallel rung: n/a on one rank."""
    def rung(train: TrainConfig, ctx: Context) -> TrainConfig | str:
        if ctx.ranks < 2:
            return "n/a here: needs data-parallel ranks (--ranks >= 2)"
        return configure(train, ctx)
    return rung


CONFIGURE: dict[str, Callable[[TrainConfig, Context], "TrainConfig | str"]] = {
    # eager, padded to max_len, materialised attention, no AC, replicated data parallel
    "baseline": lambda t, c: override(t, jagged=False, kernel="reference", mesh=f"{c.ranks}x1", balance="none"),
    "jagged": lambda t, c: override(t, jagged=True),
    "fused_attention": lambda t, c: override(t, kernel="auto"),
    "compile": lambda t, c: override(t, compile=True),
    "autoac": _autoac,
    "load_balance": _needs_ranks(lambda t, c: override(t, balance="kk")),
    "fsdp_2d": _needs_ranks(lambda t, c: override(t, mesh=f"1x{c.ranks}", sparse_sharding="row")),
    "low_precision": _low_precision,
}
LADDER: list[Rung] = [Rung(spec, CONFIGURE[spec.key]) for spec in RUNGS]


def plan(ladder: list[Rung], start: TrainConfig, ctx: Context) -> list[tuple[Rung, "TrainConfig | str"]]:
    """(rung, its TrainConfig or why it does not apply) in order, each built on the last that applied."""
    out, train = [], start
    for rung in ladder:
        nxt = rung.configure(train, ctx)
        out.append((rung, nxt))
        train = train if isinstance(nxt, str) else nxt
    return out
