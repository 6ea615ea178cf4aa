"""Shared helpers for the attention kernel tests: jagged batches with skewed lengths
(hypothesis strategies), running a kernel forward and backward, and comparing to reference.

`attention_case()` with its defaults draws what it always drew (short lengths, head dim and
logits left to the caller); the CPU kernel properties widen it with `long_len`,
`head_dims`, `logit_scales` and `tile_limits`. The oracle is the reference kernel in
float64, run one sequence at a time (no padding: shares no bucketing, chunking or padding
code with the kernels, and costs sum L^2 instead of B * max L^2).

The GPU check (scripts/gpu_check/) shares its part of these cases through the same module:
VARIANTS (the Triton kernel variants every section runs), DRY_VARIANTS (the few its --dry-run
times), its correctness items and how they are split over shards.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from functools import wraps
import os

import torch
from hypothesis import settings
from hypothesis import strategies as st

from gemref.attention import ACTIVATIONS, gdpa, gdpa_reference
from gemref.data.jagged import lengths_to_offsets

# Skewed: mostly short sequences (including empty and length-1 ones), now and then a long one.
LENGTH = st.one_of(st.sampled_from([0, 1, 1, 2, 3, 5]), st.integers(0, 40))
HEAD_DIMS = (8, 16, 24, 32, 64, 128)
LOGIT_SCALES = (1.0, 3.0, 10.0, 30.0)   # multiplies q: softmax far from uniform, silu far from linear
# (score entries per wave / chunk, smallest tree leaf, bucket slack): None = the kernels' own.
# The small limits cut every length above ~20 into several pieces, buckets and tree levels.
TILE_LIMITS = (None, (1 << 12, 4, 0), (1 << 14, 16, 1 << 10))
# Examples per CPU kernel property in every profile: ~10-20 s each on one 2020s core.
CPU_KERNEL_EXAMPLES = 1000


@st.composite
def attention_case(draw, max_batch: int = 5, cross: bool | None = None, long_len: int = 0,
                   head_dims: tuple[int, ...] = (8,), logit_scales: tuple[float, ...] = (1.0,),
                   tile_limits: tuple = (None,)) -> dict:
    """One GDPA problem: lengths, mask, activation, scales (self or cross attention).

    Causal about half the time (causal is self-attention); `long_len` > 40 lets one
    sequence per side reach that length; `head_dims`, `logit_scales` and `tile_limits`
    are drawn from (their single defaults keep the old cases)."""
    B = draw(st.integers(1, max_batch))
    causal = False if cross else draw(st.booleans())
    cross = False if causal else (draw(st.booleans()) if cross is None else cross)

    def lengths() -> list[int]:
        lens = draw(st.lists(LENGTH, min_size=B, max_size=B))
        if long_len > 40 and draw(st.booleans()):
            lens[draw(st.integers(0, B - 1))] = draw(st.integers(41, long_len))
        return lens

    q_lens = lengths()
    kv_lens = lengths() if cross else q_lens
    return {
        "q_lens": q_lens, "kv_lens": kv_lens, "cross": cross, "causal": causal,
        "window": draw(st.one_of(st.none(), st.integers(1, 12))),
        "activation": draw(st.sampled_from(ACTIVATIONS)),
        "heads": draw(st.integers(1, 2)),
        "qk_scale": draw(st.sampled_from([None, 0.3])),
        "out_scale": draw(st.sampled_from([1.0, 0.5])),
        "seed": draw(st.integers(0, 2 ** 16)),
        "head_dim": draw(st.sampled_from(head_dims)),
        "logit_scale": draw(st.sampled_from(logit_scales)),
        "tile_limit": draw(st.sampled_from(tile_limits)),
    }


def make_inputs(case: dict, head_dim: int, dtype: torch.dtype, device: str, round_to: torch.dtype | None = None):
    """q, k, v (leaf tensors requiring grad), the output gradient, q and kv offsets.

    q is multiplied by the case's logit_scale (default 1). `round_to` first rounds the
    values through that dtype (the float64 oracle of a half-precision run)."""
    gen = torch.Generator().manual_seed(case["seed"])
    q_off = lengths_to_offsets(torch.tensor(case["q_lens"], dtype=torch.int64))
    kv_off = lengths_to_offsets(torch.tensor(case["kv_lens"], dtype=torch.int64)) if case["cross"] else q_off
    H = case["heads"]
    q = torch.randn(int(q_off[-1]), H, head_dim, generator=gen, dtype=torch.float64) * case.get("logit_scale", 1.0)
    k = torch.randn(int(kv_off[-1]), H, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(int(kv_off[-1]), H, head_dim, generator=gen, dtype=torch.float64)
    grad = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    if round_to is not None:
        q, k, v, grad = (x.to(round_to).to(torch.float64) for x in (q, k, v, grad))
    leaves = [x.to(device, dtype).requires_grad_(True) for x in (q, k, v)]
    q_off, kv_off = q_off.to(device), (kv_off.to(device) if case["cross"] else None)
    return leaves, grad.to(device, dtype), q_off, kv_off


def run(kernel: str, case: dict, leaves, grad, q_off, kv_off) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of one kernel on the given inputs."""
    out = gdpa(*leaves, q_off, kv_offsets=kv_off, activation=case["activation"],
               causal=case["causal"], window=case["window"], qk_scale=case["qk_scale"],
               out_scale=case["out_scale"], kernel=kernel)
    grads = torch.autograd.grad(out, leaves, grad, allow_unused=False)
    return [out.detach(), *grads]


