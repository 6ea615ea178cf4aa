"""cpu_fused beyond the shared kernel properties (tests/test_attention_kernels.py checks its
numbers against the reference): what it computes and counts, its threads, its build."""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from gemref.attention.testing import attention_case, kernel_settings, make_inputs
from gemref.attention import KERNELS, attention_model_flops, gdpa, resolve_kernel
from gemref.attention.cpu_fused import build as cpu_fused_build, op as cpu_fused
from gemref.data.jagged import lengths_to_offsets


def _entries_run(q_lens, kv_lens, causal, window, heads=2, D=8):
    """The score entries the kernel itself reports for one forward and one backward call."""
    case = {"q_lens": q_lens, "kv_lens": kv_lens, "cross": True, "seed": 0, "heads": heads}
    (q, k, v), grad, q_off, kv_off = make_inputs(case, D, torch.float32, "cpu")
    q, k, v = q.detach(), k.detach(), v.detach()
    args = (q_off, kv_off, causal, window or 0, 0.3, 1.0)
    entry = cpu_fused_build.ENTRY_POINTS["float32"]
    forward = cpu_fused.launch(entry, "silu", None, q, k, v, torch.empty_like(q), *args)
    grads = (grad, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    return forward, cpu_fused.launch(entry, "silu", grads, q, k, v, None, *args)


@kernel_settings(ci=200)
@given(data=st.data(), causal=st.booleans(), window=st.one_of(st.none(), st.integers(1, 40)))
def test_the_formula_counts_what_the_kernel_computes(data, causal, window):
    """computed_entries (Python, vectorised over query groups) against the count the C++ loops
    return, on skewed lengths with empty sequences, self and cross attention."""
    lengths = st.lists(st.one_of(st.integers(0, 5), st.integers(0, 90)), min_size=1, max_size=6)
    q_lens = data.draw(lengths)
    kv_lens = q_lens if causal or data.draw(st.booleans()) else data.draw(
        st.lists(st.integers(0, 90), min_size=len(q_lens), max_size=len(q_lens)))
    head_dim = data.draw(st.sampled_from([8, 32, 48]))   # forward groups of 8, 8, 4 queries
    expected = tuple(2 * cpu_fused.computed_entries(torch.tensor(q_lens), torch.tensor(kv_lens), causal, window, g)
                     for g in cpu_fused.query_groups(head_dim))
    assert _entries_run(q_lens, kv_lens, causal, window, D=head_dim) == expected
    # forward executed FLOPs (2 products x 2 x padded dims) never below the model's
    padded = cpu_fused.padded_head_dim(head_dim)
    assert 2 * 2 * padded * expected[0] >= attention_model_flops(q_lens, kv_lens, 2, head_dim, causal, window)


def test_computed_entries_by_hand():
    """Groups of 4 queries (the backward's) over 16-key blocks, 64 entries a block, one head;
    then groups of 8 (the forward's at head dims <= 32), 128 entries a block."""
    def n(q, kv, causal, window=None, group=4):
        return cpu_fused.computed_entries(torch.tensor(q), torch.tensor(kv), causal, window, group)
    # causal L=5: rows 0-3 reach key 3 (1 block), row 4 key 4 (1 block): 2 x 64
    assert n([5], [5], True) == 128
    # 3 queries over 20 keys, full: one group, 2 blocks
    assert n([3], [20], False) == 128
    # causal L=40: groups at 0, 4, ..., 36 reach keys 3, 7, ..., 39; blocks ceil((i0+4)/16):
    # i0 = 0..12: 1 (4 groups), 16..28: 2 (4 groups), 32, 36: 3 (2 groups) = 18 blocks
    assert n([40], [40], True) == 18 * 64
    # causal window 2, L=40: group i0 covers keys i0-1 .. i0+3: blocks floor((i0-1)/16)..(i0+3)//16;
    # i0 = 0..12 -> 1 block, 16 -> keys 15..19: 2 blocks, 20..28 -> 1, 32 -> keys 31..35: 2, 36 -> 1
    assert n([40], [40], True, 2) == (4 + 2 + 3 + 2 + 1) * 64
    # empty key side and empty query side: nothing
    assert n([4, 0], [0, 9], False) == 0
    # groups of 8, causal L=40: groups at 0, 8, ..., 32 reach keys 7, 15, 23, 31, 39:
    # blocks 1, 1, 2, 2, 3 = 9 blocks of 8 x 16
    assert n([40], [40], True, group=8) == 9 * 128
    assert cpu_fused.query_groups(16) == (8, 4) and cpu_fused.query_groups(33) == (4, 4)


def test_flop_counter_prices_the_op_by_its_entries():
    """FlopCounterMode on gdpa(kernel="cpu_fused"): forward 2 products, backward 5, each
    2 x padded head dim per entry. H=2, D=24 (padded to 32); causal L=5: forward one group of
    8 queries over one 16-key block, 128 entries a head: 2 * 2 * 32 * 2 * 128 = 32,768;
    backward two groups of 4 (test above), 128 entries a head: 5 * 2 * 32 * 2 * 128 = 81,920."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 2, 24, generator=gen, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as fwd:
        out = gdpa(q, k, v, torch.tensor([0, 5]), activation="silu", causal=True, kernel="cpu_fused")
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    assert (fwd.get_total_flops(), bwd.get_total_flops()) == (32_768, 81_920)
    assert KERNELS["cpu_fused"].executed_flops(torch.tensor([5]), torch.tensor([5]), 2, 24, True, None) == (
        32_768, 81_920)


def test_threads_give_the_one_thread_result_bit_for_bit():
    """Pairs are independent, so splitting them across threads changes nothing."""
    lens = [300, 1, 0, 77, 12, 150, 5]
    case = {"q_lens": lens, "kv_lens": lens, "cross": False, "seed": 3, "heads": 3}
    leaves, grad, offsets, _ = make_inputs(case, 16, torch.float32, "cpu")
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            out = gdpa(*leaves, offsets, activation="silu", causal=True, kernel="cpu_fused")
            results.append([out, *torch.autograd.grad(out, leaves, grad)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_split_covers_every_pair_once_and_balances():
    offsets = lengths_to_offsets(torch.tensor([100, 1, 1, 1, 50, 50, 0]))
    parts = cpu_fused._split(offsets, offsets, 2, 3)
    assert sorted(torch.cat(parts).tolist()) == list(range(14))
    work = ((torch.tensor([100, 1, 1, 1, 50, 50, 0]) + 1) ** 2).repeat_interleave(2)
    loads = [int(work[p].sum()) for p in parts]
    # 2 x 10,201 + 4 x 2,601 + 6 x 4 + 2 x 1 = 30,832: the two longest pairs alone, the four
    # mid ones together (10,404), the small ones on the lightest: max 10,412, 1.3% over 1/3
    assert len(parts) == 3 and max(loads) <= 1.02 * sum(loads) / 3


def test_refuses_softmax_wide_heads_and_other_devices():
    reason = KERNELS["cpu_fused"].unavailable
    assert "pointwise activations only" in reason(torch.zeros(1, 1, 8), "softmax", False, None)
    assert "head dim 256 > 128" in reason(torch.zeros(1, 1, 256), "silu", False, None)
    assert "CPU kernel" in reason(torch.zeros(1, 1, 8, device="meta"), "silu", False, None)
    assert resolve_kernel("auto", torch.zeros(1, 1, 8), "softmax", False, None) == "sdpa"
    assert resolve_kernel("auto", torch.zeros(1, 1, 256), "silu", False, None) == "cpu_jagged"


def test_without_a_compiler_auto_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_fused_build, "compiler", lambda: None)
    assert "no C++ compiler" in cpu_fused_build._load()
    monkeypatch.setattr(cpu_fused_build, "_loaded", {"lib": "no C++ compiler found (set $CXX or install g++)"})
    q = torch.zeros(3, 1, 8)
    assert "no C++ compiler" in KERNELS["cpu_fused"].unavailable(q, "silu", True, None)
    assert resolve_kernel("auto", q, "silu", True, None) == "cpu_jagged"


def test_a_failing_build_is_reported_and_leaves_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_fused_build, "compiler", lambda: "/bin/false")
    reason = cpu_fused_build._load()
    assert "/bin/false failed (exit 1)" in reason
    assert not list((tmp_path / "cpu_fused").glob("*.so*"))


def test_the_cache_key_follows_the_source(monkeypatch, tmp_path):
    cxx = cpu_fused_build.compiler()
    assert cxx is not None, "the test machine needs a C++ compiler (torch.compile's CPU backend does too)"
    before = cpu_fused_build._key(cxx)
    for i, name in enumerate(("SOURCES", "HEADERS")):        # a change in any source file or the header
        files = getattr(cpu_fused_build, name)
        changed = tmp_path / f"changed{i}{files[0].suffix}"
        changed.write_text(files[0].read_text() + "\n// changed\n")
        monkeypatch.setattr(cpu_fused_build, name, (changed, *files[1:]))
        assert cpu_fused_build._key(cxx) != before
        monkeypatch.setattr(cpu_fused_build, name, files)


def test_no_query_rows_still_writes_zero_key_gradients():
    """An empty query side hands the kernel null pointers for q and dO; dK and dV must still
    be written (zeros), not left as allocated (a regression: backward was once told apart
    from forward by dO's pointer)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(0, 1, 32, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(10, 1, 32, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = gdpa(q, k, v, torch.tensor([0, 0, 0]), kv_offsets=torch.tensor([0, 5, 10]), activation="silu",
               kernel="cpu_fused")
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.empty(0, 1, 32, dtype=torch.float64))
    assert dq.shape == (0, 1, 32) and torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(v))


