"""The fast GDPA kernels (sdpa, cpu_jagged, cpu_fused, flash_attn) against the reference spec.

Forward and dq, dk, dv, on hypothesis-drawn jagged batches with skewed lengths (empty and
length-1 sequences included), causal or not, windowed or not, every activation, self and
cross attention, logits up to x30, head dims 8..128. CPU kernels are compared in float64
(and bf16) with at least CPU_KERNEL_EXAMPLES drawn cases per property in every hypothesis
profile (tests/conftest.py); on a CUDA machine the kernels available there run in their
most precise dtype (scripts/gpu_check.sh). The Triton kernel has its own file
(tests/test_attention_triton.py).
"""
from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import example, given
from torch.utils.flop_counter import FlopCounterMode

from gemref.attention import testing
from gemref.attention.testing import (CPU_KERNEL_EXAMPLES, HEAD_DIMS, LOGIT_SCALES, TILE_LIMITS, assert_matches,
                             attention_case, case_scale, counted, error_floor, kernel_settings, make_inputs,
                             reference_results, run, tile_limits)
from gemref.attention import ACTIVATIONS, KERNELS, gdpa, resolve_kernel
from gemref.attention import api
from gemref.mfu.memory import track_peak_memory

CPU_KERNELS = ["sdpa", "cpu_jagged", "cpu_fused"]
# The CPU properties draw wide cases: lengths to 300, head dims 8..128,
# logits scaled up to x30, tiles small enough to cut every length into pieces.
WIDE = dict(long_len=300, head_dims=HEAD_DIMS, logit_scales=LOGIT_SCALES, tile_limits=TILE_LIMITS)
# bf16 results, element-wise against the float64 oracle on the same bf16-rounded inputs:
# one bf16 rounding (2^-8 relative; 2^-7 allowed) plus an absolute allowance per tensor,
# the largest of a fraction of the case's scale, the absolute floor of the precision the
# kernel computes in (BF16_BASELINE_DTYPE; gemref.attention.testing.error_floor: the case's
# scale can be 0) and twice the error of the plain reference kernel run in that precision
# (the FlashAttention rule "no worse than twice the naive kernel"). The baseline covers what no
# fixed fraction can: float32 gelu is exactly 0 below s ~ -5.7 (1 + erf cancels), so a case
# whose every result is tiny is off by ~100% of its scale in any float32 kernel.
# cpu_jagged computes in float32 (fraction: <= 1.2e-6 of the scale seen in 300 cases at
# logits x30). torch's CPU flash kernel (sdpa) rounds P to bf16 and takes delta = dO . O
# from the rounded output; at logits x10-x30 its dk is off by up to half the scale, worse
# than the bf16 reference, a property of torch's kernel that the float64 property (which
# checks the sdpa wiring tightly) does not share: its bf16 check draws logits up to x3.
BF16_REL = 2 ** -7
BF16_ATOL = {"cpu_jagged": 2e-5, "cpu_fused": 2e-5, "sdpa": 1e-1}
BF16_BASELINE_DTYPE = {"cpu_jagged": torch.float32, "cpu_fused": torch.float32, "sdpa": torch.bfloat16}
BF16_WIDE = {"cpu_jagged": WIDE, "cpu_fused": WIDE, "sdpa": {**WIDE, "logit_scales": tuple(x for x in LOGIT_SCALES if x <= 3)}}
# Known-hard cases, run as explicit examples by every profile (ci's derandomized draws never
# met them; `make test-kernels`' fresh draws did): one query over one key, gelu at logits x10,
# its score far in gelu's negative tail, so the oracle's four tensors are 0 or ~1e-70 (the
# case's scale S ~ 0). The first: cpu_fused's float32 gelu gives a subnormal 1.7e-39 (its exp
# clamps at e^-87) where the oracle gives 0, against a bound of 3.6e-73 derived from S alone;
# the second: cpu_fused gives -3.8e-17 where the float64 oracle's own gelu has cancelled to -0.
GELU_TAIL_CASES = [
    {"q_lens": [1], "kv_lens": [1], "cross": False, "causal": False, "window": None, "activation": "gelu",
     "heads": 1, "qk_scale": None, "out_scale": 1.0, "seed": 2094, "head_dim": 16, "logit_scale": 10.0,
     "tile_limit": None},
    {"q_lens": [1], "kv_lens": [1], "cross": False, "causal": False, "window": None, "activation": "gelu",
     "heads": 1, "qk_scale": None, "out_scale": 1.0, "seed": 2, "head_dim": 8, "logit_scale": 10.0,
     "tile_limit": None},
]