def reference_results(case: dict, head_dim: int, device: str = "cpu",
                      round_to: torch.dtype | None = None) -> list[torch.Tensor]:
    """The ground truth: the reference kernel in float64 on CPU, one sequence at a time
    (`round_to`: on inputs rounded through that dtype, as a half-precision run sees them)."""
    (q, k, v), grad, q_off, kv_off = make_inputs(case, head_dim, torch.float64, "cpu", round_to)
    kv_off = q_off if kv_off is None else kv_off
    outs = []
    for b in range(len(case["q_lens"])):
        qs, ks = slice(int(q_off[b]), int(q_off[b + 1])), slice(int(kv_off[b]), int(kv_off[b + 1]))
        lq, lk = qs.stop - qs.start, ks.stop - ks.start
        if lq == 0 or lk == 0:   # nothing to attend: zero output rows
            outs.append(q[qs] * 0)
            continue
        outs.append(gdpa_reference(q[qs], k[ks], v[ks], torch.tensor([0, lq]), torch.tensor([0, lk]),
                                   activation=case["activation"], causal=case["causal"], window=case["window"],
                                   qk_scale=case["qk_scale"], out_scale=case["out_scale"]))
    out = torch.cat(outs) if outs else q * 0
    grads = torch.autograd.grad(out, (q, k, v), grad, allow_unused=True)
    return [out.detach(), *(torch.zeros_like(x) if g is None else g for x, g in zip((q, k, v), grads))]