def test_the_raw_op_refuses_int32_offsets():
    """gdpa() rejects int32 offsets for every kernel; the op called directly must too (its
    C++ loops read int64), not read past them."""
    q = torch.randn(5, 1, 16)
    with pytest.raises(ValueError, match="cpu_fused needs int64 CPU offsets, got q_offsets torch.int32"):
        torch.ops.gemref.cpu_fused_fwd(q, q, q, torch.tensor([0, 5], dtype=torch.int32),
                                       torch.tensor([0, 5]), "silu", True, 0, 0.25, 1.0)


def _strided_qkv(case: dict, dtype: torch.dtype):
    """q, k, v as row-strided views of one (T, 3, H, D) tensor (the model's unbound qkv
    projection; self-attention), leaves of autograd, and an output gradient."""
    (q, k, v), grad, offsets, _ = make_inputs(dict(case, cross=False, kv_lens=case["q_lens"]), case["head_dim"],
                                              torch.float64, "cpu")
    qkv = torch.stack([q.detach(), k.detach(), v.detach()], dim=1).to(dtype).requires_grad_(True)
    return qkv, grad.to(dtype), offsets


@kernel_settings(ci=100)
@given(case=attention_case(max_batch=4, long_len=120, cross=False, head_dims=(8, 16, 32, 48)))
def test_bf16_runs_natively_and_equals_the_float32_kernel_rounded(case):
    """bf16 q, k, v (strided views of one qkv tensor) go to the kernel as they are: out, dq,
    dk, dv equal, bit for bit, the float32 kernel on the widened inputs with each result
    rounded to bf16 once (bf16 -> float32 is exact; both round to nearest even), and the
    call runs no cast or copy of q, k, v, dO or the results."""
    assume(case["activation"] != "softmax")     # pointwise only (refused: test_refuses_softmax...)
    qkv, grad, offsets = _strided_qkv(case, torch.bfloat16)
    kwargs = dict(activation=case["activation"], causal=case["causal"], window=case["window"],
                  qk_scale=case["qk_scale"], out_scale=case["out_scale"], kernel="cpu_fused")

    def results(x, g):
        out = gdpa(*x.unbind(1), offsets, **kwargs)
        return [out.detach(), *torch.autograd.grad(out, x, g)[0].unbind(1)]

    with _CountCopies() as copies:
        native = results(qkv, grad)
    wide = qkv.detach().float().requires_grad_(True)
    rounded = [t.to(torch.bfloat16) for t in results(wide, grad.float())]
    assert all(t.dtype == torch.bfloat16 for t in native)
    for a, b in zip(native, rounded):
        assert torch.equal(a, b)
    big = [s for s in copies.shapes if s and s[0] == qkv.shape[0] and len(s) == 3]
    assert not big, f"copies of (T, H, D) tensors around the bf16 kernel: {big}"


class _CountCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the shapes of every copy/cast op dispatched (aten copy_, _to_copy, clone)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.copy_, torch.ops.aten._to_copy, torch.ops.aten.clone):
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_bf16_strided_inputs_without_a_native_entry_are_cast_once():
    """float16 (no native entry point) still runs: cast to float32, computed, cast back; the
    result equals the float32 kernel's rounded to float16."""
    case = {"q_lens": [5, 0, 17], "seed": 1, "heads": 2, "head_dim": 16, "cross": False}
    qkv, grad, offsets = _strided_qkv(case, torch.float16)
    out = gdpa(*qkv.unbind(1), offsets, activation="silu", causal=True, kernel="cpu_fused")
    wide = gdpa(*qkv.detach().float().unbind(1), offsets, activation="silu", causal=True, kernel="cpu_fused")
    assert out.dtype == torch.float16 and torch.equal(out, wide.half())
