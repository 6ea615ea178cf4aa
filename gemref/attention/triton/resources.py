"""What a tile shape asks of one streaming multiprocessor: registers per thread and shared memory.

A tile that needs more than 255 registers per thread still compiles: ptxas spills the excess to
local memory and the kernel slows down without an error, so the autotuner cannot reject it by a
failed launch. A tile that needs more shared memory than the SM offers fails to launch
(OutOfResources) on CUDA, and cannot be a default. This module estimates both from the tile
shape, so the defaults and the autotuning candidates are checked before anything runs (no GPU
needed; tests/test_attention_triton_schedule.py checks every default at head dims 16..128).

The estimates (units: 32-bit registers per thread; bytes per thread block), per pass, with
E the bytes of one input element (2 for bf16/fp16, 4 for fp32), D the head dim, BM x BN the tile
and T = 32 x num_warps threads:

  fwd   registers: (acc BM x D + scores BM x BN, fp32) / T + REG_OVERHEAD
        shared:    num_stages x (K, V tiles: 2 x BN x D x E) + Q tile BM x D x E + P tile BM x BN x E
  dkdv  registers: (dK, dV accumulators 2 x BN x D + S^T, dA^T tiles 2 x BN x BM, fp32) / T + REG_OVERHEAD
        shared:    num_stages x (Q, dO tiles: 2 x BM x D x E) + resident K, V 2 x BN x D x E
                   + W^T, dS^T operand tiles 2 x BN x BM x E
  dq    registers: (dQ accumulator BM x D + S, dA tiles 2 x BM x BN, fp32) / T + REG_OVERHEAD
        shared:    num_stages x (K, V tiles: 2 x BN x D x E) + resident Q, dO 2 x BM x D x E
                   + dS operand tile BM x BN x E

The fp32 accumulators and score tiles live in the MMA's registers, spread over the block's threads;
the streamed tiles sit in shared memory, one copy per pipeline stage; REG_OVERHEAD covers indices,
pointers, masks and the row statistics. They are estimates of the compiler's allocation, not its
output: `ptxas -v` on a GPU is the measurement, and scripts/gpu_check.sh records which tiles ran.
By them the kernel's earlier dK/dV default 32 x 128 at 4 warps needed 2 x 128 x 128 / 128 = 256
accumulator registers per thread at D = 128 (above 255 before any score tile), and 256 KiB of
shared memory in fp32 (sm_90 offers 227 KiB per block).
"""
from __future__ import annotations

from .variant import PASSES, TILE_CANDIDATES, Tiles

MAX_REGISTERS = 255                 # per thread, every NVIDIA GPU since sm_35 (CUDA C Programming Guide)
SM90_SHARED_BYTES = 227 * 1024      # per block, opt-in maximum on H100/H200 (sm_90; CUDA C Programming Guide)
REG_OVERHEAD = 40                   # indices, pointers, masks, row statistics (an allowance, not measured)


def _check(pass_name: str, head_dim: int, element_bytes: int) -> None:
    if pass_name not in PASSES:
        raise ValueError(f"pass {pass_name!r}; valid: {', '.join(PASSES)}")
    if head_dim < 1 or element_bytes not in (2, 4):
        raise ValueError(f"head_dim must be >= 1 and element_bytes 2 or 4, got {head_dim}, {element_bytes}")


def registers_per_thread(pass_name: str, tiles: Tiles, head_dim: int) -> int:
    """Estimated 32-bit registers per thread of one program of `pass_name` with `tiles`."""
    _check(pass_name, head_dim, 2)
    bm, bn, threads = tiles.block_m, tiles.block_n, 32 * tiles.num_warps
    fp32_values = {"fwd": bm * head_dim + bm * bn,
                   "dkdv": 2 * bn * head_dim + 2 * bn * bm,
                   "dq": bm * head_dim + 2 * bm * bn}[pass_name]
    return -(-fp32_values // threads) + REG_OVERHEAD


def shared_bytes(pass_name: str, tiles: Tiles, head_dim: int, element_bytes: int) -> int:
    """Estimated shared memory of one program (bytes): streamed tiles x stages, resident tiles, operands."""
    _check(pass_name, head_dim, element_bytes)
    bm, bn, stages, e = tiles.block_m, tiles.block_n, tiles.num_stages, element_bytes
    streamed, resident, operand = {"fwd": (2 * bn * head_dim, bm * head_dim, bm * bn),
                                   "dkdv": (2 * bm * head_dim, 2 * bn * head_dim, 2 * bn * bm),
                                   "dq": (2 * bn * head_dim, 2 * bm * head_dim, bm * bn)}[pass_name]
    return (stages * streamed + resident + operand) * e


def fits(pass_name: str, tiles: Tiles, head_dim: int, element_bytes: int,
         shared_limit: int = SM90_SHARED_BYTES) -> bool:
    """True when `tiles` neither spills (estimated) nor exceeds the shared memory of one block."""
    return (registers_per_thread(pass_name, tiles, head_dim) <= MAX_REGISTERS
            and shared_bytes(pass_name, tiles, head_dim, element_bytes) <= shared_limit)


def fitting(pass_name: str, candidates: tuple[Tiles, ...], head_dim: int, element_bytes: int,
            shared_limit: int = SM90_SHARED_BYTES) -> tuple[Tiles, ...]:
    """The candidates that fit, in their order; ValueError naming the pass when none does."""
    kept = tuple(t for t in candidates if fits(pass_name, t, head_dim, element_bytes, shared_limit))
    if not kept:
        raise ValueError(f"no {pass_name} tile of {[str(t) for t in candidates]} fits head dim {head_dim} "
                         f"at {element_bytes}-byte inputs (<= {MAX_REGISTERS} registers per thread, "
                         f"<= {shared_limit} bytes of shared memory)")
    return kept


def candidates(pass_name: str, head_dim: int, element_bytes: int) -> tuple[Tiles, ...]:
    """TILE_CANDIDATES of the pass that fit sm_90 at this head dim and input size, in preference order."""
    return fitting(pass_name, TILE_CANDIDATES[pass_name], head_dim, element_bytes)


def default_tiles(pass_name: str, head_dim: int, element_bytes: int) -> Tiles:
    """The tiles autotune=0 runs: the first candidate that fits."""
    return candidates(pass_name, head_dim, element_bytes)[0]