# ----------------------------------------------------------- error bounds, in one place
# Every element-wise bound of the kernel properties is
#
#     |a - e| <= rel * |e| + max(atol * S, 2 * baseline error, floor),
#     floor = max(FLOOR_ULPS * u(dtype) * max(1, S), n * tiny(dtype))
#
# with S the case's scale (the largest |entry| of the oracle's out, dq, dk, dv), n a bound on
# the terms one result sums (reduction_length), tiny the dtype's smallest normal and u(dtype)
# the unit roundoff of the precision the kernel computes in (2^-53 float64, 2^-24 float32,
# 2^-8 bf16; for bf16 inputs computed in float32, float32's). rel * |e| and atol * S shrink
# with the results, and S can be 0 or arbitrarily small: gelu with every score far in its
# negative tail (one query over one key at logits x10) gives an oracle whose four tensors are
# all 0 or ~1e-70, and a bound of ~1e-74, while any kernel builds those results from unit-size
# inputs (q, k, v, dO are N(0, 1) draws): what it gets wrong there is rounding of unit-size
# quantities, not a fraction of a result that is not there. Two examples, both legitimate:
#   * float32 exp underflows: cpu_fused clamps exp's argument at -87, so its gelu tail is
#     |s| * t * e^-87 ~ 1e-39 (a subnormal) where the oracle has 0 (u32 = 6e-8 is 3e31 times that);
#   * the float64 oracle's gelu, 0.5 s (1 + erf(s / sqrt 2)), cancels: 1 + erf is 0 below
#     s ~ -8.4 and off by ~u64 above, so the oracle itself is off by up to 0.5 * 8.4 * u64
#     ~ 4 u64 a term (measured: <= 0.9 u64 at s in -9..-5), where cpu_fused's float32 erfc
#     is relatively accurate (its -3.8e-17 against the oracle's -0 at s ~ -8.7 is the
#     oracle's error, 0.3 u64, not the kernel's).
# The floor is FLOOR_ULPS unit roundoffs of the unit scale (or of S when larger): a result
# of a few rounded operations on unit-size operands; and never below the dtype's smallest
# normal times the terms a result sums (where a sum underflows, each term may lose up to
# that). The first decides for float64, float32 and bf16 (16 * 2^-24 = 9.5e-7 > 300 keys *
# float32's smallest normal 1.2e-38, by 30 orders), the second only for float16 (smallest
# normal 6.1e-5: 300 terms give 0.018 > 16 * 2^-11 = 0.0078). The rounding part is,
# for S >= 1, below every check's own atol * S (16 u is 1.8e-15 against float64's 1e-12,
# 9.5e-7 against the float32-computed bf16 kernels' 2e-5, 0.0625 against sdpa-bf16's 0.1):
# it only ever decides where S < 1, never loosens a case whose results are unit-size.
# The checks without atol (Triton, the CUDA wiring: max error within rel * max(1, largest
# |entry|) of each tensor) carry the same floor already: rel of the unit scale.
FLOOR_ULPS = 16


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one correctly rounded operation."""
    return torch.finfo(dtype).eps / 2


def case_scale(expected: list[torch.Tensor]) -> float:
    """S: the largest |entry| of the oracle's tensors (0 for an all-zero or empty case)."""
    return max([float(e.abs().max()) for e in expected if e.numel()] + [0.0])


def reduction_length(expected: list[torch.Tensor]) -> int:
    """An upper bound on the terms any one result sums: the query rows (a key's dk, dv sum
    over queries), the key rows (a query's out, dq over keys), the head dim (a score)."""
    dims = [e.shape[0] for e in expected if e.dim()] + [expected[0].shape[-1] if expected and expected[0].dim() else 1]
    return max(dims + [1])


def error_floor(dtype: torch.dtype, expected: list[torch.Tensor]) -> float:
    """The absolute error no element-wise bound goes below (the reasoning: the block above):
    FLOOR_ULPS * u(dtype) * max(1, S), and at least the dtype's smallest normal for each
    term a result sums (underflow; decides only for float16, whose smallest normal is 6e-5);
    positive for an all-zero reference."""
    rounding = FLOOR_ULPS * unit_roundoff(dtype) * max(1.0, case_scale(expected))
    return max(rounding, reduction_length(expected) * torch.finfo(dtype).tiny)


