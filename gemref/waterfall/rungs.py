"""How each rung of the ladder (gemref/waterfall/ladder.py) changes the TrainConfig of the rung before it.

A rung returns the next TrainConfig, or a sentence saying why it does not apply here (then
the next rung builds on the last rung that ran). Rungs change how the model runs, never
what it computes, so model FLOPs per sample are the same on every rung; a rung that raises
the batch size (AutoAC spends the memory it frees on a larger batch) changes FLOPs per
*step* only. The AutoAC rung's memory budget is the activation memory (CPU; peak step
memory on CUDA) the previous rung's step used at the batch each rank runs; the rung solves
its plan there, once, and carries it to the ranks in the `ac_plan` switch (TrainConfig.activation_checkpoint.plan).

Options (`gemref waterfall --with ...`, WITH_OPTIONS) swap in GEM's later techniques without
adding rungs: `local` balances rung 5 with policy "local" (each rank from its own pool, no
cross-rank traffic) instead of kk; `lpt` with policy "lpt" (the greedy split, which every rank
plans in a fraction of kk's time at many ranks); `compressed_ac` runs rung 4 with compressed saved
activations: its batch search asks for the largest batch whose step fits the budget with
every block's saved activations in MXFP8 and nothing recomputed (instead of every block fully
checkpointed, which recomputes the most), and its AutoAC then has "compressed" as one more
option per block (ac_compress), solved by FLOPs (the batch it searched assumed nothing
recomputed; solving by measured time could add recompute that search never counted, and
makes the plan vary with the machine's load). Full checkpointing still frees more
bytes per block than compression, so the plain rung may reach a larger batch; the waterfall
shows which buys more throughput. `window` windows every rung's sequence attention
(ModelConfig.window = max_len // WINDOW_FRACTION; `preset_with`). `torchrec` runs rung 6's
tables as TorchRec modules sharded by DistributedModelParallel (gemref/interop/) beside FSDP2
on the dense layers, instead of gemref's readable row sharding (parallel/sparse.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..measure.batch_search import larger_batch, step_bytes
from ..compile.plan import plan_gemref_regions
from ..train.presets import Preset
from ..train.config import TrainConfig
from ..train.override import override
from ..data.batches import representative_batch
from ..errors import UsageError
from .ladder import RUNGS, RungSpec
from ..precision.support import native_support
from ..train import build_model


WITH_OPTIONS: dict[str, str] = {
    "local": "rung 5 balances with policy local (each rank from its own pool) instead of kk",
    "lpt": "rung 5 balances with policy lpt (the greedy split, planned faster than kk at many ranks) instead of kk",
    "compressed_ac": "rung 4's batch search and AutoAC with saved activations stored as MXFP8 (a larger batch "
                     "without recompute)",
    "window": "sequence attention sees only the last max_len/4 events (ModelConfig.window), every rung",
    "torchrec": "rung 6 shards the embedding tables with TorchRec's DistributedModelParallel (its planner's plan; "
                "tables on fused exact Adagrad, fbgemm's CPU kernels have no Adam) instead of gemref's row sharding",
}
COMPRESSED_AC_FORMAT = "mxfp8"   # the ac_compress switch of rung 4 with --with compressed_ac
WINDOW_FRACTION = 4              # --with window: window = max_len // WINDOW_FRACTION events


def check_options(names) -> tuple[str, ...]:
    """The --with names in WITH_OPTIONS' order; an unknown one is a UsageError listing the valid ones."""
    unknown = [n for n in names if n not in WITH_OPTIONS]
    if unknown:
        raise UsageError(f"unknown waterfall option(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(WITH_OPTIONS)}")
    if "local" in names and "lpt" in names:
        raise UsageError("--with local and lpt both choose rung 5's balance policy: give one of them")
    return tuple(n for n in WITH_OPTIONS if n in names)


