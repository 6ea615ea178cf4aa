"""Kernel variants of the Triton GDPA kernel: flags, where they come from, tile shapes, and the
rule that names the default from a GPU check (`choose_winner`).

A `Variant` names one way of running the same math (every variant matches reference.py;
tests/test_attention_triton.py checks each one forward and backward). Flags:

  silu_tanh=1      SiLU as 0.5 x (1 + tanh(x / 2)): one special-function op per score
                   (PTX tanh.approx.f32 on CUDA for fp16/bf16 inputs) instead of two (exp and
                   reciprocal in x * sigmoid(x)); elsewhere tanh is computed from sigmoid.
  fold_scale=1     qk_scale (times log2 e for softmax) multiplied into the resident Q tile (forward,
                   dQ) or K tile (dK/dV) once per program, not into every score tile.
  schedule=lpt     programs ordered costliest tile first, tile-major (every sequence's tile t
                   runs together); schedule=grouped: all tiles of one (sequence, head) adjacent,
                   longest sequences first, so programs running together share K/V in L2.
  bwd=split        deterministic backward: a dK/dV kernel and a dQ kernel (7 matmuls per tile
                   pair); bwd=atomic: one kernel, dQ accumulated with fp32 atomics (5 matmuls;
                   the summation order, hence the last bits of dQ, varies between runs).
  autotune=1       CUDA only: time the TILE_CANDIDATES of each pass that fit (resources.py)
                   once per key (head dim, activation, mask, dtype, flags, mean-length bucket)
                   and keep the fastest; autotune=0 runs the first that fits. The interpreter
                   never tunes.
  fwd=BMxBNxWxS    fixed tiles of one pass (also dkdv=, dq=): BLOCK_M x BLOCK_N, num_warps,
                   num_stages; overrides autotune for that pass (honoured by the interpreter).
  cache_schedule=1 keep each batch's work schedule (keyed by the offsets tensors' identity and
                   version), so 6 layers x 3 passes build it once per batch.

Where a call gets its variant, first match wins: the `variant=` keyword of gdpa_triton, the
innermost `use_variant(...)` block, the GEMREF_GDPA environment variable (the same
"flag=value,..." text, a bare flag meaning =1), then the defaults below. The defaults are the
kernel as it was before these variants existed (autotuning on CUDA included): nothing has
been timed on a GPU yet. scripts/gpu_check.sh times every variant side by side and names the
fastest correct one in its summary ("gdpa_default", by `choose_winner` at the end of this
file); the rule is that these defaults become that winner's flags when its JSON is committed
to benchmarks/.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, fields, replace
from typing import Iterator

from ...errors import UsageError

ENV_VAR = "GEMREF_GDPA"
PASSES = ("fwd", "dkdv", "dq")
SCHEDULES = ("lpt", "grouped")
BACKWARDS = ("split", "atomic")


@dataclass(frozen=True)
class Tiles:
    """One launch configuration of a pass: BLOCK_M query rows x BLOCK_N keys, warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    @classmethod
    def parse(cls, text: str) -> "Tiles":
        parts = text.lower().split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (2, 4) or any(v < 1 for v in values):
            raise ValueError(f"tiles {text!r}: expected BMxBN or BMxBNxWARPSxSTAGES, e.g. 128x64x4x3")
        tiles = cls(*values)
        for name in ("block_m", "block_n"):
            size = getattr(tiles, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"tiles {text!r}: {name} must be a power of two >= 16 (tl.dot), got {size}")
        if tiles.num_warps & (tiles.num_warps - 1):
            raise ValueError(f"tiles {text!r}: num_warps must be a power of two, got {tiles.num_warps}")
        return tiles

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.num_warps}x{self.num_stages}"


