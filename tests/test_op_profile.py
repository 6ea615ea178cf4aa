"""gemref/mfu/op_profile.py: the one account of a profiled step by op class, the profiler's own
cost out. A hand-built profile worked out by hand; the waterfall's breakdown and `gemref bench
step_profile` give the same classes (and the same "other") for the same profile, hand-built
and real."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gemref.mfu.op_classes import CLASSES
from gemref.mfu.op_profile import (UNTRACED, OpProfile, account, event_boundaries, profile_op_classes,
                                   profiler_cost_per_boundary)
from gemref.mfu.step_profile import class_record
from gemref.mfu.timing import StepRecord
from gemref.waterfall.runner import profile_seconds
from gemref.waterfall.schedule import Window
from gemref.waterfall.stats import breakdown


def _event(name, self_us, children=(), shapes=(), thread=1):
    e = SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_children=list(children), cpu_parent=None,
                        thread=thread, input_shapes=list(shapes))
    for c in children:
        c.cpu_parent = e
    return e


def _flatten(roots):
    out = []
    for e in roots:
        out += [e, *_flatten(e.cpu_children)]
    return out


def _hand_profile() -> OpProfile:
    """One step: 14 event boundaries on the step's thread, a gloo event on another thread, a
    profiled step of 10 ms after an unprofiled one of 8.6 ms: 1.4 ms of profiler, 100 us a boundary."""
    roots = [
        _event("optimizer", 100, [_event("aten::_fused_adamw_", 900)]),
        _event("sequence_block", 1500, [_event("aten::mm", 2000, shapes=[[64, 32], [32, 96]]),
                                        _event("aten::view", 50), _event("aten::view", 50)]),
        _event("gemref::cpu_jagged_fwd", 1000, [_event("aten::silu_", 200)]),
        _event("aten::add_", 300),
        _event("gloo:all_reduce", 5000, thread=2),
    ]
    return OpProfile(_flatten(roots), profiled_s=[0.010], unprofiled_s=[0.0086], profiled_cpu_s=[0.010])


# By hand, in us. Each event keeps max(0, self - 100 x (1 + children)):
#   optimizer 100 - 200 -> 0, adamw 900 - 100 -> 800                  optimizer   800  (profiled 1000)
#   sequence_block 1500 - 400 -> 1100, views 50 - 100 -> 0             other      1100  (profiled 1600)
#   mm 2000 - 100 -> 1900                                              gemm       1900  (profiled 2000)
#   cpu_jagged_fwd 1000 - 200 -> 800, silu_ (inside it) 200 - 100      attention   900  (profiled 1200)
#   add_ 300 - 100 -> 200                                              elementwise 200  (profiled  300)
# self times on the step's thread: 6100; untraced 10000 - 6100 = 3900, to other (both accounts).
HAND_SECONDS = {"gemm": 1.9e-3, "attention": 0.9e-3, "elementwise": 0.2e-3, "optimizer": 0.8e-3,
                "communication": 0.0, "other": 5.0e-3}
HAND_PROFILED = {"gemm": 2.0e-3, "attention": 1.2e-3, "elementwise": 0.3e-3, "optimizer": 1.0e-3,
                 "communication": 0.0, "other": 5.5e-3}


def test_the_account_of_a_hand_built_profile():
    p = _hand_profile()
    c = account(p)
    assert c.profiler_s_per_boundary == pytest.approx(100e-6)
    assert c.seconds == pytest.approx(HAND_SECONDS) and c.profiled == pytest.approx(HAND_PROFILED)
    assert c.gemm_shapes == {(1, 64, 32, 96): pytest.approx({"calls": 1.0, "seconds": 1.9e-3})}
    assert c.other_ops["aten::view"] == pytest.approx({"calls": 2.0, "seconds": 0.0, "profiled_seconds": 100e-6})
    assert c.other_ops[UNTRACED]["seconds"] == pytest.approx(3.9e-3)
    assert "gloo:all_reduce" not in c.other_ops                  # another thread: not the step's


def _agree(p: OpProfile) -> tuple[dict, dict]:
    """(the waterfall's breakdown of a one-rank window whose compute is the accounted step, the
    step_profile record's classes) for the same profile."""
    seconds = profile_seconds(p)
    compute = seconds["compute_per_step_s"]
    window = Window(0, 0, 0, [StepRecord(compute, 0.0, compute, compute, 1, 1, 1, 1, 0)], 0.0)
    return breakdown([window], [seconds]), {r["class"]: r for r in class_record(account(p))["classes"]}


def test_the_waterfall_and_step_profile_give_the_same_other_for_the_same_profile():
    wf, sp = _agree(_hand_profile())
    for cls in CLASSES:
        if cls != "communication":
            assert wf[f"{cls}_s"] == pytest.approx(HAND_SECONDS[cls])
        assert 1e-3 * sp[cls]["ms_per_step"] == pytest.approx(HAND_SECONDS[cls])
    assert sp["other"]["share"] == pytest.approx(5.0 / 8.8)


def test_a_real_profile_gives_both_accounts_the_same_classes(tiny_batch):
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.train import setup

    preset = get_preset("tiny")
    s = setup(preset, override(preset.train, jagged=True, kernel="auto"), device="cpu")
    s.step(tiny_batch)
    p = profile_op_classes(lambda: s.step(tiny_batch), 1, "cpu")
    wf, sp = _agree(p)
    assert sp["gemm"]["ms_per_step"] > 0 and sp["attention"]["ms_per_step"] > 0 and sp["other"]["ms_per_step"] > 0
    for cls in CLASSES:
        if cls != "communication":
            assert wf[f"{cls}_s"] == pytest.approx(1e-3 * sp[cls]["ms_per_step"], rel=1e-9, abs=1e-12)
    c = account(p)
    assert sum(c.profiled.values()) >= p.profiled_s[0] * (1 - 1e-9)          # the untraced time is in other
    assert all(0 <= c.seconds[k] <= c.profiled[k] + 1e-12 for k in CLASSES)


def test_the_profilers_cost_is_counted_per_event_boundary_and_taken_out_of_each_event():
    """A real profile: an empty "optimizer" region (the step's thread) and a record_function
    holding 3 views and 1 mm (which calls resolve_conj on its 3 operands): 9 events with 7
    parent-child links, 16 boundaries; a cost larger than every event empties every class, no
    cost leaves the profile as it was."""
    from torch.profiler import record_function

    from gemref.mfu.op_classes import classify_cpu
    from gemref.mfu.profile import quiet_profile

    x = torch.randn(8, 8)
    with quiet_profile("cpu") as prof:
        with record_function("optimizer"):
            pass
        with record_function("outer"):
            for _ in range(3):
                x.view(-1)
            torch.mm(x, x)
    events = list(prof.events())
    assert sorted(e.name for e in events) == ["aten::mm", *["aten::resolve_conj"] * 3, *["aten::view"] * 3,
                                              "optimizer", "outer"]
    assert event_boundaries(events) == 16
    assert profiler_cost_per_boundary(9, 0.010, 0.001) == pytest.approx(0.009 / 9)
    assert profiler_cost_per_boundary(9, 0.001, 0.002) == 0.0 == profiler_cost_per_boundary(0, 0.01, 0.0)
    c = classify_cpu(events, 1, per_boundary=0.0)
    assert c.seconds == c.profiled and c.profiled["gemm"] > 0 and {"outer", "aten::view"} <= set(c.other_ops)
    assert c.other_ops["aten::view"]["calls"] == 3
    c = classify_cpu(events, 1, per_boundary=1.0)
    assert all(v == 0 for v in c.seconds.values()) and c.profiled["gemm"] > 0
    assert all(u["seconds"] == 0 and u["profiled_seconds"] > 0 for u in c.other_ops.values())


def test_a_gemm_wrapped_in_another_gemm_event_counts_its_shape_once():
    """Autocast's aten::bmm wraps the kernel's aten::bmm (two events, one GEMM): the shape is
    counted at the inner event; both self times stay in the gemm class. A GEMM event around
    other ops only keeps its shape."""
    from gemref.mfu.op_classes import classify_cpu

    inner = _event("aten::bmm", 700, shapes=[[16, 6, 4], [16, 4, 32]])
    roots = [_event("optimizer", 10),
             _event("aten::bmm", 5, [inner], shapes=[[16, 6, 4], [16, 4, 32]]),
             _event("aten::mm", 300, [_event("aten::empty", 1)], shapes=[[8, 4], [4, 2]])]
    c = classify_cpu(_flatten(roots), 1)
    assert c.gemm_shapes == {(16, 6, 4, 32): {"calls": 1.0, "seconds": 700e-6},
                             (1, 8, 4, 2): {"calls": 1.0, "seconds": 300e-6}}
    assert c.seconds["gemm"] == pytest.approx(1005e-6)