def preset_with(preset: Preset, options) -> Preset:
    """The preset every rung trains: with `window`, its ModelConfig.window set."""
    if "window" not in options:
        return preset
    return replace(preset, model=replace(preset.model, window=max(1, preset.model.max_len // WINDOW_FRACTION)))


@dataclass(frozen=True)
class Context:
    preset: Preset
    device: torch.device
    ranks: int
    options: tuple[str, ...] = field(default=())   # WITH_OPTIONS turned on


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


def cpu_bf16_gain() -> tuple[float | None, str]:
    """(bf16 peak / fp32 peak, the two peaks in words) on this CPU, both measured (mfu/peak.py)."""
    from ..mfu.peak import peak_flops

    bf16, fp32 = peak_flops("cpu", "bf16"), peak_flops("cpu", "fp32")
    if not (bf16.flops and fp32.flops):
        return None, "no measured bf16 or fp32 GEMM peak"
    return bf16.flops / fp32.flops, (f"bf16 GEMMs {bf16.flops / 1e9:,.0f} GFLOP/s vs fp32 "
                                     f"{fp32.flops / 1e9:,.0f} GFLOP/s on this CPU")


def _low_precision(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """GPUs: MXFP8 where the GPU has it (Blackwell), else row-wise float8 (Hopper/Ada); never
    emulated. CPUs: bf16 autocast (fp32 master weights) where this CPU's measured bf16 GEMM peak
    beats its fp32 one (AMX-BF16's tiles; AVX512-BF16's vdpbf16ps, ~2x fp32 FMA on Zen 4), the
    CPU's counterpart of the GPU's narrower formats."""
    if ctx.device.type == "cpu":
        gain, peaks = cpu_bf16_gain()
        if gain is not None and gain > 1:
            return override(train, precision="bf16")
        return f"n/a here: {peaks}: bf16 does not beat fp32 on this CPU's GEMMs"
    for precision in ("mxfp8", "float8_rowwise"):
        ok, _ = native_support(precision, ctx.device)
        if ok:
            return override(train, precision=precision, precision_kernel="native")
    _, why = native_support("float8_rowwise", ctx.device)
    return f"n/a here: {why} (emulation reproduces the numerics, not the speed)"


def _compile(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """Compile the region kinds that win: each measured eager against compiled on the batch each
    rank runs, with the threads a rank has (gemref.compile.plan.plan_gemref_regions), once, here; the ranks
    get the plan in compile_regions. No winner: the rung does not apply (every region would
    only add its call overhead), and says by how much each lost."""
    per_rank = max(1, train.batch_size // ctx.ranks)
    model = build_model(ctx.preset, train, ctx.device)[0]
    batch = representative_batch(ctx.preset.model, ctx.preset.data, per_rank, ctx.device, seed=train.seed)
    threads = torch.get_num_threads()
    if ctx.device.type == "cpu" and ctx.ranks > 1:
        torch.set_num_threads(1)               # as a rank runs (gemref/parallel/launch.py)
    try:
        found = plan_gemref_regions(model, batch)
    finally:
        torch.set_num_threads(threads)
    if not found.kept:
        return ("n/a here: no compiled region beats eager by " + f"{found.margin:.0%} on this device ("
                + ", ".join(f"{r['region']} {r['speedup']:.2f}x" for r in found.rows) + ")")
    return override(train, compile=True, compile_regions=found.regions_text())


def _autoac(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """Keep the activation memory the previous rung's step used at the batch each rank runs,
    let AutoAC checkpoint just enough that a larger batch fits in it
    (gemref/measure/batch_search.py `larger_batch`), and hand the ranks the plan it solved there
    (ac_plan: planned once, here, not again on every rank). With `compressed_ac`: saved
    activations compressed decide the batch, and "compressed" is one more option per block
    (module doc)."""
    per_rank = train.batch_size // ctx.ranks
    eager = override(train, compile=False, compile_regions="all", ac="none", ac_compress="none")
    model = build_model(ctx.preset, eager, ctx.device)[0]  # eager twin
    batch_of = lambda n: representative_batch(ctx.preset.model, ctx.preset.data, n, ctx.device,  # noqa: E731
                                              seed=train.seed)
    compressed = "compressed_ac" in ctx.options
    found = larger_batch(model, batch_of, step_bytes(model, batch_of(per_rank)), per_rank,
                         compress=COMPRESSED_AC_FORMAT if compressed else "none",
                         options=("full",) if train.compilation.enabled else ("save_matmuls", "full"),
                         objective="flops" if compressed else "time")
    if isinstance(found, str):
        return f"n/a here: {found}"
    return override(train, ac="auto", ac_budget=found.budget_fraction, ac_compress=found.compress,
                    ac_plan=found.plan.summary(), batch_size=found.batch * ctx.ranks)


def fsdp_mesh(ranks: int) -> str:
    """Rung 6's mesh "RxS": a 2D mesh where the ranks allow one, 2 replicas x ranks/2 shards (HSDP,
    each table sharded within a replica and its gradient summed across replicas) from 4 ranks on,
    when they split evenly; else 1xN, FSDP and the tables sharded over every rank with no replicate
    dim, which the rung's title then says (rows.py `row_title`). With --with torchrec: 1xN."""
    return f"2x{ranks // 2}" if ranks >= 4 and ranks % 2 == 0 else f"1x{ranks}"


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
    "compile": _compile,
    "autoac": _autoac,
    "load_balance": _needs_ranks(lambda t, c: override(t, balance=next((p for p in ("local", "lpt") if p in c.options),
                                                                       "kk"))),
    "fsdp_2d": _needs_ranks(lambda t, c: override(t, mesh=fsdp_mesh(c.ranks), sparse_sharding="row")
                            if "torchrec" not in c.options else override(t, mesh=f"1x{c.ranks}", embeddings="torchrec")),
    "low_precision": _low_precision,
}
LADDER: list[Rung] = [Rung(spec, CONFIGURE[spec.key]) for spec in RUNGS]


def skipped(rung: Rung, why: str) -> Rung:
    """`rung` left out of a run on purpose: it stays in every table as "skipped here: <why>"."""
    return Rung(rung.spec, lambda t, c: f"skipped here: {why}")


def plan(ladder: list[Rung], start: TrainConfig, ctx: Context) -> list[tuple[Rung, "TrainConfig | str"]]:
    """(rung, its TrainConfig or why it does not apply) in order, each built on the last that applied."""
    out, train = [], start
    for rung in ladder:
        nxt = rung.configure(train, ctx)
        out.append((rung, nxt))
        train = train if isinstance(nxt, str) else nxt
    return out