def precise(kernel: str, device: str) -> tuple[torch.dtype, float]:
    """The most precise dtype a kernel takes on a device, and the relative tolerance there."""
    if device == "cpu":
        return torch.float64, 1e-12
    if kernel in ("sdpa", "flash_attn"):
        return torch.bfloat16, 3e-2
    return torch.float32, 1e-3


def kernels_on(device: str) -> list[str]:
    probe = torch.zeros(1, 1, 16, device=device, dtype=precise("sdpa", device)[0])
    return [k for k in ("sdpa", "cpu_jagged", "flash_attn")
            if KERNELS[k].unavailable(probe, "softmax", False, None) is None]


def for_kernel(kernel: str, case: dict) -> dict:
    """The case with an activation the kernel runs: softmax-only kernels get softmax;
    cpu_fused (pointwise only) gets silu where the case drew softmax."""
    if kernel in ("sdpa", "flash_attn"):
        return {**case, "activation": "softmax"}
    if kernel == "cpu_fused" and case["activation"] == "softmax":
        return {**case, "activation": "silu"}
    return case


def check(kernel: str, case: dict, device: str, head_dim: int | None = None) -> None:
    """The kernel in its most precise dtype against the float64 oracle, element-wise
    (float64: 1e-12 of the entry plus 1e-12 of the case's scale, never below the absolute
    floor of the dtype, gemref.attention.testing.error_floor)."""
    case = for_kernel(kernel, case)
    head_dim = head_dim or case.get("head_dim", 8)
    dtype, rel = precise(kernel, device)
    expected = reference_results(case, head_dim)
    with tile_limits(case.get("tile_limit")):
        actual = run(kernel, case, *make_inputs(case, head_dim, dtype, device))
    assert_matches(actual, expected, rel, f"{kernel}/{device} {case}", atol=rel, dtype=dtype)


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@kernel_settings(at_least=CPU_KERNEL_EXAMPLES)
@given(case=attention_case(**WIDE))
@example(case=GELU_TAIL_CASES[0])
@example(case=GELU_TAIL_CASES[1])
@counted
def test_cpu_kernel_matches_reference(kernel, case):
    check(kernel, case, "cpu")


def bfloat16_check(kernel: str, case: dict) -> None:
    """bf16 inputs, computed in float32 inside, bf16 results, against the float64 oracle on
    the same bf16-rounded inputs (tolerances: BF16_* above)."""
    case = for_kernel(kernel, case)
    D = case["head_dim"]
    expected = reference_results(case, D, round_to=torch.bfloat16)
    with tile_limits(case["tile_limit"]):
        actual = run(kernel, case, *make_inputs(case, D, torch.bfloat16, "cpu"))
    assert all(x.dtype == torch.bfloat16 for x in actual)
    baseline = run("reference", case, *make_inputs(case, D, BF16_BASELINE_DTYPE[kernel], "cpu",
                                                   round_to=torch.bfloat16))
    assert_matches(actual, expected, BF16_REL, f"{kernel} bf16 {case}", atol=BF16_ATOL[kernel],
                   baseline=baseline, dtype=BF16_BASELINE_DTYPE[kernel])


