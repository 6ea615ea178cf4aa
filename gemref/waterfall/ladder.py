"""The ladder: the one list of rungs that the waterfall measures and the projection models.

Each rung is the previous one plus one switch. This module names them (number, key, title,
the CLI switch, what it does, where it lives, the files a reader copies and the chapters on it)
and says what each changes in the scale
projection (`projection`: the RungModel fields of gemref/simulate/projection.py it sets, the
rest carried over from the rung before; the ASSUMED values are inputs, not measurements);
gemref/waterfall/rungs.py says how each rung changes a TrainConfig, and README's ladder table
is `markdown_table()` (a test keeps them equal). Imports nothing of gemref.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class RungSpec:
    number: int
    key: str        # stable id used in records, --skip lists and the projection
    title: str      # what tables and figures print
    switch: str     # the `gemref train` switch that turns it on
    what: str       # one line: what it changes
    where: str      # the module or package that implements it
    projection: dict  # the projection's RungModel fields this rung sets (gemref/simulate/projection.py)
    copy: tuple[str, ...] = ()      # the files a reader copies into their own trainer (README's table)
    chapters: tuple[str, ...] = ()  # the walkthrough's chapters on it (notebooks/)


RUNGS: tuple[RungSpec, ...] = (
    RungSpec(0, "baseline", "0 baseline", "(baseline)",
             "eager, every history padded to `max_len`, materialised attention, replicated data parallel",
             "gemref/model/", {}, ("gemref/model/gem.py", "gemref/model/blocks.py"), ("00_mfu_baseline",)),
    RungSpec(1, "jagged", "1 + jagged", "--jagged",
             "histories stay jagged (values + offsets): no FLOPs on padding", "gemref/model/layout.py",
             dict(padded=False), ("gemref/data/jagged.py", "gemref/model/layout.py"), ("01_jagged_batches",)),
    RungSpec(2, "fused_attention", "2 + flash/GDPA", "--kernel auto",
             "Flash (softmax) / GDPA (pointwise) kernels on jagged sequences", "gemref/attention/",
             dict(attention="fused"), ("gemref/attention/api.py", "gemref/attention/reference.py"),
             ("02_flash_attention", "03_gdpa")),
    RungSpec(3, "compile", "3 + compile", "--compile --compile-regions PLAN",
             "regional `torch.compile` of the region kinds measured faster than eager here, shape-generic "
             "for jagged batches", "gemref/compile/",
             # ASSUMED: torch.compile fuses element-wise ops and launches: typically +15-25% on GPUs.
             dict(efficiency=0.42), ("gemref/compile/apply.py", "gemref/compile/regions.py"), ("04_torch_compile",)),
    RungSpec(4, "autoac", "4 + AutoAC, larger batch", "--ac auto",
             "AutoAC: checkpoint what a memory budget requires, at the least measured recompute time, spend "
             "the memory on a larger batch",
             "gemref/autoac/",
             # ASSUMED: AutoAC recomputes ~1/3 of the forward of the checkpointed blocks and doubles the batch.
             dict(recompute=0.12, batch_scale=2.0),
             ("gemref/autoac/profile.py", "gemref/autoac/plan.py"), ("05_autoac",)),
    RungSpec(5, "load_balance", "5 + load balance", "--balance kk",
             "split each global batch across ranks by cost, not count", "gemref/balance/",
             dict(policy="kk"), ("gemref/balance/cost.py", "gemref/balance/partition.py", "gemref/data/sampler.py"),
             ("06_load_balancing",)),
    RungSpec(6, "fsdp_2d", "6 + FSDP/2D sparse", "--mesh RxS --sparse-sharding row",
             "FSDP2 on a 2D mesh, 2D-sharded embedding tables, comm/compute overlap", "gemref/parallel/",
             dict(layout="fsdp_2d"), ("gemref/parallel/mesh.py", "gemref/parallel/fsdp.py", "gemref/parallel/sparse.py"),
             ("07_fsdp_2d", "08_communication")),
    RungSpec(7, "low_precision", "7 + float8/MXFP8", "--precision float8_rowwise\\|mxfp8\\|bf16",
             "float8 (Hopper) / MXFP8 (Blackwell) GEMMs through torchao; on a CPU whose bf16 GEMMs beat fp32 "
             "(AMX, AVX512-BF16), bf16 autocast", "gemref/precision/apply.py",
             # ASSUMED: float8 Linear GEMMs run ~1.6x faster; with casts and the non-GEMM time ~1.25x per
             # step; torchao's float8 all-gather halves FSDP's gather bytes.
             dict(compute_speedup=1.25, gather_bytes=1), ("gemref/precision/apply.py",), ("09_mxfp8",)),
)

KEYS: tuple[str, ...] = tuple(r.key for r in RUNGS)


def rung(key: str) -> RungSpec:
    """The rung with this key; an unknown key is a ValueError listing the valid ones."""
    for r in RUNGS:
        if r.key == key:
            return r
    raise ValueError(f"unknown rung {key!r}; valid: {', '.join(KEYS)}")


def copy_lines(spec: RungSpec, root: Path = PROJECT_ROOT) -> int:
    """Lines of the files a reader copies for this rung (counted now, from the checkout)."""
    return sum(len((root / f).read_text().splitlines()) for f in spec.copy)


def markdown_table(root: Path = PROJECT_ROOT) -> str:
    """README's ladder table: rung, switch, what it does, the files to copy (linked), their lines,
    the chapters. A test keeps README's copy equal to this (paste `markdown_table()` after a change)."""
    lines = ["| rung | switch | what it does | copy | lines | chapter |", "|---|---|---|---|---:|---|"]
    for r in RUNGS:
        switch = f"`{r.switch}`" if r.number else r.switch
        files = ", ".join(f"[`{f}`]({f})" for f in r.copy)
        chapters = ", ".join(f"[{c}](notebooks/{c}.ipynb)" for c in r.chapters)
        lines.append(f"| {r.number} | {switch} | {r.what} | {files} | {copy_lines(r, root)} | {chapters} |")
    return "\n".join(lines)
