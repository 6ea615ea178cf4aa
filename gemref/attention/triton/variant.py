"""Kernel variants of the Triton GDPA kernel: flags, where they come from, and tile shapes.

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
  autotune=1       CUDA only: time the TILE_CANDIDATES of each pass once per key (head dim,
                   activation, mask, dtype, flags, mean-length bucket) and keep the fastest;
                   autotune=0 uses DEFAULT_TILES. The interpreter never tunes.
  fwd=BMxBNxWxS    fixed tiles of one pass (also dkdv=, dq=): BLOCK_M x BLOCK_N, num_warps,
                   num_stages; overrides autotune for that pass (honoured by the interpreter).
  cache_schedule=1 keep each batch's work schedule (keyed by the offsets tensors' identity and
                   version), so 6 layers x 3 passes build it once per batch.

Where a call gets its variant, first match wins: the `variant=` keyword of gdpa_triton, the
innermost `use_variant(...)` block, the GEMREF_GDPA environment variable (the same
"flag=value,..." text, a bare flag meaning =1), then the defaults below. The defaults are the
kernel as it was before these variants existed (autotuning on CUDA included): nothing has
been timed on a GPU yet. scripts/gpu_check.sh times every variant side by side and names the
fastest correct one in its summary ("gdpa_default", scripts/gpu_check_winner.py); the rule is
that these defaults become that winner's flags when its JSON is committed to benchmarks/.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields, replace
from typing import Iterator

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


# CUDA defaults (the kernel's tiles before variants existed) and the autotuning candidates;
# 128 x 128 at 8 warps is the largest tile that compiles without spills at D = 128 on sm_90.
DEFAULT_TILES = {"fwd": Tiles(128, 64, 4, 3), "dkdv": Tiles(32, 128, 4, 3), "dq": Tiles(128, 32, 4, 3)}
TILE_CANDIDATES = {
    "fwd": (Tiles(128, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(128, 128, 8, 2), Tiles(64, 64, 4, 3)),
    "dkdv": (Tiles(32, 128, 4, 3), Tiles(64, 128, 8, 2), Tiles(32, 64, 4, 3)),
    "dq": (Tiles(128, 32, 4, 3), Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3)),
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
    fwd: str = ""        # fixed tiles per pass ("" = autotuned or DEFAULT_TILES)
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
_env_cache: dict[str, Variant] = {}


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
    text = os.environ.get(ENV_VAR, "")
    if text not in _env_cache:
        _env_cache[text] = Variant.parse(text)
    return _env_cache[text]


def resolve_variant(variant: Variant | str | None) -> Variant:
    if variant is None:
        return current_variant()
    return Variant.parse(variant) if isinstance(variant, str) else variant