def assert_matches(actual: list[torch.Tensor], expected: list[torch.Tensor], rel: float, what: str,
                   atol: float | None = None, baseline: list[torch.Tensor] | None = None,
                   dtype: torch.dtype | None = None) -> None:
    """Each of out, dq, dk, dv against the oracle.

    With `atol`: element-wise |a - e| <= rel * |e| + max(atol * S, error_floor), S the
    largest |entry| of the four expected tensors (the case's scale: a gradient that is
    exactly 0 in the oracle, e.g. softmax over one key, comes out as rounding noise of
    terms of that size) and the floor FLOOR_ULPS unit roundoffs of `dtype` (the precision
    the kernel computes in; default the results' own) times max(1, S), for the cases
    whose S is 0 or tiny (the block above).
    Without it (the old check): max abs error within `rel` of max(1, that tensor's largest
    entry) (its floor: rel of the unit scale).
    With `baseline` (a plain implementation run in the same low precision): the absolute
    allowance of each tensor is at least twice the baseline's largest error there, the
    FlashAttention test rule "no worse than twice the naive kernel in the same dtype"."""
    scale = case_scale(expected)
    floor = error_floor(dtype or actual[0].dtype, expected)
    baseline = baseline or [None] * len(expected)
    for name, a, e, b in zip(("out", "dq", "dk", "dv"), actual, expected, baseline):
        a = a.detach().to("cpu", torch.float64)
        assert a.shape == e.shape, (what, name, a.shape, e.shape)
        assert torch.isfinite(a).all(), f"{what}: {name} has non-finite entries"
        if not a.numel():
            continue
        err = (a - e).abs()
        if atol is None:
            top = max(1.0, float(e.abs().max()))
            assert float(err.max()) <= rel * top, f"{what}: {name} max error {float(err.max()):.3g} > {rel} x {top:.3g}"
            continue
        allowance = max(atol * scale, floor)
        if b is not None and b.numel():
            allowance = max(allowance, 2 * float((b.detach().to("cpu", torch.float64) - e).abs().max()))
        bound = rel * e.abs() + allowance
        bad = err > bound
        if bad.any():
            j = tuple(int(x) for x in bad.nonzero()[0])
            raise AssertionError(f"{what}: {name}{list(j)} = {float(a[j]):.6g}, expected {float(e[j]):.6g} "
                                 f"(error {float(err[j]):.3g} > bound {float(bound[j]):.3g}; "
                                 f"{int(bad.sum())} of {bad.numel()} entries out)")


@contextmanager
def tile_limits(limit: tuple | None):
    """Run the CPU kernels with smaller tiles, leaves and buckets (`limit` from TILE_LIMITS)."""
    if limit is None:
        yield
        return
    from gemref.attention import bucketing, sdpa
    from gemref.attention.cpu_jagged import op as cpu_jagged, plan as cpu_jagged_plan
    entries, leaf, slack = limit
    patches = [(cpu_jagged, "CHUNK_ENTRIES", entries), (sdpa, "WINDOW_CHUNK_ENTRIES", entries),
               (cpu_jagged_plan, "LEAF_MIN", leaf), (bucketing, "MAX_WASTE", 0.0),
               (bucketing, "MIN_SLACK_ENTRIES", slack)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


# ----------------------------------------------------------- examples run per property
EXAMPLES: Counter = Counter()   # pytest node id -> examples its hypothesis property ran


def counted(test):
    """Decorate a property under @given: count every example it runs (conftest.py prints
    the counts at the end of the session, under xdist too)."""
    @wraps(test)
    def wrapper(*args, **kwargs):
        EXAMPLES[os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]] += 1
        return test(*args, **kwargs)
    return wrapper


def kernel_settings(at_least: int = 0, ci: int | None = None) -> settings:
    """The active hypothesis profile (tests/conftest.py), with at least `at_least` examples;
    `ci`: the examples to run under any profile but `thorough` (a property too slow for the
    profile's count on every CI run, e.g. Triton under the interpreter; `thorough` still runs
    the profile's >= 1000)."""
    current = settings()
    examples = max(at_least, current.max_examples)
    if ci is not None and os.environ.get("HYPOTHESIS_PROFILE", "ci") != "thorough":
        examples = ci
    return settings(current, max_examples=examples)