# CUDA tiles per pass, in order of preference: autotune=1 times those that fit the head dim and
# dtype (gemref/attention/triton/resources.py: no spill, shared memory within sm_90's), autotune=0
# runs the first that fits. bf16 at head dims 16..128 gets the first of each list; fp32 at 128
# falls to smaller tiles. The earlier dK/dV default, 32 x 128 at 4 warps, spilled at head dim 128.
TILE_CANDIDATES = {
    "fwd": (Tiles(128, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(128, 128, 8, 2), Tiles(64, 64, 4, 3),
            Tiles(64, 32, 4, 2)),
    "dkdv": (Tiles(32, 128, 8, 3), Tiles(64, 128, 8, 2), Tiles(32, 64, 4, 3), Tiles(32, 64, 4, 2),
             Tiles(16, 64, 4, 2)),
    "dq": (Tiles(128, 32, 4, 3), Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3), Tiles(64, 32, 4, 2)),
}
INTERPRET_TILES = Tiles(16, 16, 1, 1)   # the interpreter: tiny tiles, warps/stages ignored


@dataclass(frozen=True)
class Variant:
    silu_tanh: bool = False
    fold_scale: bool = False
    schedule: str = "lpt"
    bwd: str = "split"
    autotune: bool = True
    cache_schedule: bool = True
    fwd: str = ""        # fixed tiles per pass ("" = autotuned, or the first fitting candidate)
    dkdv: str = ""
    dq: str = ""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if self.bwd not in BACKWARDS:
            raise ValueError(f"bwd={self.bwd!r}; valid: {', '.join(BACKWARDS)}")
        for name in PASSES:
            if getattr(self, name):
                Tiles.parse(getattr(self, name))

    @classmethod
    def parse(cls, text: str, base: "Variant | None" = None) -> "Variant":
        """'silu_tanh,schedule=grouped,fwd=128x128x8x2' -> Variant (a bare flag means =1)."""
        valid = {f.name: f.type for f in fields(cls)}
        changes: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            name = name.strip()
            if name not in valid:
                raise ValueError(f"unknown GDPA variant flag {name!r} in {text!r}; valid: {', '.join(valid)}")
            value = value.strip() if "=" in item else "1"
            if valid[name] == "bool":
                if value not in ("0", "1", "true", "false"):
                    raise ValueError(f"GDPA variant flag {name} takes 0 or 1, got {value!r}")
                changes[name] = value in ("1", "true")
            else:
                changes[name] = value
        return replace(base or cls(), **changes)

    def spec(self) -> str:
        """Canonical text (round-trips through parse); the custom ops carry it."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            out.append(f"{f.name}={int(value) if isinstance(value, bool) else value}")
        return ",".join(out)

    def fixed_tiles(self, pass_name: str) -> Tiles | None:
        text = getattr(self, pass_name)
        return Tiles.parse(text) if text else None


_stack: list[Variant] = []
_env_cache: dict[str | None, Variant] = {}


@contextlib.contextmanager
def use_variant(variant: Variant | str | None = None, **flags) -> Iterator[Variant]:
    """Run the Triton GDPA calls inside this block with `variant` (text or Variant) plus flags."""
    base = current_variant()
    chosen = Variant.parse(variant, base) if isinstance(variant, str) else (variant or base)
    unknown = sorted(set(flags) - {f.name for f in fields(Variant)})
    if unknown:
        raise ValueError(f"unknown GDPA variant flag(s) {unknown}; valid: {', '.join(f.name for f in fields(Variant))}")
    chosen = replace(chosen, **flags)
    _stack.append(chosen)
    try:
        yield chosen
    finally:
        _stack.pop()


def current_variant() -> Variant:
    """The innermost use_variant block's variant, else GEMREF_GDPA's, else the defaults."""
    if _stack:
        return _stack[-1]
    text = os.environ.get(ENV_VAR)
    if text not in _env_cache:
        valid = f"valid: flag[=value],... of {', '.join(f.name for f in fields(Variant))}, or unset it for the defaults"
        if text is not None and not text.strip():
            raise UsageError(f"{ENV_VAR}={text!r}; {valid}")
        try:
            _env_cache[text] = Variant.parse(text or "")
        except ValueError as e:
            raise UsageError(f"{ENV_VAR}={text!r}: {e} ({valid})") from None
    return _env_cache[text]


def resolve_variant(variant: Variant | str | None) -> Variant:
    if variant is None:
        return current_variant()
    return Variant.parse(variant) if isinstance(variant, str) else variant


# ----------------------------------------------------------- the rule that names the default
BASE = "base"   # the variant every other one is a set of flags on, in the GPU check's VARIANTS


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def choose_winner(summary: dict, variants: dict[str, str]) -> dict:
    """The fastest correct variant of a GPU check's summary (scripts/gpu_check/ calls this
    after its timing section): {"winner", "spec", "fwd_winner", "bwd_winner", "scores",
    "reason"}; winner None (with the reason) when none qualifies. `variants`: name -> spec.

      correct  every correctness record of the variant passed (determinism included), and
               every record of "base" passed (the variants are flags on that kernel; only base
               is checked on the wider case set: fp16, full mask, window, cross attention);
      timed    at least one timing row, no row with an error;
      score    per (profile, activation) row timed for both, the variant's fwd_ms + bwd_ms over
               base's (a training step runs both passes); the geometric mean of those ratios,
               lower is faster. silu_tanh is scored on silu rows only (its flag changes nothing
               else, so it is not timed on softmax).
    The winner is the correct, timed variant with the lowest score (the first listed on a tie);
    forward and backward winners (fwd_ms and bwd_ms alone) are reported too. Its spec text
    (also usable as GEMREF_GDPA) is what Variant's defaults become; "autotune" winning means
    the defaults stay."""
    sections = summary.get("sections", {})
    corr = sections.get("correctness", {}).get("result", {})
    records = corr.get("cases", []) + corr.get("determinism", [])
    rows = [r for r in sections.get("timing", {}).get("result", {}).get("rows", []) if r.get("kernel") in variants]
    if not records or not rows:
        return {"winner": None, "reason": "no correctness records or no timing rows"}
    base_ok = all(r["passed"] for r in records if r["variant"] == BASE)
    base_ms = {(r["profile"], r["activation"]): r for r in rows if r["kernel"] == BASE and "fwd_ms" in r}
    scores = {}
    for name in variants:
        mine = [r for r in records if r["variant"] == name]
        timed = [r for r in rows if r["kernel"] == name]
        pairs = [(r, base_ms[(r["profile"], r["activation"])]) for r in timed
                 if "fwd_ms" in r and (r["profile"], r["activation"]) in base_ms]
        entry = {"correct": bool(mine) and base_ok and all(r["passed"] for r in mine),
                 "timed": bool(pairs) and all("fwd_ms" in r for r in timed), "rows": len(pairs)}
        if pairs:
            entry.update({f"{key}_ratio": _geomean([fn(r) / fn(b) for r, b in pairs]) for key, fn in (
                ("step", lambda x: x["fwd_ms"] + x["bwd_ms"]), ("fwd", lambda x: x["fwd_ms"]),
                ("bwd", lambda x: x["bwd_ms"]))})
        scores[name] = entry
    eligible = {n: s for n, s in scores.items() if s["correct"] and s["timed"]}
    if not eligible:
        return {"winner": None, "scores": scores,
                "reason": "no variant is both correct and timed" + ("" if base_ok else " (base failed a case)")}
    best = {key: min(eligible, key=lambda n: eligible[n][f"{key}_ratio"]) for key in ("step", "fwd", "bwd")}
    return {"winner": best["step"], "spec": variants[best["step"]], "fwd_winner": best["fwd"],
            "bwd_winner": best["bwd"], "scores": scores,
            "reason": "lowest geometric-mean (fwd + bwd) time relative to base among correct, timed variants"}
