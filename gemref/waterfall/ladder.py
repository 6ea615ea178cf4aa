"""The ladder: the one list of rungs that the waterfall measures and the projection models.

Each rung is the previous one plus one switch. This module names them (number, key, title,
the CLI switch, what it does, where it lives) and says what each changes in the scale
projection (`projection`: the RungModel fields of gemref/simulate/projection.py it sets, the
rest carried over from the rung before; the ASSUMED values are inputs, not measurements);
gemref/waterfall/rungs.py says how each rung changes a TrainConfig, and README's ladder table
is `markdown_table()` (a test keeps them equal). Imports nothing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RungSpec:
    number: int
    key: str        # stable id used in records, --skip lists and the projection
    title: str      # what tables and figures print
    switch: str     # the `gemref train` switch that turns it on
    what: str       # one line: what it changes
    where: str      # the module or package that implements it
    projection: dict  # the projection's RungModel fields this rung sets (gemref/simulate/projection.py)


RUNGS: tuple[RungSpec, ...] = (
    RungSpec(0, "baseline", "0 baseline", "(baseline)",
             "eager, every history padded to `max_len`, materialised attention, replicated data parallel",
             "gemref/model/", {}),
    RungSpec(1, "jagged", "1 + jagged", "--jagged",
             "histories stay jagged (values + offsets): no FLOPs on padding", "gemref/model/layout.py",
             dict(padded=False)),
    RungSpec(2, "fused_attention", "2 + flash/GDPA", "--kernel auto",
             "Flash (softmax) / GDPA (pointwise) kernels on jagged sequences", "gemref/attention/",
             dict(attention="fused")),
    RungSpec(3, "compile", "3 + compile", "--compile --compile-regions PLAN",
             "regional `torch.compile` of the region kinds measured faster than eager here, shape-generic "
             "for jagged batches", "gemref/compile/",
             # ASSUMED: torch.compile fuses element-wise ops and launches: typically +15-25% on GPUs.
             dict(efficiency=0.42)),
    RungSpec(4, "autoac", "4 + AutoAC, larger batch", "--ac auto",
             "AutoAC: checkpoint what a memory budget requires, at the least measured recompute time, spend "
             "the memory on a larger batch",
             "gemref/autoac/",
             # ASSUMED: AutoAC recomputes ~1/3 of the forward of the checkpointed blocks and doubles the batch.
             dict(recompute=0.12, batch_scale=2.0)),
    RungSpec(5, "load_balance", "5 + load balance", "--balance kk",
             "split each global batch across ranks by cost, not count", "gemref/balance/",
             dict(policy="kk")),
    RungSpec(6, "fsdp_2d", "6 + FSDP/2D sparse", "--mesh RxS --sparse-sharding row",
             "FSDP2 on a 2D mesh, 2D-sharded embedding tables, comm/compute overlap", "gemref/parallel/",
             dict(layout="fsdp_2d")),
    RungSpec(7, "low_precision", "7 + float8/MXFP8", "--precision float8_rowwise\\|mxfp8\\|bf16",
             "float8 (Hopper) / MXFP8 (Blackwell) GEMMs through torchao; on a CPU whose bf16 GEMMs beat fp32 "
             "(AMX, AVX512-BF16), bf16 autocast", "gemref/precision/apply.py",
             # ASSUMED: float8 Linear GEMMs run ~1.6x faster; with casts and the non-GEMM time ~1.25x per
             # step; torchao's float8 all-gather halves FSDP's gather bytes.
             dict(compute_speedup=1.25, gather_bytes=1)),
)

KEYS: tuple[str, ...] = tuple(r.key for r in RUNGS)


def rung(key: str) -> RungSpec:
    """The rung with this key; an unknown key is a ValueError listing the valid ones."""
    for r in RUNGS:
        if r.key == key:
            return r
    raise ValueError(f"unknown rung {key!r}; valid: {', '.join(KEYS)}")


def markdown_table() -> str:
    """README's ladder table: rung, switch, what it does, where."""
    lines = ["| rung | switch | what it does | where |", "|---|---|---|---|"]
    lines += [f"| {r.number} | `{r.switch}` | {r.what} | `{r.where}` |" if r.number else
              f"| {r.number} | {r.switch} | {r.what} | `{r.where}` |" for r in RUNGS]
    return "\n".join(lines)
