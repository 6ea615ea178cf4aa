"""cpu_fused_amx (bf16 products on AMX tiles) against the float64 reference, forward and
backward, on hypothesis-drawn jagged batches with skewed lengths; what it computes and counts;
when it runs and when kernel="auto" takes it.

Every property runs the kernel's logic on software tiles (amx.cpp SoftTiles: any CPU), and on
the AMX unit itself where this machine has one (skipped elsewhere, with the reason)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from gemref.attention import KERNELS, gdpa, resolve_kernel
from gemref.attention.cpu_fused import amx_op
from gemref.attention.cpu_fused.build import AMX_ENTRY_POINTS
from gemref.attention.cpu_fused.op import computed_entries, launch
from gemref.attention.testing import (CPU_KERNEL_EXAMPLES, assert_matches, attention_case, kernel_settings,
                                      make_inputs, reference_results, run)
from gemref.env import CpuInfo

HARDWARE = amx_op.amx_unavailable()
needs_amx = pytest.mark.skipif(HARDWARE is not None, reason=f"no AMX here: {HARDWARE}")
# bf16 results against the float64 oracle on the same bf16-rounded inputs: the kernel rounds
# the activations (A, dS) to bf16 before the products that read them, as FlashAttention's bf16
# recipe does, so an entry is off by up to ~2^-8 of the sum of its terms' magnitudes, which
# exceeds 2^-7 of the entry where terms cancel: allowed 2^-7 of the entry plus 2^-6 of the
# case's scale, and never less than twice the plain reference kernel's error in bf16 (the
# FlashAttention rule). A wrong mask or block moves entries by the scale itself.
REL, ATOL = 2 ** -7, 2 ** -6
CASES = dict(long_len=120, head_dims=(8, 16, 24, 32, 48, 64, 96, 128), logit_scales=(1.0, 3.0))


def _pointwise(case: dict) -> dict:
    return {**case, "activation": "silu"} if case["activation"] == "softmax" else case


def check_bf16(case: dict) -> None:
    case = _pointwise(case)
    D = case["head_dim"]
    expected = reference_results(case, D, round_to=torch.bfloat16)
    actual = run("cpu_fused_amx", case, *make_inputs(case, D, torch.bfloat16, "cpu"))
    assert all(x.dtype == torch.bfloat16 for x in actual)
    baseline = run("reference", case, *make_inputs(case, D, torch.bfloat16, "cpu", round_to=torch.bfloat16))
    assert_matches(actual, expected, REL, f"cpu_fused_amx {case}", atol=ATOL, baseline=baseline,
                   dtype=torch.bfloat16)


@kernel_settings(ci=40)
@given(case=attention_case(**CASES))
def test_software_tiles_match_the_rounded_reference(case):
    with amx_op.emulated():
        check_bf16(case)


@needs_amx
@kernel_settings(at_least=CPU_KERNEL_EXAMPLES // 4)
@given(case=attention_case(**{**CASES, "long_len": 300}))
def test_the_amx_unit_matches_the_rounded_reference(case):
    check_bf16(case)


@needs_amx
@kernel_settings(ci=20)
@given(case=attention_case(**CASES))
def test_the_amx_unit_and_the_software_tiles_agree(case):
    """The same loops on both: equal up to the last bits of a few outputs (the unit rounds the
    sum of a pair of products its own way; the emulation adds them one at a time): within one
    bf16 ulp of each tensor's scale (2^-8 of its largest entry) plus 2^-7 of the entry."""
    case = _pointwise(case)
    inputs = make_inputs(case, case["head_dim"], torch.bfloat16, "cpu")
    hardware = run("cpu_fused_amx", case, *inputs)
    with amx_op.emulated():
        software = run("cpu_fused_amx", case, *inputs)
    for h, s in zip(hardware, software):
        scale = float(s.abs().max()) if s.numel() else 0.0
        torch.testing.assert_close(h.float(), s.float(), rtol=2 ** -7, atol=2 ** -8 * scale + 1e-30)