@kernel_settings(at_least=CPU_KERNEL_EXAMPLES // 4)
@given(case=attention_case(**BF16_WIDE["cpu_jagged"]))
@example(case=GELU_TAIL_CASES[0])
@example(case=GELU_TAIL_CASES[1])
@counted
def test_cpu_jagged_bfloat16_matches_rounded_reference(case):
    bfloat16_check("cpu_jagged", case)


@kernel_settings(at_least=CPU_KERNEL_EXAMPLES // 4)
@given(case=attention_case(**BF16_WIDE["cpu_fused"]))
@example(case=GELU_TAIL_CASES[0])
@example(case=GELU_TAIL_CASES[1])
@counted
def test_cpu_fused_bfloat16_matches_rounded_reference(case):
    """bf16 in, float32 inside: cpu_fused's vectorised float32 path (its float64 path is the
    one test_cpu_kernel_matches_reference checks at 1e-12)."""
    bfloat16_check("cpu_fused", case)


@kernel_settings(at_least=CPU_KERNEL_EXAMPLES // 4)
@given(case=attention_case(**BF16_WIDE["sdpa"]))
@counted
def test_sdpa_bfloat16_matches_rounded_reference(case):
    bfloat16_check("sdpa", case)


def test_gelu_tail_case_fails_the_old_bound_and_passes_with_the_floor(monkeypatch):
    """The `make test-kernels` failure: bf16 cpu_fused, one query, one key, gelu at logits x10.
    The kernel's result is a float32 subnormal, the oracle's 0, the case's scale ~1e-70: the
    old bound (rel * |e| + atol * S, no floor) fails the kernel on ~1e-39, the floored one
    passes it (gemref.attention.testing.error_floor)."""
    case = GELU_TAIL_CASES[0]
    expected = reference_results(case, case["head_dim"], round_to=torch.bfloat16)
    assert case_scale(expected) < 1e-60
    out = run("cpu_fused", case, *make_inputs(case, case["head_dim"], torch.bfloat16, "cpu"))[0]
    tiny = torch.finfo(torch.float32).tiny   # float32's (and bf16's) smallest normal
    assert 0 < abs(float(out[0, 0, 0])) < tiny and float(out.abs().max()) < 4 * tiny   # underflow, not 0
    monkeypatch.setattr(testing, "error_floor", lambda dtype, expected: 0.0)   # the old bound
    with pytest.raises(AssertionError, match=r"out\[0, 0, 0\] = .*e-39, expected 0 .*> bound .*e-73"):
        bfloat16_check("cpu_fused", case)
    monkeypatch.undo()
    bfloat16_check("cpu_fused", case)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_error_floor_is_positive_for_an_all_zero_reference(dtype):
    """An all-zero (or empty) oracle still gets FLOOR_ULPS unit roundoffs of the unit scale,
    and at least the dtype's smallest normal per summed term (300 rows here); a zero result
    passes it, an error of twice the floor does not."""
    zeros = [torch.zeros(300, 2, 8, dtype=torch.float64) for _ in range(4)]
    floor = error_floor(dtype, zeros)
    assert floor >= testing.FLOOR_ULPS * torch.finfo(dtype).eps / 2 > 0
    assert floor >= 300 * torch.finfo(dtype).tiny   # 300 terms, each underflowing
    assert error_floor(dtype, [torch.zeros(0, 2, 8, dtype=torch.float64)] * 4) > 0
    assert_matches([z.to(dtype) for z in zeros], zeros, 1e-12, "zeros", atol=1e-12, dtype=dtype)
    assert_matches([z.to(dtype) + floor / 2 for z in zeros], zeros, 1e-12, "half the floor", atol=1e-12, dtype=dtype)
    with pytest.raises(AssertionError, match="bound"):
        assert_matches([z.to(dtype) + 2 * floor for z in zeros], zeros, 1e-12, "twice the floor", atol=1e-12,
                       dtype=dtype)


def test_the_floor_never_loosens_a_unit_size_case():
    """For a case of scale S >= 1 the floor (FLOOR_ULPS u(dtype) S) stays below each check's own
    atol * S, so it only decides where S < 1: float64 (atol 1e-12), the bf16 properties'
    float32 (cpu_jagged, cpu_fused) and bf16 (sdpa) computations."""
    assert error_floor(torch.float64, [torch.ones(1)]) < 1e-12
    for kernel, atol in BF16_ATOL.items():
        assert error_floor(BF16_BASELINE_DTYPE[kernel], [torch.ones(1)]) < atol, kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@kernel_settings()
@given(case=attention_case())
@counted
def test_cuda_kernels_match_reference(case):
    for kernel in kernels_on("cuda"):
        dtype, rel = precise(kernel, "cuda")
        case_k = {**case, "activation": "softmax"} if kernel in ("sdpa", "flash_attn") else case
        actual = run(kernel, case_k, *make_inputs(case_k, 8, dtype, "cuda"))
        assert_matches(actual, reference_results(case_k, 8), rel, f"{kernel}/cuda {case_k}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 3), (True, 5)])
def test_cpu_jagged_every_activation_and_mask(activation, causal, window):
    case = {"q_lens": [0, 1, 7, 33, 2], "kv_lens": [0, 1, 7, 33, 2], "cross": False, "causal": causal,
            "window": window, "activation": activation, "heads": 2, "qk_scale": None,
            "out_scale": 0.7, "seed": 3}
    check("cpu_jagged", case, "cpu")
    check("sdpa" if activation == "softmax" else "cpu_fused", case, "cpu")


@pytest.mark.parametrize("window", [None, 2, 6])
@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_cross_attention_few_queries_over_long_history(kernel, window):
    """4 non-sequence queries per sample over that sample's history (empty history included)."""
    case = {"q_lens": [4, 4, 4, 4], "kv_lens": [50, 0, 1, 17], "cross": True, "causal": False,
            "window": window, "activation": "silu", "heads": 2, "qk_scale": None,
            "out_scale": 1.0, "seed": 5}
    check(kernel, case, "cpu")


def test_many_buckets_and_chunks(monkeypatch):
    """Force one bucket per sequence, 1-row leaves and chunks: the plans' edges are exercised."""
    from gemref.attention import bucketing, sdpa
    from gemref.attention.cpu_jagged import op as cpu_jagged, plan as cpu_jagged_plan

    monkeypatch.setattr(bucketing, "MAX_WASTE", 0.0)
    monkeypatch.setattr(bucketing, "MIN_SLACK_ENTRIES", 0)
    monkeypatch.setattr(bucketing, "MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(cpu_jagged_plan, "LEAF_MIN", 1)
    monkeypatch.setattr(cpu_jagged, "CHUNK_ENTRIES", 64)
    monkeypatch.setattr(sdpa, "WINDOW_CHUNK_ENTRIES", 64)
    for activation, causal, window in [("softmax", True, None), ("gelu", False, 4), ("softmax", False, 3),
                                       ("silu", True, None)]:
        case = {"q_lens": [9, 0, 1, 13, 2, 13], "kv_lens": [9, 0, 1, 13, 2, 13], "cross": False,
                "causal": causal, "window": window, "activation": activation, "heads": 2,
                "qk_scale": 0.4, "out_scale": 1.3, "seed": 7}
        check("cpu_jagged", case, "cpu")
        check("sdpa", case, "cpu")


# ------------------------------------------------------------------------------ FLOP counts
FLOP_CASES = [  # (q lengths, kv lengths, causal, window)
    ([900, 3, 0, 1, 200], None, True, None),
    ([900, 3, 0, 1, 200], None, False, None),
    ([300, 5, 40], None, True, 37),
    ([300, 5, 40], None, False, 20),
    ([4, 4, 4], [700, 0, 33], False, None),
    ([4, 4, 4], [700, 0, 33], False, 3),
]


@pytest.mark.parametrize("q_lens,kv_lens,causal", [  # (length 1 einsums run as a multiply, not a matmul)
    ([900, 3, 0, 2, 200], None, True), ([900, 3, 0, 2, 200], None, False), ([64, 17], None, True),
    ([4, 4, 4], [700, 0, 33], False)])
def test_model_flops_match_the_reference_counted_per_sequence(q_lens, kv_lens, causal):
    """The MFU numerator against an oracle that shares no code with it: FlopCounterMode on
    the materialising reference, one sequence at a time (B = 1: no padding), forward and
    backward. The reference computes the full Lq x Lk square: 2 matmuls x 2*H*D*Lq*Lk. The
    model counts causal attention exactly, L(L+1)/2 allowed pairs (docs/design.md), i.e.
    (counted square + 2 matmuls x 2*H*D*L diagonal entries) / 2; backward is 2x forward."""
    from gemref.attention import attention_model_flops, gdpa_reference

    H, D = 2, 8
    kv_lens = kv_lens or q_lens
    forward = backward = expected = 0
    for lq, lk in zip(q_lens, kv_lens):
        if lq and lk:
            q = torch.randn(lq, H, D, requires_grad=True)
            k, v = torch.randn(lk, H, D, requires_grad=True), torch.randn(lk, H, D, requires_grad=True)
            with FlopCounterMode(display=False) as fwd:
                out = gdpa_reference(q, k, v, torch.tensor([0, lq]), torch.tensor([0, lk]), activation="softmax",
                                     causal=causal)
            with FlopCounterMode(display=False) as bwd:
                out.sum().backward()
            square = fwd.get_total_flops()
            forward, backward = forward + square, backward + bwd.get_total_flops()
            expected += (square + 2 * 2 * H * D * lq) // 2 if causal else square
    model = attention_model_flops(q_lens, kv_lens, H, D, causal, None)
    assert model == expected
    assert backward == 2 * forward   # dP, dV, dQ, dK


@pytest.mark.parametrize("q_lens,kv_lens,causal,window", FLOP_CASES)
def test_sdpa_flop_counter_sees_executed_flops(q_lens, kv_lens, causal, window):
    """The wiring: FlopCounterMode prices the CPU flash calls sdpa really launches (its buckets
    and chunks) with the formula gemref registers for that op (torch has none), and
    sdpa_executed_flops prices the plan with the same formula, so this checks that the calls
    are the plan, not the formula: test_cpu_flash_formula_by_hand does that."""
    H, D = 2, 8
    cross = kv_lens is not None
    kv_lens = kv_lens or q_lens
    case = {"q_lens": q_lens, "kv_lens": kv_lens, "cross": cross, "causal": causal, "window": window,
            "activation": "softmax", "heads": H, "qk_scale": None, "out_scale": 1.0, "seed": 0}
    inputs = make_inputs(case, D, torch.float32, "cpu")
    with FlopCounterMode(display=False) as counter:
        run("sdpa", case, *inputs)
    forward, backward = KERNELS["sdpa"].executed_flops(torch.tensor(q_lens), torch.tensor(kv_lens), H, D,
                                                       causal, window)
    counted = counter.get_total_flops()
    assert counted > 0
    assert abs(counted - (forward + backward)) <= 0.02 * counted, (counted, forward, backward)


def test_cpu_flash_formula_by_hand():
    """torch's CPU flash kernel visits 32/64/256-row query blocks (L < 192 / < 768 / longer)
    over 512-key blocks, skipping key blocks past a causal block's last row. H=1, D=1, so
    FLOPs = matmuls x 2 x (score entries visited)."""
    from gemref.attention.sdpa import cpu_flash_matmul_flops

    # Full attention, 100 x 100: 10,000 entries; forward 2 matmuls: 2 x 2 x 10,000
    assert cpu_flash_matmul_flops(1, 1, 100, 100, 1, False, 2) == 40_000
    # Causal 100 x 100: one key block (100 < 512) for every query block: still 10,000
    assert cpu_flash_matmul_flops(1, 1, 100, 100, 1, True, 2) == 40_000
    # Causal 1000 x 1000, 256-row blocks: rows 0-255 and 256-511 see keys 0-511 (256 x 512 each);
    # rows 512-767 see 0-511 and 512-999 (256 x 512 + 256 x 488); rows 768-999 the same (232 x
    # (512 + 488)): 131,072 x 3 + 124,928 + 232,000 = 750,144 entries; backward 5 matmuls
    assert cpu_flash_matmul_flops(1, 1, 1000, 1000, 1, True, 5) == 5 * 2 * 750_144
    # batch 3, 2 heads, head dim 8 multiply it: causal 200 x 200 (64-row blocks, one key block)
    assert cpu_flash_matmul_flops(3, 2, 200, 200, 8, True, 2) == 2 * 2 * 3 * 2 * 8 * 40_000


@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("q_lens,kv_lens,causal,window", FLOP_CASES)
def test_cpu_jagged_flop_formula_is_what_its_matmuls_run(q_lens, kv_lens, causal, window, activation):
    """FlopCounterMode prices the opaque cpu_jagged ops by the plan's formula; here torch's
    own bmm formulas count the matmuls the bodies really run (called directly, outside the
    op), forward and backward apart, for the tree (silu causal) and row (softmax) plans."""
    from gemref.attention.cpu_jagged import op as cpu_jagged
    H, D = 2, 8
    kv_lens = kv_lens or q_lens
    case = {"q_lens": q_lens, "kv_lens": kv_lens, "cross": True, "seed": 0, "heads": H}
    (q, k, v), grad, q_off, kv_off = make_inputs(case, D, torch.float32, "cpu")
    args = (q_off, kv_off, activation, causal, window or 0, 0.3, 1.0)
    with FlopCounterMode(display=False) as forward:
        cpu_jagged._fwd_body(q.detach(), k.detach(), v.detach(), *args)
    with FlopCounterMode(display=False) as backward:
        cpu_jagged._bwd_body(grad, q.detach(), k.detach(), v.detach(), *args)
    expected = KERNELS["cpu_jagged"].executed_flops(torch.tensor(q_lens), torch.tensor(kv_lens), H, D, causal, window)
    assert (forward.get_total_flops(), backward.get_total_flops()) == expected


@pytest.mark.parametrize("op,activation,causal,window", [("cpu_jagged", "softmax", True, 0),
                                                        ("cpu_jagged", "silu", False, 3),
                                                        ("cpu_fused", "silu", True, 0),
                                                        ("cpu_fused", "gelu", False, 3)])
def test_cpu_custom_op_registration(op, activation, causal, window):
    """Schema, fake (meta) implementation and autograd registration of the custom op."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(21, 2, 8, generator=gen, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    offsets = torch.tensor([0, 17, 17, 21])
    torch.library.opcheck(getattr(torch.ops.gemref, f"{op}_fwd").default,
                          (q, k, v, offsets, offsets, activation, causal, window, 0.25, 1.5))


@pytest.mark.parametrize("op", ["cpu_jagged", "cpu_fused"])
def test_cpu_op_compiles_as_one_op_without_graph_breaks(op):
    """torch.compile traces around the op (fake implementation, no graph break), forward and
    backward, and gives the eager numbers on batches of other lengths without recompiling."""
    fwd = getattr(torch.ops.gemref, f"{op}_fwd")

    def attention(q, k, v, offsets):
        return fwd(q, k, v, offsets, offsets, "gelu", True, 0, 0.3, 1.0).square().sum()

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(attention, backend=backend, fullgraph=True, dynamic=True)
    for i, lens in enumerate(([5, 0, 40, 9], [3, 17, 1], [64, 2, 2, 30, 7])):
        case = {"q_lens": lens, "cross": False, "seed": i, "heads": 2}
        leaves, _, offsets, _ = make_inputs(case, 8, torch.float64, "cpu")
        eager = [attention(*leaves, offsets), *torch.autograd.grad(attention(*leaves, offsets), leaves)]
        got = [compiled(*leaves, offsets), *torch.autograd.grad(compiled(*leaves, offsets), leaves)]
        for a, b in zip(got, eager):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert len(graphs) == 1
    assert [n.target for n in graphs[0].graph.nodes if n.op == "call_function"][0] == fwd


def test_executed_flops_never_below_model_flops():
    from gemref.attention import attention_model_flops

    for q_lens, kv_lens, causal, window in FLOP_CASES:
        kv_lens = kv_lens or q_lens
        model = attention_model_flops(q_lens, kv_lens, 2, 8, causal, window)
        for kernel in ("sdpa", "cpu_jagged", "cpu_fused", "reference", "triton"):
            forward, backward = KERNELS[kernel].executed_flops(torch.tensor(q_lens), torch.tensor(kv_lens),
                                                               2, 8, causal, window)
            assert forward >= model and backward >= 2 * model, (kernel, q_lens, causal, window)


# --------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("kernel,activation,causal", [("sdpa", "softmax", False), ("sdpa", "softmax", True),
                                                      ("cpu_jagged", "silu", True),
                                                      ("cpu_jagged", "softmax", False)])
def test_one_4096_sequence_uses_10x_less_memory_than_reference(kernel, activation, causal):
    offsets = torch.tensor([0, 4096])
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(4096, 1, 16, generator=gen) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    peaks = {}
    for name in ("reference", kernel):
        with track_peak_memory("cpu") as peak:
            out = gdpa(q, k, v, offsets, activation=activation, causal=causal, kernel=name)
            torch.autograd.grad(out, (q, k, v), grad)
        peaks[name] = peak.bytes
    assert peaks["reference"] > 4096 ** 2 * 4  # it does materialise the scores
    assert peaks[kernel] * 10 <= peaks["reference"], peaks
    if kernel == "cpu_jagged":  # the tracker sees inside the opaque op: its 4 MiB score tile counts
        from gemref.attention.cpu_jagged.op import CHUNK_ENTRIES
        assert peaks[kernel] >= 4 * CHUNK_ENTRIES, peaks


# ------------------------------------------------------------------------------ dispatch
def test_auto_picks_the_fast_cpu_kernels_and_logs_once(caplog):
    q = torch.zeros(3, 1, 8)
    api._auto_logged.clear()
    with caplog.at_level(logging.INFO, logger="gemref.attention.api"):
        assert resolve_kernel("auto", q, "softmax", False, None) == "sdpa"
        assert resolve_kernel("auto", q, "softmax", False, None) == "sdpa"
        for activation in ("silu", "gelu", "identity"):
            assert resolve_kernel("auto", q, activation, True, 4) == "cpu_fused"
    assert sum("chose 'sdpa'" in r.getMessage() for r in caplog.records) == 1


def _qkv(T=5, D=8, dtype=torch.float32):
    return (torch.randn(T, 2, D, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize("kernel,activation,dtype,D,match", [
    ("triton", "silu", torch.float32, 16, "TRITON_INTERPRET|not installed"),
    ("flash_attn", "softmax", torch.bfloat16, 16, "flash-attn"),
    ("sdpa", "silu", torch.float32, 16, "softmax attention only"),
    ("flash_attn", "gelu", torch.float32, 16, "softmax attention only"),
])
def test_kernel_that_cannot_run_here_is_a_value_error_with_the_reason(kernel, activation, dtype, D, match):
    q, k, v = _qkv(D=D, dtype=dtype)
    with pytest.raises(ValueError, match=f"gdpa kernel '{kernel}' cannot run here: .*({match})"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), activation=activation, kernel=kernel)


def test_triton_head_dim_and_dtype_reasons(monkeypatch):
    from gemref.attention.triton import op as triton_gdpa

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_gdpa, "_kernels", {})  # as if not compiled yet in this process
    reason = triton_gdpa._unavailable
    assert reason(torch.zeros(1, 1, 16), "silu", False, None) is None
    assert "head dim 24 is not supported" in reason(torch.zeros(1, 1, 24), "silu", False, None)
    assert "head dim 256 is not supported" in reason(torch.zeros(1, 1, 256), "gelu", True, 3)
    assert "torch.float64" in reason(torch.zeros(1, 1, 16, dtype=torch.float64), "silu", False, None)
    monkeypatch.setattr(triton_gdpa, "_kernels", {"interpreted": False})
    assert "already compiled" in reason(torch.zeros(1, 1, 16), "silu", False, None)


def test_cpu_jagged_refuses_other_devices():
    q = torch.zeros(1, 1, 8, device="meta")
    assert "CPU path" in KERNELS["cpu_jagged"].unavailable(q, "silu", False, None)


@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_bad_offsets_and_shapes_are_value_errors(kernel):
    q, k, v = _qkv()
    act = "silu" if kernel == "cpu_fused" else "softmax"
    with pytest.raises(ValueError, match=r"offsets\[-1\]=4 does not match the number of rows T=5"):
        gdpa(q, k, v, torch.tensor([0, 2, 4]), activation=act, kernel=kernel)
    with pytest.raises(ValueError, match="non-decreasing: offsets\\[2\\]=1"):
        gdpa(q, k, v, torch.tensor([0, 2, 1, 5]), activation=act, kernel=kernel)
    with pytest.raises(ValueError, match="same batch size"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), kv_offsets=torch.tensor([0, 5]), activation=act, kernel=kernel)
    with pytest.raises(ValueError, match=r"kv_offsets\[-1\]=4"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), kv_offsets=torch.tensor([0, 1, 4]), activation=act, kernel=kernel)
    with pytest.raises(ValueError, match="causal attention needs the same query and key offsets"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), kv_offsets=torch.tensor([0, 1, 5]), activation=act,
             causal=True, kernel=kernel)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), activation="swish", kernel=kernel)
    with pytest.raises(ValueError, match="window must be None or an int >= 1"):
        gdpa(q, k, v, torch.tensor([0, 2, 5]), activation=act, window=0, kernel=kernel)


def test_empty_batch_rows_give_zero_output_and_zero_grads():
    """Every sequence empty on the key side: outputs and gradients are exactly zero."""
    for kernel in CPU_KERNELS:
        case = for_kernel(kernel, {"q_lens": [3, 0, 2], "kv_lens": [0, 0, 0], "cross": True, "causal": False,
                                   "window": None, "activation": "softmax", "heads": 1, "qk_scale": None,
                                   "out_scale": 1.0, "seed": 1})
        leaves, grad, q_off, kv_off = make_inputs(case, 8, torch.float64, "cpu")
        out, dq, dk, dv = run(kernel, case, leaves, grad, q_off, kv_off)
        assert out.shape == (5, 1, 8) and not out.any() and not dq.any()
        assert dk.shape == (0, 1, 8) and dv.shape == (0, 1, 8)



# ------------------------------------- CUDA-only call paths, wired to a CPU stand-in
def _flash_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right):
    """FlashAttention varlen semantics (self-attention windows: keys i-left..i+right) computed
    by the reference; checks the argument types the real kernels require."""
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    assert max_q == int((cu_q[1:] - cu_q[:-1]).max()) and max_k == int((cu_k[1:] - cu_k[:-1]).max())
    window = None
    if left is not None and left >= 0:
        assert right == (0 if causal else left)
        window = left + 1
    return KERNELS["reference"].fn(q, k, v, cu_q.long(), cu_k.long(), activation="softmax", causal=causal,
                                   window=window, qk_scale=scale, max_q=None, max_kv=None)


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 4), (False, 3)])
def test_sdpa_flash_varlen_wiring(monkeypatch, causal, window):
    """The CUDA varlen path's arguments, run against a stand-in (no GPU here)."""
    from gemref.attention import sdpa

    class FakeAten:
        @staticmethod
        def _flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, is_causal, debug, *,
                                     scale, window_size_left, window_size_right):
            assert dropout == 0.0 and debug is False
            out = _flash_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale,
                                  window_size_left, window_size_right)
            return out, None, None, None, None

    monkeypatch.setattr(sdpa, "_aten", FakeAten)
    monkeypatch.setattr(sdpa, "_use_varlen", lambda *args: True)
    case = {"q_lens": [9, 0, 1, 20], "kv_lens": [9, 0, 1, 20], "cross": False, "causal": causal,
            "window": window, "activation": "softmax", "heads": 2, "qk_scale": 0.3, "out_scale": 0.5, "seed": 8}
    expected = reference_results(case, 8)
    assert_matches(run("sdpa", case, *make_inputs(case, 8, torch.float64, "cpu")), expected, 1e-9, "varlen")


@pytest.mark.parametrize("causal,window", [(True, 4), (False, None), (False, 3)])
def test_flash_attn_wiring(monkeypatch, causal, window):
    """flash_attn_varlen_func's arguments, run against a stand-in module (flash-attn is not installed)."""
    import sys
    import types

    from gemref.attention.flash_attn import gdpa_flash_attn

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, *, dropout_p, softmax_scale, causal,
                               window_size):
        assert dropout_p == 0.0
        return _flash_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, *window_size)

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func))
    cross = not causal and window is None
    case = {"q_lens": [4, 4, 4] if cross else [9, 1, 30], "kv_lens": [30, 0, 2] if cross else [9, 1, 30],
            "cross": cross, "causal": causal, "window": window, "activation": "softmax", "heads": 1,
            "qk_scale": None, "out_scale": 2.0, "seed": 9}
    leaves, grad, q_off, kv_off = make_inputs(case, 8, torch.float64, "cpu")
    out = gdpa_flash_attn(*leaves, q_off, q_off if kv_off is None else kv_off, activation="softmax",
                          causal=causal, window=window, out_scale=2.0)
    assert_matches([out.detach(), *torch.autograd.grad(out, leaves, grad)], reference_results(case, 8), 1e-9,
                   "flash_attn")


def test_flash_attn_windowed_cross_attention_falls_back_to_sdpa_with_a_log(caplog):
    from gemref.attention import flash_attn

    case = {"q_lens": [4, 4], "kv_lens": [30, 2], "cross": True, "causal": False, "window": 3,
            "activation": "softmax", "heads": 1, "qk_scale": None, "out_scale": 1.0, "seed": 10}
    leaves, grad, q_off, kv_off = make_inputs(case, 8, torch.float64, "cpu")
    flash_attn._logged_fallback = False
    with caplog.at_level(logging.WARNING, logger="gemref.attention.flash_attn"):
        out = flash_attn.gdpa_flash_attn(*leaves, q_off, kv_off, activation="softmax", window=3)
    assert "runs through sdpa" in caplog.text
    assert_matches([out.detach(), *torch.autograd.grad(out, leaves, grad)], reference_results(case, 8), 1e-9,
                   "flash_attn fallback")
