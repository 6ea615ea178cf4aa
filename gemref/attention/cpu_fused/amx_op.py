"""`cpu_fused_amx`: cpu_fused's pointwise GDPA in bf16 with its products on Intel AMX tiles.

A bf16 model (the precision switch's "bf16", autocast) hands attention bf16 q, k, v. cpu_fused
(op.py) widens them and multiplies in float32 FMAs; this kernel multiplies them as bf16 on the
AMX unit (TDPBF16PS: a 16 x 32 by 32 x 16 bf16 product into float32 per instruction), keeping
scores and activations in float32 and rounding the activations to bf16 where a product reads
them: FlashAttention's bf16 recipe (the loops: amx.cpp). Forward: query blocks of 16 rows,
key blocks of 32 covering the block's allowed keys; backward: key blocks of 16 rows, query
blocks of 32 covering the queries that attend them; the head dim is padded to a multiple of 32.
Executed matmul FLOPs per computed entry: forward 2 products, backward 5, each 2 * padded head
dim (`cpu_fused_amx_executed_flops` replays the geometry; the kernel returns what it computed).

kernel="auto" takes it for bf16 where the head dim is at least AUTO_MIN_HEAD_DIM: below that
half of every tile's reduction is padding, and at short histories the fixed cost of each tile
block (scores stored to memory for the activation, activations loaded back as a tile) outweighs
the products it saves. Measured on a Xeon with AMX (2026-12-05), one thread, causal silu,
forward+backward, against cpu_fused on the same bf16 inputs: 64 sequences of 40 events, head
dim 16: 0.63x; 4 x 512, head dim 16: 1.26x; 16 x 128, head dim 32: 1.27x; 4 x 512, head dim
64: 2.5x (a one-off timing of equal lengths; `gemref bench attention --dtype bfloat16 --kernels
cpu_fused cpu_fused_amx --causal --head-dim D` makes the same comparison on its length profiles).

Runs where the CPU has AMX-BF16, the compiler targets it (-march=native) and Linux grants the
process the tile state; otherwise the kernel is unavailable with that reason and kernel="auto"
takes cpu_fused. `emulated()` runs the same kernel on software tiles (amx.cpp SoftTiles, any
CPU, slow): the tests check its logic on CPUs without AMX. bf16 inputs only (a float32 or
float64 model runs cpu_fused); threads, strides, custom ops and autograd as cpu_fused's.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
from torch import Tensor

from ...env import cpu_info
from ..api import register_kernel
from ..jagged_op import JaggedGDPAOps
from .build import AMX_ENTRY_POINTS, library
from .op import ACT_IDS, MAX_HEAD_DIM, computed_entries, fused_unavailable, launch, rows_contiguous

GROUP, BLOCK, CHUNK = 16, 32, 32   # amx.cpp's TQ (tile rows), TK (keys / queries per block), DC (head-dim chunk)
assert MAX_HEAD_DIM == 4 * CHUNK        # the family's limit is amx.cpp's too (its dispatch refuses more)
AUTO_MIN_HEAD_DIM = 32             # kernel="auto" takes this kernel from this head dim on (module doc)

_emulate = threading.local()
_ready: dict[str, str | None] = {}


@contextlib.contextmanager
def emulated() -> Iterator[None]:
    """Within this context (this thread) the kernel runs on software tiles: any CPU, slowly."""
    before = getattr(_emulate, "on", False)
    _emulate.on = True
    try:
        yield
    finally:
        _emulate.on = before


def _entry() -> str:
    return AMX_ENTRY_POINTS["emulated" if getattr(_emulate, "on", False) else "hardware"]


def amx_unavailable() -> str | None:
    """Why the AMX entry point cannot run on this machine (None: it can). Asked once: an empty
    call makes the library request the tile state from Linux."""
    if "hardware" not in _ready:
        _ready["hardware"] = _probe()
    return _ready["hardware"]


def _probe() -> str | None:
    lib = library()
    if isinstance(lib, str):
        return lib
    cpu = cpu_info()
    if "amx_bf16" not in cpu.flags:
        return f"this CPU ({cpu.model_name}) has no AMX-BF16 unit"
    empty = torch.zeros(1, dtype=torch.int64)
    got = getattr(lib, AMX_ENTRY_POINTS["hardware"])(ACT_IDS["silu"], 0, *[None] * 8, empty.data_ptr(),
                                                     empty.data_ptr(), empty.data_ptr(), 0, 1, 16, 1, 0, 1.0, 1.0,
                                                     0, 0, 0, 0)
    if got == -2:
        return ("the kernel library was built without AMX (its compiler did not target AMX-BF16) or Linux "
                "refused the process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    return None


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernel computes with: the next multiple of CHUNK (one A tile's width)."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {head_dim} outside 1..{MAX_HEAD_DIM}")
    return -(-head_dim // CHUNK) * CHUNK


def cpu_fused_amx_executed_flops(q_lengths: Tensor, kv_lengths: Tensor, heads: int, head_dim: int,
                                 causal: bool, window: int | None) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs the kernel runs: 2 and 5 products of 2 * padded head
    dim FLOPs per computed entry."""
    per_entry = 2 * padded_head_dim(head_dim) * heads
    fwd = computed_entries(q_lengths, kv_lengths, causal, window, GROUP, BLOCK)
    bwd = computed_entries(q_lengths, kv_lengths, causal, window, GROUP, BLOCK, by_keys=True)
    return 2 * per_entry * fwd, 5 * per_entry * bwd


def _input(x: Tensor) -> Tensor:
    """x as the kernel reads it: bf16 (asserted: _unavailable admits nothing else), (H, D) rows contiguous."""
    assert x.dtype == torch.bfloat16, x.dtype
    return x if rows_contiguous(x) else x.contiguous()


def _fwd_body(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, activation: str,
              causal: bool, window: int, qk_scale: float, out_scale: float) -> Tensor:
    q_, k_, v_ = (_input(x) for x in (q, k, v))
    out = torch.empty(q_.shape, dtype=q_.dtype)
    launch(_entry(), activation, None, q_, k_, v_, out, q_offsets, kv_offsets, causal, window, qk_scale, out_scale)
    return out


def _bwd_body(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
              activation: str, causal: bool, window: int, qk_scale: float,
              out_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    go, q_, k_, v_ = (_input(x) for x in (grad_out, q, k, v))
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (q_, k_, v_))
    launch(_entry(), activation, (go, dq, dk, dv), q_, k_, v_, None, q_offsets, kv_offsets, causal, window,
           qk_scale, out_scale)
    return dq, dk, dv


OPS = JaggedGDPAOps("cpu_fused_amx", _fwd_body, _bwd_body)
OPS.count_flops(cpu_fused_amx_executed_flops)


def _unavailable(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if q.device.type == "cpu" and q.dtype != torch.bfloat16:
        return f"AMX-BF16 multiplies bf16: q is {q.dtype} (a float32 model runs cpu_fused)"
    reason = fused_unavailable("cpu_fused_amx", q, activation)
    return reason if reason is not None or getattr(_emulate, "on", False) else amx_unavailable()


def _auto_skip(q: Tensor, activation: str, causal: bool, window: int | None) -> str | None:
    if q.shape[-1] < AUTO_MIN_HEAD_DIM:
        return (f"head dim {q.shape[-1]} < {AUTO_MIN_HEAD_DIM}: half or more of each tile's reduction is padding, "
                "and cpu_fused measured faster there")
    return None


register_kernel("cpu_fused_amx", OPS, _unavailable, cpu_fused_amx_executed_flops, _auto_skip)