def _entries_run(q_lens, kv_lens, causal, window, heads=2, D=16):
    """The score entries the C++ loops report for one forward and one backward call."""
    case = {"q_lens": q_lens, "kv_lens": kv_lens, "cross": True, "seed": 0, "heads": heads}
    (q, k, v), grad, q_off, kv_off = make_inputs(case, D, torch.bfloat16, "cpu")
    q, k, v = q.detach(), k.detach(), v.detach()
    args = (q_off, kv_off, causal, window or 0, 0.3, 1.0)
    entry = AMX_ENTRY_POINTS["hardware" if HARDWARE is None else "emulated"]
    forward = launch(entry, "silu", None, q, k, v, torch.empty_like(q), *args)
    grads = (grad, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    return forward, launch(entry, "silu", grads, q, k, v, None, *args)


@kernel_settings(ci=60)
@given(data=st.data(), causal=st.booleans(), window=st.one_of(st.none(), st.integers(1, 40)))
def test_the_formula_counts_what_the_kernel_computes(data, causal, window):
    """computed_entries (forward: rows are queries; backward: rows are keys) against the count
    the C++ loops return, on skewed lengths with empty sequences, self and cross attention."""
    lengths = st.lists(st.one_of(st.integers(0, 5), st.integers(0, 90)), min_size=1, max_size=5)
    q_lens = data.draw(lengths)
    kv_lens = q_lens if causal or data.draw(st.booleans()) else data.draw(
        st.lists(st.integers(0, 90), min_size=len(q_lens), max_size=len(q_lens)))
    q, kv = torch.tensor(q_lens), torch.tensor(kv_lens)
    expected = (2 * computed_entries(q, kv, causal, window, 16, 32),
                2 * computed_entries(q, kv, causal, window, 16, 32, by_keys=True))
    assert _entries_run(q_lens, kv_lens, causal, window) == expected


def test_computed_entries_by_hand():
    """Causal L = 40, one head. Forward: query blocks of 16 over 32-key blocks (512 entries):
    rows 0-15 and 16-31 reach keys 15 and 31 (one block each), rows 32-39 key 39 (two): 4.
    Backward: key blocks of 16 over 32-query blocks: keys 0-15 are attended by queries 0-39
    (two blocks), keys 16-31 by 16-39 (blocks at 0 and 32: two), keys 32-39 by 32-39 (one): 5."""
    n = computed_entries
    forty = torch.tensor([40])
    assert n(forty, forty, True, None, 16, 32) == 4 * 512
    assert n(forty, forty, True, None, 16, 32, by_keys=True) == 5 * 512
    # cross attention, 10 queries over 40 keys: forward one query block, two key blocks;
    # backward three key blocks, each over the one 32-query block
    assert n(torch.tensor([10]), forty, False, None, 16, 32) == 2 * 512
    assert n(torch.tensor([10]), forty, False, None, 16, 32, by_keys=True) == 3 * 512
    # causal window 4, L = 40, backward: keys 0-15 by queries 0-18 (one block), 16-31 by 16-34
    # (blocks 0 and 32), 32-39 by 32-42 -> 32-39 (one): 4
    assert n(forty, forty, True, 4, 16, 32, by_keys=True) == 4 * 512
    assert n(torch.tensor([0, 7]), torch.tensor([9, 0]), False, None, 16, 32, by_keys=True) == 0


def test_flop_counter_prices_the_op_by_its_entries():
    """FlopCounterMode on gdpa(kernel="cpu_fused_amx"): forward 2 products, backward 5, each
    2 x padded head dim per entry. H = 2, D = 24 (padded to 32); causal L = 5: forward one
    query block over one key block, 512 entries a head: 2 * 2 * 32 * 2 * 512 = 131,072;
    backward one key block over one query block: 5 * 2 * 32 * 2 * 512 = 327,680."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 2, 24, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    with amx_op.emulated(), FlopCounterMode(display=False) as fwd:
        out = gdpa(q, k, v, torch.tensor([0, 5]), activation="silu", causal=True, kernel="cpu_fused_amx")
    with amx_op.emulated(), FlopCounterMode(display=False) as bwd:
        out.float().sum().backward()
    assert (fwd.get_total_flops(), bwd.get_total_flops()) == (131_072, 327_680)
    assert KERNELS["cpu_fused_amx"].executed_flops(torch.tensor([5]), torch.tensor([5]), 2, 24, True, None) == (
        131_072, 327_680)


def test_refuses_other_dtypes_softmax_wide_heads_and_other_devices():
    reason = KERNELS["cpu_fused_amx"].unavailable
    bf16 = torch.zeros(1, 1, 32, dtype=torch.bfloat16)
    assert "multiplies bf16: q is torch.float32" in reason(torch.zeros(1, 1, 32), "silu", False, None)
    assert "pointwise activations only" in reason(bf16, "softmax", False, None)
    assert "head dim 256 > 128" in reason(torch.zeros(1, 1, 256, dtype=torch.bfloat16), "silu", False, None)
    assert "CPU kernel" in reason(torch.zeros(1, 1, 8, device="meta", dtype=torch.bfloat16), "silu", False, None)
    with pytest.raises(ValueError, match="head dim 129 outside 1..128"):
        amx_op.padded_head_dim(129)


def test_auto_takes_it_for_bf16_from_head_dim_32_where_the_unit_exists():
    """kernel="auto": bf16 at head dim >= 32 on an AMX CPU; below that (measured slower there,
    amx_op's doc) and on other CPUs cpu_fused; float32 never (it multiplies bf16 only)."""
    wide, narrow = (torch.zeros(1, 1, d, dtype=torch.bfloat16) for d in (64, 16))
    assert resolve_kernel("auto", wide, "silu", True, None) == ("cpu_fused_amx" if HARDWARE is None else "cpu_fused")
    assert resolve_kernel("auto", narrow, "silu", True, None) == "cpu_fused"
    assert resolve_kernel("auto", torch.zeros(1, 1, 64), "silu", True, None) == "cpu_fused"
    assert "head dim 16 < 32" in KERNELS["cpu_fused_amx"].auto_skip(narrow, "silu", True, None)
    if HARDWARE is None:      # asked for by name, it runs where auto would not take it
        assert resolve_kernel("cpu_fused_amx", narrow, "silu", True, None) == "cpu_fused_amx"


def test_a_cpu_without_the_unit_says_so(monkeypatch):
    info = CpuInfo(vendor="AuthenticAMD", family=25, model=17, stepping=1, model_name="AMD EPYC 9R14",
                   flags=("avx512f", "avx512_bf16"), cores=2)
    monkeypatch.setattr(amx_op, "cpu_info", lambda: info)
    monkeypatch.setattr(amx_op, "_ready", {})
    assert amx_op.amx_unavailable() == "this CPU (AMD EPYC 9R14) has no AMX-BF16 unit"
    assert resolve_kernel("auto", torch.zeros(1, 1, 64, dtype=torch.bfloat16), "silu", True, None) == "cpu_fused"