# ----------------------------------------------------------- the GPU check's cases
# Texts for gemref.attention.triton.variant.Variant, all at fixed tiles (autotune=0) except
# "autotune" (the library's default). The GPU check's correctness section runs each one first,
# which also fills Triton's compile cache for its timing section.
VARIANTS = {
    "base": "autotune=0",                                          # DEFAULT_TILES, every flag off
    "silu_tanh": "autotune=0,silu_tanh",
    "fold_scale": "autotune=0,fold_scale",
    "grouped": "autotune=0,schedule=grouped",
    "atomic_bwd": "autotune=0,bwd=atomic",
    "no_sched_cache": "autotune=0,cache_schedule=0",
    "tiles_big": "autotune=0,fwd=128x128x8x2,dkdv=64x128x8x2,dq=128x64x8x2",
    "all_flags": "autotune=0,silu_tanh,fold_scale,schedule=grouped,bwd=atomic",
    "autotune": "autotune=1",                                      # the library default
}
# The dry run tests the plumbing: it times only these, and checks softmax only with them
# (its correctness section still runs every variant on silu).
DRY_VARIANTS = ("base", "all_flags")


# Head dims the GPU check's correctness section runs beside its own (D = 128; dry run 16): the
# Triton tiles change with D (gemref/attention/triton/variant.py), so each needs its own check.
OTHER_HEAD_DIMS = {False: (16, 64), True: (32,)}


def correctness_items(dry_run: bool) -> list[dict]:
    """The GPU check's correctness items: {name, variant, dtype, repeat, weight, head_dim, case}.

    A skewed jagged batch (lengths 300, 1, 0, 77, 129, 17; --dry-run 20, 1, 0, 9, 17, 5) at
    the base variant: bf16 and fp16, silu and softmax, causal and not, a sliding window, cross
    attention (4 queries per sample); the other head dims (`OTHER_HEAD_DIMS`: 16 and 64 beside
    the section's 128; the dry run 32 beside 16) on causal bf16 silu and softmax; then
    every variant on causal bf16 silu and softmax (silu_tanh on silu only; the dry run: softmax
    only with DRY_VARIANTS); then two repeat-run determinism items. `weight` is the item's
    relative cost (autotuning is the dearest); `head_dim` None: the section's own."""
    lens = [20, 1, 0, 9, 17, 5] if dry_run else [300, 1, 0, 77, 129, 17]
    case = {"q_lens": lens, "kv_lens": lens, "cross": False, "causal": True, "window": None,
            "activation": "silu", "heads": 1 if dry_run else 2, "qk_scale": None, "out_scale": 1.0, "seed": 0}
    out = []

    def add(name, variant="base", dtype="bfloat16", repeat=False, weight=3, head_dim=None, **changes):
        out.append({"name": name, "variant": variant, "dtype": dtype, "repeat": repeat, "weight": weight,
                    "head_dim": head_dim, "case": {**case, **changes}})

    for act in ("silu", "softmax"):
        for dtype in ("bfloat16", "float16"):
            add(f"{act} causal {dtype}", dtype=dtype, activation=act)
        add(f"{act} full", activation=act, causal=False)
        add(f"{act} causal window", activation=act, window=9 if dry_run else 100)
        add(f"{act} cross", activation=act, causal=False, cross=True, q_lens=[4] * len(lens))
        for head_dim in OTHER_HEAD_DIMS[dry_run]:
            add(f"{act} causal D={head_dim}", activation=act, head_dim=head_dim)
        for variant in VARIANTS:
            if variant == "base" or (act == "softmax" and (variant == "silu_tanh" or
                                                           (dry_run and variant not in DRY_VARIANTS))):
                continue
            add(f"{act} causal [{variant}]", variant, activation=act, weight=10 if variant == "autotune" else 3)
    add("silu full [autotune]", "autotune", causal=False, weight=10)   # the model's cross attention
    add("determinism silu [base]", repeat=True)
    add("determinism softmax [atomic_bwd]", "atomic_bwd", repeat=True, activation="softmax")
    return out


def shard_items(items: list[dict], index: int, count: int) -> list[dict]:
    """Shard `index` of `count`: heaviest item first, each to the least loaded shard (every
    shard computes the same split, so together they run each item once)."""
    loads, mine = [0] * count, []
    for item in sorted(items, key=lambda it: -it["weight"]):
        target = loads.index(min(loads))
        loads[target] += item["weight"]
        if target == index:
            mine.append(item)
    return mine
