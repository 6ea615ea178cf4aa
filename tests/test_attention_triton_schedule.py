"""The Triton GDPA kernel's plain-Python parts: tile ranges, work schedules and their cache,
variant flags, the tile tuner's choice, input guards. No kernel runs here (no interpreter
or GPU needed); the kernels themselves: tests/test_attention_triton.py."""
from __future__ import annotations

import pytest
import torch

from gemref.attention.triton import launch
from gemref.attention.reference import allowed_mask
from gemref.attention.triton.op import gdpa_triton
from gemref.attention.triton.schedule import build_schedule, cached_schedule, tile_range, visited_tiles
from gemref.attention.triton.variant import ENV_VAR, Tiles, Variant, current_variant, use_variant


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


Q_OFF = torch.tensor([0, 100, 100, 101, 140, 400])
HEADS = 3


def _schedule_rows(kind: str, order: str):
    """The real rows of a schedule (checked: every (sequence, tile, head) once, padding last)
    and each row's cost, recomputed from the tile ranges."""
    sched = build_schedule(Q_OFF, Q_OFF, kind, 16, 32, True, None, int(Q_OFF[-1]), HEADS, order)
    block = 16 if kind == "keys" else 32
    lengths = (Q_OFF[1:] - Q_OFF[:-1]).tolist()
    expected = sorted((b, t, h) for b, L in enumerate(lengths) for t in range(-(-L // block)) for h in range(HEADS))
    real = sched[sched[:, 0] >= 0]
    assert sorted(map(tuple, real.tolist())) == expected
    assert (sched[len(real):, 0] == -1).all()
    lens = torch.tensor(lengths)[real[:, 0].long()]
    return real, visited_tiles(kind, real[:, 1].long() * block, lens, lens, 16, 32, True, None)


@pytest.mark.parametrize("kind", ["keys", "queries"])
def test_lpt_schedule_costliest_tile_first_heads_adjacent(kind):
    real, cost = _schedule_rows(kind, "lpt")
    assert (cost[:-1] >= cost[1:]).all()
    for h in range(HEADS):   # each tile's heads 0, 1, 2 in a row
        assert (real[h::HEADS, :2] == real[0::HEADS, :2]).all() and (real[h::HEADS, 2] == h).all()
    if kind == "keys":       # causal: the last tile of the longest sequence is the costliest
        assert tuple(real[0].tolist()) == (4, 16, 0)   # rows 256..259 of the 260-long one


@pytest.mark.parametrize("kind", ["keys", "queries"])
def test_grouped_schedule_keeps_each_sequence_head_together(kind):
    real, cost = _schedule_rows(kind, "grouped")
    groups = [(b, h) for b, _, h in real.tolist()]
    runs = [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    assert len(runs) == len(set(runs)), "the tiles of one (sequence, head) are not adjacent"
    seq_cost: dict[int, int] = {}
    for (b, _, h), c in zip(real.tolist(), cost.tolist()):
        if h == 0:
            seq_cost[b] = seq_cost.get(b, 0) + c
    seq_order = list(dict.fromkeys(b for b, _ in runs))
    assert [seq_cost[b] for b in seq_order] == sorted(seq_cost.values(), reverse=True)
    assert [h for b, h in runs if b == seq_order[0]] == list(range(HEADS))
    for g in runs:           # costliest tile first inside a group
        inside = cost[[i for i, x in enumerate(groups) if x == g]]
        assert (inside[:-1] >= inside[1:]).all()


def test_schedule_cache_hits_only_the_same_unchanged_tensors():
    off = torch.tensor([0, 5, 40, 41])
    args = ("keys", 16, 16, True, None, 41, 2, "lpt")
    first = cached_schedule(off, off, *args)
    assert cached_schedule(off, off, *args) is first
    assert cached_schedule(off.clone(), off, *args) is not first          # another tensor, equal values
    assert cached_schedule(off, off, *args, enabled=False) is not first   # cache_schedule=0
    off[1:] = torch.tensor([30, 40, 41])                                  # in place: the version moves
    again = cached_schedule(off, off, *args)
    assert again is not first and torch.equal(again, build_schedule(off, off, *args))
    with torch.inference_mode():                                          # no version counter: no caching
        frozen = torch.tensor([0, 5, 40, 41])
    assert torch.equal(cached_schedule(frozen, frozen, *args), build_schedule(frozen, frozen, *args))


def test_int32_or_misplaced_offsets_are_value_errors_before_any_kernel():
    q = torch.zeros(5, 1, 16)
    good = torch.tensor([0, 2, 5])
    for bad in (good.to(torch.int32), good[None]):
        with pytest.raises(ValueError, match="q_offsets must be 1-D int64"):
            gdpa_triton(q, q, q, bad, good, activation="silu")
    with pytest.raises(ValueError, match="kv_offsets is on meta, the inputs on cpu"):
        launch.check_offsets(q, good, good.to("meta"))   # (a meta argument would send the op to its fake)


# --------------------------------------------------------------- variants and the tile tuner
def test_variant_text_round_trips_and_bad_flags_are_value_errors():
    v = Variant.parse("silu_tanh, schedule=grouped,bwd=atomic,fwd=128x128x8x2,autotune=0")
    assert (v.silu_tanh, v.schedule, v.bwd, v.autotune) == (True, "grouped", "atomic", False)
    assert v.fixed_tiles("fwd") == Tiles(128, 128, 8, 2) and v.fixed_tiles("dq") is None
    assert Variant.parse(v.spec()) == v
    for text, match in (("turbo", "unknown GDPA variant flag 'turbo'"), ("silu_tanh=2", "takes 0 or 1"),
                        ("schedule=random", "schedule='random'"), ("bwd=fast", "bwd='fast'"),
                        ("fwd=128x100", "power of two"), ("dq=big", "BMxBN")):
        with pytest.raises(ValueError, match=match):
            Variant.parse(text)
    with pytest.raises(ValueError, match="unknown GDPA variant flag"):
        with use_variant(turbo=True):
            pass


def test_variant_precedence_block_over_environment(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fold_scale,schedule=grouped")
    assert current_variant() == Variant(fold_scale=True, schedule="grouped")
    with use_variant("bwd=atomic") as outer:
        assert outer == Variant(fold_scale=True, schedule="grouped", bwd="atomic")
        with use_variant(schedule="lpt"):
            assert current_variant() == Variant(fold_scale=True, bwd="atomic")
        assert current_variant() == outer
    monkeypatch.setenv(ENV_VAR, "nonsense")
    with pytest.raises(ValueError, match="unknown GDPA variant flag"):
        current_variant()


def test_tuner_keeps_the_fastest_fitting_tiles_per_length_bucket(monkeypatch):
    """The tuning logic with a fake clock (the real one needs CUDA): the fastest candidate
    that fits wins, once per key; another length bucket tunes again."""
    import triton.runtime.errors
    import triton.testing

    fake_ms = {"128x64x4x3": 3.0, "128x64x8x3": 2.0, "128x128x8x2": 1.0, "64x64x4x3": 4.0, "64x32x4x2": 5.0}
    launched: list[str] = []

    def fake_bench(fn, **kwargs):
        fn()
        if launched[-1] == "128x128x8x2":   # fastest, but does not fit: skipped
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
        return fake_ms[launched[-1]]

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(launch, "planned_tiles", lambda *args: None)   # as on CUDA with autotune=1
    monkeypatch.setattr(launch, "_tuned", {})
    monkeypatch.setattr(launch, "_last_tiles", {})
    flags = dict(CAUSAL=True, HAS_WINDOW=False)
    q = torch.zeros(8, 2, 64)

    def run(buckets):
        return str(launch._run("fwd", Variant(), q, flags, buckets, lambda t: launched.append(str(t))))

    assert run((2048, 2048)) == "128x64x8x3"
    # fp32 at head dim 64: every fwd candidate fits (resources.py), each timed once, the winner launched
    assert launched == ["128x64x4x3", "128x64x8x3", "128x128x8x2", "64x64x4x3", "64x32x4x2", "128x64x8x3"]
    run((2048, 2048))
    assert len(launched) == 7                      # tuned once per key: one more launch, no timing
    run((64, 64))
    assert len(launched) == 13                     # a new length bucket tunes again
    assert str(launch.tiles_for_flops("fwd", "cuda", Variant(), 64, True, False, (2048, 2048),
                                      torch.float32)) == "128x64x8x3"
    assert [launch.length_bucket(r, 4) for r in (0, 64, 65, 8192, 10 ** 9)] == [16, 16, 32, 2048, 8192]


# ----------------------------------------------------------------- tile resources (resources.py)
@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("element_bytes", [2, 4])
@pytest.mark.parametrize("pass_name", ["fwd", "dkdv", "dq"])
def test_default_tiles_neither_spill_nor_exceed_sm90_shared_memory(pass_name, head_dim, element_bytes):
    from gemref.attention.triton.resources import (MAX_REGISTERS, SM90_SHARED_BYTES, default_tiles,
                                                   registers_per_thread, shared_bytes)
    tiles = default_tiles(pass_name, head_dim, element_bytes)
    assert registers_per_thread(pass_name, tiles, head_dim) <= MAX_REGISTERS
    assert shared_bytes(pass_name, tiles, head_dim, element_bytes) <= SM90_SHARED_BYTES


def test_resource_estimates_by_hand():
    """The formulas at the tiles the review found spilling: dK/dV 32 x 128 at 4 warps, D = 128."""
    from gemref.attention.triton.resources import REG_OVERHEAD, fits, registers_per_thread, shared_bytes
    from gemref.attention.triton.variant import Tiles
    old = Tiles(32, 128, 4, 3)
    # dK, dV: 2 x 128 x 128 fp32 = 256 per thread of 128; S^T, dA^T: 2 x 128 x 32 = 64 more
    assert registers_per_thread("dkdv", old, 128) == 256 + 64 + REG_OVERHEAD
    # fp32: 3 stages x (Q, dO 2 x 32 x 128) + K, V 2 x 128 x 128 + W^T, dS^T 2 x 128 x 32, x 4 bytes = 256 KiB
    assert shared_bytes("dkdv", old, 128, 4) == 256 * 1024
    assert not fits("dkdv", old, 128, 2) and fits("dkdv", Tiles(32, 128, 8, 3), 128, 2)
    # forward 128 x 64 at 4 warps, bf16, D = 128: (128 x 128 + 128 x 64) / 128 + overhead; 144 KiB
    assert registers_per_thread("fwd", Tiles(128, 64, 4, 3), 128) == 192 + REG_OVERHEAD
    assert shared_bytes("fwd", Tiles(128, 64, 4, 3), 128, 2) == 144 * 1024


def test_no_fitting_tile_is_a_clear_error():
    from gemref.attention.triton.resources import fitting
    from gemref.attention.triton.variant import Tiles
    with pytest.raises(ValueError, match="no dkdv tile .* fits head dim 256"):
        fitting("dkdv", (Tiles(32, 128, 4, 3),), 256, 4)
    with pytest.raises(ValueError, match="pass 'bwd'"):
        fitting("bwd", (Tiles(32, 128, 4, 3),), 64, 2)


def test_tuner_times_only_the_candidates_that_fit(monkeypatch):
    """fp32 at head dim 128: the forward's larger tiles exceed sm_90's shared memory and are not timed."""
    import triton.testing

    from gemref.attention.triton.resources import candidates
    timed: list[str] = []

    def fake_bench(fn, **kwargs):
        fn()
        return float(len(timed))

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(launch, "planned_tiles", lambda *args: None)
    monkeypatch.setattr(launch, "_tuned", {})
    monkeypatch.setattr(launch, "_last_tiles", {})
    q = torch.zeros(8, 2, 128)
    launch._run("fwd", Variant(), q, dict(CAUSAL=True, HAS_WINDOW=False), (64, 64), lambda t: timed.append(str(t)))
    assert timed[:-1] == [str(t) for t in candidates("fwd", 128, 4)] == ["64x32x4x2"]
