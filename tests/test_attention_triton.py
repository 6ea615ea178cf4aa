"""The Triton GDPA kernel (forward and backward) against the reference spec.

On a CUDA machine the kernel tests run compiled, in this process. On CPU they run in the
Triton interpreter, which must be switched on (TRITON_INTERPRET=1) before the kernels are
decorated: `test_triton_in_the_interpreter` re-runs this file in a subprocess with it set.
The interpreter is slow, so shapes are tiny (tiles of 16 x 16 there). The work schedule and
the tile ranges are plain torch and are tested here directly.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from torch.utils.flop_counter import FlopCounterMode

from attention_cases import assert_matches, attention_case, make_inputs, reference_results, run
from gemref.attention import ACTIVATIONS, KERNELS
from gemref.attention.reference import allowed_mask
from gemref.attention.triton_gdpa import build_schedule, tile_range, visited_tiles

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = ["cpu"] if INTERPRETING else (["cuda"] if torch.cuda.is_available() else [])
on_devices = pytest.mark.parametrize("device", DEVICES or [pytest.param(
    "none", marks=pytest.mark.skip(reason="no CUDA: covered by test_triton_in_the_interpreter"))])


def test_triton_in_the_interpreter():
    """Run this file's kernel tests on CPU under TRITON_INTERPRET=1, in a fresh process."""
    if INTERPRETING:
        pytest.skip("this is the interpreter run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           __file__, "-k", "not in_the_interpreter"],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]


def _check(case: dict, device: str, dtype=torch.float32, head_dim: int = 16, rel: float = 2e-4) -> None:
    expected = reference_results(case, head_dim)
    actual = run("triton", case, *make_inputs(case, head_dim, dtype, device))
    assert actual[0].dtype == dtype
    assert_matches(actual, expected, rel, f"triton/{device}/{dtype} {case}")


@on_devices
@settings(max_examples=20, deadline=None)
@given(case=attention_case(max_batch=4))
def test_triton_matches_reference(device, case):
    _check(case, device)


@on_devices
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_triton_every_activation(device, activation):
    self_case = {"q_lens": [0, 1, 37, 16, 3], "kv_lens": [0, 1, 37, 16, 3], "cross": False,
                 "causal": True, "window": 20, "activation": activation, "heads": 2,
                 "qk_scale": None, "out_scale": 0.7, "seed": 1}
    _check(self_case, device)
    cross_case = {**self_case, "q_lens": [4, 4, 4], "kv_lens": [40, 0, 17], "cross": True,
                  "causal": False, "window": None}
    _check(cross_case, device)


@on_devices
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ["softmax", "silu"])
def test_triton_half_precision(device, dtype, activation):
    case = {"q_lens": [33, 0, 5], "kv_lens": [33, 0, 5], "cross": False, "causal": True, "window": None,
            "activation": activation, "heads": 2, "qk_scale": None, "out_scale": 1.0, "seed": 2}
    _check(case, device, dtype, rel=3e-2)


@on_devices
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_triton_head_dims(device, head_dim):
    case = {"q_lens": [20, 3], "kv_lens": [20, 3], "cross": False, "causal": False, "window": 7,
            "activation": "softmax" if head_dim == 64 else "gelu", "heads": 1, "qk_scale": None,
            "out_scale": 1.0, "seed": 3}
    _check(case, device, head_dim=head_dim)


@on_devices
def test_flop_counter_sees_triton_executed_flops(device):
    case = {"q_lens": [40, 0, 1, 17], "kv_lens": [40, 0, 1, 17], "cross": False, "causal": True,
            "window": 9, "activation": "silu", "heads": 2, "qk_scale": None, "out_scale": 1.0, "seed": 4}
    inputs = make_inputs(case, 16, torch.float32, device)
    with FlopCounterMode(display=False) as counter:
        run("triton", case, *inputs)
    lengths = torch.tensor(case["q_lens"], device=device)
    forward, backward = KERNELS["triton"].executed_flops(lengths, lengths, 2, 16, True, 9)
    assert counter.get_total_flops() == forward + backward > 0


@on_devices
def test_custom_op_registration(device):
    """Schema, fake (meta) implementation and autograd registration of the custom op."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(21, 2, 16, generator=gen).to(device).requires_grad_(True) for _ in range(3))
    offsets = torch.tensor([0, 17, 17, 21], device=device)
    torch.library.opcheck(torch.ops.gemref.gdpa_triton_fwd.default,
                          (q, k, v, offsets, offsets, "softmax", True, 0, 0.25, 1.0),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# ------------------------------------------------------- schedule and tile ranges (plain torch)
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 5), (False, 7)])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64)])
def test_visited_tiles_cover_every_allowed_pair(causal, window, block_m, block_n):
    """Brute force: every (query tile, key tile) holding an allowed pair lies in the range
    the kernel visits, in both directions (forward/dQ over keys, dK/dV over queries)."""
    q_lens = torch.tensor([0, 1, 16, 17, 70, 33])
    kv_lens = q_lens if causal else torch.tensor([5, 0, 16, 40, 70, 1])
    mask = allowed_mask(q_lens, kv_lens, 80, 80, causal=causal, window=window)
    for b in range(q_lens.numel()):
        for kind, outer, inner in (("keys", block_m, block_n), ("queries", block_n, block_m)):
            pairs = mask[b] if kind == "keys" else mask[b].T  # (outer positions, inner positions)
            for start in range(0, 80, outer):
                hit = pairs[start:start + outer].any(0).nonzero().flatten()
                t_lo, t_hi = tile_range(kind, torch.tensor([start]), q_lens[b:b + 1], kv_lens[b:b + 1],
                                        block_m, block_n, causal, window)
                if hit.numel():
                    first, last = int(hit[0]) // inner, int(hit[-1]) // inner
                    assert int(t_lo) <= first and last < int(t_hi), (kind, b, start, t_lo, t_hi, first, last)

def test_schedule_lists_every_tile_once_costliest_first():
    q_off = torch.tensor([0, 100, 100, 101, 140, 400])
    for kind, offsets in (("keys", q_off), ("queries", q_off)):
        sched = build_schedule(offsets, q_off, q_off, kind, 16, 32, True, None, int(q_off[-1]))
        block = 16 if kind == "keys" else 32
        lengths = (q_off[1:] - q_off[:-1]).tolist()
        expected = sorted((b, t) for b, L in enumerate(lengths) for t in range(-(-L // block)))
        real = sched[sched[:, 0] >= 0]
        assert sorted(map(tuple, real.tolist())) == expected
        assert (sched[len(real):, 0] == -1).all()
        starts = real[:, 1].long() * block
        lens = torch.tensor(lengths)[real[:, 0].long()]
        cost = visited_tiles(kind, starts, lens, lens, 16, 32, True, None)
        assert (cost[:-1] >= cost[1:]).all()
        if kind == "keys":  # causal: the last tile of the longest sequence is the costliest
            assert tuple(real[0].tolist()) == (4, 16)  # rows 256..259 of the 260-long one
