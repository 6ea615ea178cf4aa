"""The waterfall: one ladder, the interleaved order, contention marking, E2E = local x scaling, paired ratios.

Nothing here is timed: the schedule and the statistics are checked on fake steps and
injected measurements with the arithmetic written out; the end-to-end runs check structure
and the identities the record must satisfy, whatever the machine's load.
"""
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gemref.waterfall import ladder
from gemref.cli import main
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.errors import UsageError
from gemref.mfu.op_classes import CLASSES, classify_cpu, op_class
from gemref.mfu.timing import StepRecord
from gemref.waterfall import LADDER, WITH_OPTIONS, Context, Rung, check_options, run_waterfall
from gemref.waterfall.rungs import preset_with
from gemref.waterfall.rows import build_rows, notes
from gemref.waterfall.schedule import Window, groups, run_rounds
from gemref.waterfall.stats import breakdown, chain, paired_ratio, window_figures

TINY = get_preset("tiny")
README = Path(__file__).resolve().parent.parent / "README.md"


def window(rung=0, k=0, attempt=0, *, wall=1.0, compute=1.0, thread=None, delay=0.0, process=None, data=0.0,
           steps=1, tokens=100, flops=1e9, samples=10, device="cpu"):
    """A window of `steps` equal steps whose totals are the arguments (compute: the rank's compute seconds)."""
    thread = compute if thread is None else thread
    process = thread if process is None else process
    records = [StepRecord(wall / steps, data / steps, thread / steps, process / steps, samples // steps,
                          tokens // steps, int(flops) // steps, int(flops) // steps, 0) for _ in range(steps)]
    return Window(rung, k, attempt, records, delay, device, 1, 2, compute_s=compute)


# ----------------------------------------------------------------------------- one ladder


def test_one_ladder_feeds_the_waterfall_the_projection_and_the_readme():
    from gemref.simulate.projection import LADDER as PROJECTED

    keys = [r.key for r in ladder.RUNGS]
    assert [r.key for r in LADDER] == keys == [r.key for r in PROJECTED]
    assert [r.title for r in LADDER] == [r.title for r in ladder.RUNGS] == [r.title for r in PROJECTED]
    assert ladder.markdown_table() in README.read_text()
    with pytest.raises(ValueError, match="unknown rung 'warp'"):
        ladder.rung("warp")


def test_each_rungs_copy_list_names_existing_files_once():
    root = ladder.PROJECT_ROOT
    for r in ladder.RUNGS:
        assert len(set(r.copy)) == len(r.copy), f"rung {r.number} lists a file twice: {r.copy}"
        assert all((root / f).is_file() for f in r.copy), r.copy


# ----------------------------------------------------------------------------- schedule


def test_every_rungs_window_k_runs_before_any_window_k_plus_1():
    order = []

    def fake(rung, k, attempt):
        order.append((rung, k))
        return window(rung, k, attempt)

    rounds = run_rounds([0, 1, 2], 3, fake, lambda mine: [mine], [5])
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
    assert [(r.index, r.attempt, r.kept) for r in rounds] == [(0, 0, True), (1, 0, True), (2, 0, True)]


def test_a_contended_round_is_measured_again_as_a_whole_within_the_budget():
    order = []

    def fake(rung, k, attempt):      # rung 1's first try at round 0: 0.5 s of CPU, 0.5 s queued for a core
        order.append((rung, k, attempt))
        return window(rung, k, attempt, compute=0.5, delay=0.5 if (rung, k, attempt) == (1, 0, 0) else 0.0)

    budget = [1]
    rounds = run_rounds([0, 1], 2, fake, lambda mine: [mine], budget)
    assert order == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1), (0, 1, 0), (1, 1, 0)]
    assert [(r.index, r.attempt, r.kept) for r in rounds] == [(0, 0, False), (0, 1, True), (1, 0, True)]
    assert budget == [0]


def test_retries_stop_when_the_budget_is_spent_and_the_contended_windows_are_left_out():
    def busy(rung, k, attempt):       # every window: the rank got 60% of a core
        return window(rung, k, attempt, thread=0.6, delay=0.4)

    budget = [2]
    rounds = run_rounds([0, 1], 3, busy, lambda mine: [mine], budget)
    assert len(rounds) == 3 + 2 and budget == [0]
    assert sum(r.kept for r in rounds) == 3 and all(w.contended for r in rounds for w in r.windows[0])


class FakeRung:
    """Stands in for runner.Rung: records what the rank program asks of each rung, trains nothing."""

    log: list = []

    def __init__(self, preset, train, device):
        self.i = train.seed                   # the test gives rung i the seed i
        self.log.append(("build", self.i))

    def info(self):
        return {"resolved": {"kernel": "fake", "precision": "fp32"}, "dtype": "fp32", "ac_plan": None}

    def step(self):
        self.log.append(("warmup", self.i))

    def window(self, rung, k, attempt, settings):
        assert rung == self.i
        self.log.append(("window", self.i, k))
        return window(rung, k, attempt)

    def profile(self, steps):
        self.log.append(("profile", self.i))
        return {c: 0.0 for c in CLASSES} | {"compute_per_step_s": 0.0}

    def memory(self):
        self.log.append(("memory", self.i))
        return {"peak_memory_bytes": 1, "peak_memory_method": "fake"}


@pytest.mark.parametrize("free, expect_groups", [(1e15, [[0, 1, 2]]), (1.0, [[0, 1], [1, 2]])])
def test_the_rank_program_interleaves_each_group_of_live_rungs(monkeypatch, free, expect_groups):
    from gemref.train.override import override
    from gemref.mfu.peak import Peak
    from gemref.waterfall import runner

    monkeypatch.setattr(runner, "Rung", FakeRung)
    monkeypatch.setattr(runner, "free_bytes", lambda device: free)
    monkeypatch.setattr(runner, "peak_flops", lambda device, dtype: Peak(1e9, "fake", dtype))
    FakeRung.log = []
    trains = [override(TINY.train, seed=i) for i in range(3)]
    out = runner.measure(TINY, trains, "cpu", runner.Settings(windows=2, warmup=1, max_retries=0))
    assert out["groups"] == expect_groups
    log = FakeRung.log
    if len(expect_groups) == 1:
        assert log == [("build", 0), ("warmup", 0), ("build", 1), ("warmup", 1), ("build", 2), ("warmup", 2),
                       ("window", 0, 0), ("window", 1, 0), ("window", 2, 0),
                       ("window", 0, 1), ("window", 1, 1), ("window", 2, 1)] + [
                       (what, i) for i in range(3) for what in ("profile", "memory")]
    else:   # rung 1 stays alive from the first pair into the second; each rung is profiled once
        assert log == [("build", 0), ("warmup", 0), ("build", 1), ("warmup", 1),
                       ("window", 0, 0), ("window", 1, 0), ("window", 0, 1), ("window", 1, 1),
                       ("profile", 0), ("memory", 0), ("profile", 1), ("memory", 1),
                       ("build", 2), ("warmup", 2),
                       ("window", 1, 0), ("window", 2, 0), ("window", 1, 1), ("window", 2, 1),
                       ("profile", 2), ("memory", 2)]
    assert len(out["rounds"]) == 2 * len(expect_groups) and out["peaks"]["fp32"]["flops"] == 1e9


def test_contention_marking_from_cpu_and_wall_times():
    # schedstat: 0.85 s on a core + 0.15 s queued -> 85% of a core < 90%: contended
    assert window(thread=0.85, delay=0.15).core_share == pytest.approx(0.85)
    assert window(thread=0.85, delay=0.15).contended
    # waiting for a peer at a collective is sleep, not queueing: 0.5 s CPU + 0.01 s queued of 1 s wall
    w = window(wall=1.0, thread=0.5, delay=0.01)
    assert w.core_share == pytest.approx(0.5 / 0.51) and not w.contended
    assert w.cpu_per_wall == pytest.approx(0.5)
    # no schedstat: process CPU / wall time decides
    assert not window(wall=1.0, process=0.95, delay=None).contended
    assert window(wall=1.0, process=0.85, delay=None).contended
    assert window(wall=1.0, process=0.10, delay=None, device="cuda").core_share is None   # not measured


def test_all_rungs_alive_when_their_state_fits_half_the_free_memory_else_sliding_pairs():
    assert groups([1, 1, 1], free_bytes=10) == [[0, 1, 2]]          # 3 <= 0.5 x 10
    assert groups([2, 2, 2], free_bytes=10) == [[0, 1], [1, 2]]     # 6 > 5
    assert groups([9, 9], free_bytes=1) == [[0, 1]]                # two rungs are a pair anyway
    with pytest.raises(ValueError, match="no rung"):
        groups([], 1.0)


# ----------------------------------------------------------------------------- statistics


def test_e2e_mfu_is_local_mfu_times_scaling_ratio_by_hand():
    # 2 ranks, peak 1e10 FLOP/s each. rank 0: 3.0e9 FLOPs, 1.5 s compute, 2.0 s wall;
    # rank 1: 3.6e9 FLOPs, 1.8 s compute, 2.1 s wall (the window lasts 2.1 s).
    ranks = [window(wall=2.0, compute=1.5, flops=3.0e9, tokens=300), window(wall=2.1, compute=1.8, flops=3.6e9,
                                                                            tokens=360)]
    f = window_figures(ranks, 1e10)
    assert f["mfu"] == pytest.approx(6.6e9 / (2.1 * 2 * 1e10))          # 0.157142...
    assert f["local_mfu"] == pytest.approx(6.6e9 / ((1.5 + 1.8) * 1e10))  # 0.2
    assert f["scaling_ratio"] == pytest.approx((1.5 + 1.8) / (2 * 2.1))  # 0.785714...
    assert f["local_mfu"] * f["scaling_ratio"] == pytest.approx(f["mfu"], rel=1e-12)
    assert f["tokens_per_s"] == pytest.approx(660 / 2.1)
    assert window_figures(ranks, None)["mfu"] is None                    # no peak known: no MFU


def test_vs_previous_is_the_median_of_paired_ratios():
    rung = {0: {"tokens_per_s": 10.0}, 1: {"tokens_per_s": 30.0}, 2: {"tokens_per_s": 12.0}}
    prev = {0: {"tokens_per_s": 5.0}, 1: {"tokens_per_s": 10.0}, 2: {"tokens_per_s": 8.0}}
    # per round: 10/5 = 2, 30/10 = 3, 12/8 = 1.5 -> median 2 (the ratio of medians would be 12/8 = 1.5)
    assert paired_ratio(rung, prev) == {"median": 2.0, "min": 1.5, "max": 3.0, "pairs": 3}
    del prev[1]                                       # round 1 of the previous rung was contended
    assert paired_ratio(rung, prev) == {"median": 1.75, "min": 1.5, "max": 2.0, "pairs": 2}
    assert paired_ratio(rung, {})["median"] is None
    assert chain([2.0, 1.5]) == 3.0 and chain([2.0, None]) is None


def test_breakdown_by_hand():
    # 2 ranks, 2 steps, window 2.0 s: compute 1.2 and 1.6 s, data 0.1 s each
    ranks = [window(wall=2.0, compute=1.2, data=0.1, steps=2), window(wall=2.0, compute=1.6, data=0.1, steps=2)]
    shares = {c: 0.0 for c in CLASSES}
    b = breakdown(ranks, [shares | {"gemm": 3.0, "attention": 1.0}, shares | {"gemm": 1.0, "optimizer": 1.0}])
    assert b["step_s"] == pytest.approx(1.0) and b["data_s"] == pytest.approx(0.05)
    assert b["waiting_s"] == pytest.approx((0.8 - 0.6) / 2)                          # rank 0 waits 0.2 s/step
    assert b["exposed_comm_s"] == pytest.approx(1.0 - 0.05 - (0.6 + 0.8) / 2 - 0.1)  # 0.15
    assert b["gemm_s"] == pytest.approx((0.6 * 0.75 + 0.8 * 0.5) / 2)
    assert b["attention_s"] == pytest.approx(0.6 * 0.25 / 2) and b["optimizer_s"] == pytest.approx(0.8 * 0.5 / 2)
    parts = sum(v for k, v in b.items() if k != "step_s")
    assert parts == pytest.approx(b["step_s"])
    # the same window where each rank also sat 0.1 s (0.05 s per step) in the run queue
    queued = breakdown([window(wall=2.0, compute=1.2, data=0.1, steps=2, delay=0.1),
                        window(wall=2.0, compute=1.6, data=0.1, steps=2, delay=0.1)], None)
    assert queued["queued_s"] == pytest.approx(0.05) and queued["compute_s"] == pytest.approx(0.7)
    assert queued["exposed_comm_s"] == pytest.approx(0.15 - 0.05)


def _result(groups_, tokens):
    """A measurement of len(tokens) rungs: tokens[rung][round] per window, 1 s each, one rank."""
    rounds = []
    for g, members in enumerate(groups_):
        for k in range(len(tokens[0])):
            rounds.append({"group": g, "index": k, "attempt": 0, "kept": True,
                           "windows": [[asdict(window(i, k, tokens=tokens[i][k])) for i in members]]})
    n = len(tokens)
    return {"groups": groups_, "rounds": rounds, "profiles": [None] * n, "memory": [None] * n,
            "info": [{"resolved": {"kernel": "x", "precision": "fp32"}, "dtype": "fp32"}] * n}


def test_rows_under_sliding_pairs_chain_vs_baseline():
    from gemref.train.config import TrainConfig

    plan = [(rung, TrainConfig()) for rung in LADDER[:3]]
    tokens = [[100, 100, 100], [200, 220, 180], [300, 330, 360]]
    one = build_rows(plan, _result([[0, 1, 2]], tokens), [1e12] * 3)
    assert one[2]["vs_previous"] == pytest.approx(1.5) and one[2]["vs_baseline"] == pytest.approx(3.3)
    pairs = build_rows(plan, _result([[0, 1], [1, 2]], tokens), [1e12] * 3)
    assert [r["group"] for r in pairs] == [0, 0, 1]
    assert pairs[2]["vs_baseline"] == pytest.approx(2.0 * 1.5)      # 200/100 then 300/200 (medians, chained)


@pytest.mark.parametrize("precision, label", [("bf16", "7 + bf16 autocast"), ("mxfp8", "7 + MXFP8"),
                                              ("float8_rowwise", "7 + float8 row-wise")])
def test_the_low_precision_row_names_the_format_it_ran_in(precision, label):
    """A ran rung 7 is labelled by the format its ranks resolved (a CPU's bf16 run is never called
    float8/MXFP8); a rung 7 that did not run keeps the ladder's title with its reason."""
    from gemref.train.config import TrainConfig

    low = next(rung for rung in LADDER if rung.key == "low_precision")
    plan = [(LADDER[0], TrainConfig()), (low, override(TrainConfig(), precision=precision))]
    result = _result([[0, 1]], [[100, 100, 100], [150, 150, 150]])
    result["info"] = [result["info"][0], {"resolved": {"kernel": "x", "precision": precision}, "dtype": precision}]
    rows = build_rows(plan, result, [1e12] * 2)
    assert [r["rung"] for r in rows] == ["0 baseline", label]
    skipped = build_rows([(LADDER[0], TrainConfig()), (low, "n/a here: no FP8 here")], _result([[0]], [[100] * 3]),
                         [1e12])
    assert skipped[1]["rung"] == "7 + float8/MXFP8" and skipped[1]["status"] == "n/a here: no FP8 here"


def test_every_low_precision_recipe_has_a_row_label():
    from gemref.precision.config import PRECISIONS
    from gemref.waterfall.rows import FORMAT_NAMES

    assert set(FORMAT_NAMES) == set(PRECISIONS) - {"fp32"}


def test_figures_show_e2e_local_and_the_breakdown_and_say_which_rungs_were_not_measured():
    from gemref.train.config import TrainConfig
    from gemref.report.figures import waterfall_breakdown_figure, waterfall_figure

    plan = [(rung, TrainConfig()) for rung in LADDER[:3]]
    result = _result([[0, 1, 2]], [[100, 100, 100], [200, 220, 180], [300, 330, 360]])
    for r in result["rounds"]:                  # every window of rung 2 queued for a core half the time
        r["windows"][0][2]["run_delay_s"] = 1.0
    rows = build_rows(plan, result, [1e12] * 3) + [{"rung": "7 + float8/MXFP8", "key": "low_precision",
                                                     "status": "n/a here: no FP8 here"}]
    assert rows[2]["windows_kept"] == 0 and rows[2]["contended_windows"] == 3 and rows[2]["mfu"] is None
    fig = waterfall_figure(rows)
    assert [t.type for t in fig.data] == ["waterfall", "bar", "bar"]
    assert list(fig.data[0].text[2:]) == ["contended", "n/a here"]
    assert [t.name for t in fig.data[1:]] == ["local MFU", "E2E MFU"]
    assert fig.data[2].text[0] == "x1.00"                                # one rank, 1 s of compute per 1 s
    parts = waterfall_breakdown_figure(rows)
    assert [t.name for t in parts.data] == ["compute", "exposed communication", "waiting at the collective",
                                            "queued for a core", "data"]


def test_a_rung_on_another_mfu_basis_starts_a_new_bar_that_names_its_basis():
    """fp32, fp32, bf16 rungs: the bf16 rung's bar restarts from zero at its own MFU (never a drop
    of 10 - 4 points from the fp32 rung), says "of the bf16 peak", and the title lists both bases."""
    from gemref.report.figures import waterfall_figure

    def ran(name, mfu, basis):
        return {"rung": name, "status": "ran", "tokens_per_s": 1000.0, "mfu": mfu, "local_mfu": mfu,
                "scaling_ratio": 1.0, "mfu_basis": basis}

    rows = [ran("0 baseline", 0.02, "fp32 peak"), ran("1 + x", 0.10, "fp32 peak"),
            {"rung": "2 + y", "status": "n/a here: no y"}, ran("7 + bf16 autocast", 0.04, "bf16 peak")]
    fig = waterfall_figure(rows)
    top = fig.data[0]
    assert list(top.measure) == ["absolute", "relative", "relative", "absolute"]
    assert list(top.y) == pytest.approx([2.0, 8.0, 0.0, 4.0])
    assert list(top.text) == ["2%", "10%", "n/a here", "4%<br>of the bf16 peak"]
    assert "fp32 peak, bf16 peak" in fig.layout.title.text
    one_basis = waterfall_figure(rows[:2])
    assert list(one_basis.data[0].text) == ["2%", "10%"] and "bases" not in one_basis.layout.title.text


# ----------------------------------------------------------------------------- op classes


@pytest.mark.parametrize("name, cls", [
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::bmm", "gemm"), ("ampere_sgemm_128x64_tn", "gemm"),
    ("gemref::cpu_jagged_fwd", "attention"), ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::native_layer_norm_backward", "elementwise"), ("aten::silu_", "elementwise"),
    ("triton_poi_fused_add_0", "elementwise"), ("c10d::allreduce_", "communication"),
    ("gloo:all_gather", "communication"), ("ncclDevKernel_AllGather_RING", "communication"),
    ("aten::index", "other"), ("aten::embedding_dense_backward", "other"), ("aten::copy_", "other"),
])
def test_op_classes(name, cls):
    assert op_class(name) == cls


def test_a_profiled_step_splits_into_classes(tiny_batch):
    from gemref.train.override import override
    from gemref.mfu.profile import quiet_profile
    from gemref.train import setup

    s = setup(TINY, override(TINY.train, jagged=True, kernel="auto"), device="cpu")
    with quiet_profile("cpu") as prof:
        s.step(tiny_batch)
    by_class = classify_cpu(prof.events()).seconds
    assert set(by_class) == set(CLASSES)
    assert by_class["gemm"] > 0 and by_class["attention"] > 0 and by_class["optimizer"] > 0
    assert by_class["communication"] == 0                          # one process: no collective


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def record(tmp_path_factory, data_root):
    by_key = {rung.key: rung for rung in LADDER}
    never = Rung(ladder.RungSpec(9, "never", "x + nothing", "", "", "", {}), lambda t, c: "n/a here: never applies")
    chosen = [by_key["baseline"], by_key["jagged"], never, by_key["fused_attention"], by_key["autoac"]]
    out = tmp_path_factory.mktemp("wf")
    return run_waterfall(TINY, device="cpu", windows=3, steps_per_window=2, warmup=1, max_retries=0,
                         ladder=chosen, out_dir=out, log=lambda s: None), out


def test_rungs_do_the_same_model_work(record):
    ran = [r for r in record[0]["rungs"] if r["status"] == "ran"]
    assert [r["key"] for r in ran] == ["baseline", "jagged", "fused_attention", "autoac"]
    assert len({round(r["model_flops_per_sample"]) for r in ran[:3]}) == 1
    # AutoAC spends the freed memory on a larger batch: more FLOPs per step, not per sample.
    assert ran[3]["batch_size"] > ran[2]["batch_size"]
    assert ran[3]["model_flops_per_sample"] == pytest.approx(ran[2]["model_flops_per_sample"], rel=0.2)


def test_every_recorded_window_satisfies_the_decomposition(record):
    rows, out = record
    for r in rows["rungs"]:
        if r["status"] != "ran":
            continue
        rung = json.loads((out / f"rung{rows['rungs'].index(r)}_{r['key']}.json").read_text())
        assert len(rung["rounds"]) == 3                              # max_retries=0: one attempt per round
        for rd in rung["rounds"]:
            (w,) = rd["windows"]
            f = window_figures([Window.from_dict(w)], rung["peak"]["flops"])
            flops, wall = sum(s["model_flops"] for s in w["steps"]), sum(s["wall_s"] for s in w["steps"])
            assert f["mfu"] == pytest.approx(flops / (wall * rung["peak"]["flops"]))
            assert f["local_mfu"] * f["scaling_ratio"] == pytest.approx(f["mfu"], rel=1e-9)
            assert 0 < f["scaling_ratio"] <= 1                          # CPU of the steps <= the window's wall
        assert r["windows_kept"] + r["contended_windows"] == 3
        if r["windows_kept"]:
            assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
            assert sum(v for k, v in r["breakdown"].items() if k != "step_s") <= r["breakdown"]["step_s"] * 1.000001


def test_na_rung_is_kept_with_its_reason_and_skipped(record):
    rows = record[0]["rungs"]
    assert rows[2]["status"] == "n/a here: never applies"
    assert rows[3]["config"]["train"]["attention"]["jagged"] is True          # the next rung builds on rung 1
    assert (record[1] / "waterfall.json").exists()


def test_waterfall_json_says_where_when_and_how_it_was_measured(record):
    on = json.loads((record[1] / "waterfall.json").read_text())
    assert on["schedule"].startswith("every rung alive") and on["windows"] == 3 and on["steps_per_window"] == 2
    m = on["measured_on"]
    assert m["date_utc"][:2] == "20" and m["device"] and m["cpu_count"] >= 1 and m["ranks"] == 1
    assert m["torch"].startswith("2.") and m["gemref"]


@pytest.mark.parametrize("bf16_gflops, runs", [(1300.0, True), (180.0, False)])
def test_the_low_precision_rung_on_a_cpu_is_bf16_where_its_gemms_beat_fp32(monkeypatch, bf16_gflops, runs):
    """On a CPU rung 7 is bf16 autocast iff the measured bf16 GEMM peak beats the fp32 one (an AMX
    Xeon: ~1,300 vs ~220 GFLOP/s); elsewhere it says why not, with both peaks."""
    import gemref.mfu.peak as peak_module
    from gemref.mfu.peak import Peak
    from gemref.waterfall.runner import dtype_name

    monkeypatch.setattr(peak_module, "peak_flops", lambda device, dtype: Peak(
        {"bf16": bf16_gflops, "fp32": 220.0}[dtype] * 1e9, "test", dtype))
    by_key = {rung.key: rung for rung in LADDER}
    out = by_key["low_precision"].configure(TINY.train, Context(TINY, torch.device("cpu"), 1))
    if runs:
        assert out == override(TINY.train, precision="bf16")
        assert dtype_name(out, torch.device("cpu")) == "bf16"             # its MFU divides by the bf16 peak
    else:
        assert out == "n/a here: bf16 GEMMs 180 GFLOP/s vs fp32 220 GFLOP/s on this CPU: bf16 does not beat fp32 " \
                      "on this CPU's GEMMs"


def test_the_low_precision_rung_on_a_gpu_without_fp8_says_why(monkeypatch):
    import gemref.waterfall.rungs as rungs

    monkeypatch.setattr(rungs, "native_support", lambda precision, device: (False, "needs SM89+ (Ada/Hopper)"))
    why = {rung.key: rung for rung in LADDER}["low_precision"].configure(
        TINY.train, Context(TINY, torch.device("cuda"), 1))
    assert why == "n/a here: needs SM89+ (Ada/Hopper) (emulation reproduces the numerics, not the speed)"


@pytest.mark.parametrize("kwargs, message", [
    (dict(windows=2), "windows must be >= 3"),
    (dict(steps_per_window=0), "need steps_per_window >= 1"),
    (dict(max_retries=-1), "max_retries >= 0"),
])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_waterfall(TINY, **kwargs)


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_ranks_interleave_in_one_launch(data_root):
    by_key = {rung.key: rung for rung in LADDER}
    rec = run_waterfall(TINY, device="cpu", ranks=2, windows=3, steps_per_window=1, warmup=1, max_retries=0,
                        profile_steps=1, measure_memory=False, log=lambda s: None,
                        ladder=[by_key["baseline"], by_key["load_balance"], by_key["fsdp_2d"]])
    rows = rec["rungs"]
    assert [r["status"] for r in rows] == ["ran"] * 3 and rec["groups"] == [[0, 1, 2]]
    assert rows[2]["config"]["train"]["parallelism"]["mesh"] == "1x2" and rows[1]["config"]["train"]["balancing"]["policy"] == "kk"
    for r in rows:
        if r["windows_kept"]:
            assert r["local_mfu"] * r["scaling_ratio"] == pytest.approx(r["mfu"], rel=1e-9)
            assert r["breakdown"]["waiting_s"] >= 0 and r["breakdown"]["exposed_comm_s"] >= 0


# ----------------------------------------------------------------------------- --with options


def test_with_local_balances_rung_5_locally_and_unknown_options_list_the_valid_ones():
    by_key = {rung.key: rung for rung in LADDER}
    cpu = torch.device("cpu")
    assert by_key["load_balance"].configure(TINY.train, Context(TINY, cpu, 2)).balancing.policy == "kk"
    assert by_key["load_balance"].configure(TINY.train, Context(TINY, cpu, 2, ("local",))).balancing.policy == "local"
    assert check_options(["window", "local"]) == ("local", "window")        # WITH_OPTIONS' order
    assert by_key["load_balance"].configure(TINY.train, Context(TINY, cpu, 2, ("lpt",))).balancing.policy == "lpt"
    assert list(WITH_OPTIONS) == ["local", "lpt", "compressed_ac", "window", "torchrec"]
    with pytest.raises(UsageError, match="unknown waterfall option.s. 'fast'; valid: local, lpt, compressed_ac, window, "
                                         "torchrec"):
        run_waterfall(TINY, options=("local", "fast"))


def test_cli_with_an_unknown_option_exits_2_with_one_line(capsys):
    assert main(["waterfall", "--preset", "tiny", "--with", "local,fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "valid: local, lpt, compressed_ac, window, torchrec" in err[0], err


def test_with_torchrec_shards_rung_6s_tables_with_torchrec_instead_of_gemrefs_rows():
    fsdp = {rung.key: rung for rung in LADDER}["fsdp_2d"]
    cpu = torch.device("cpu")
    native = fsdp.configure(TINY.train, Context(TINY, cpu, 2))
    torchrec = fsdp.configure(TINY.train, Context(TINY, cpu, 2, ("torchrec",)))
    assert (native.embedding_tables.engine, native.parallelism.sparse_sharding, native.parallelism.mesh) == ("native", "row", "1x2")
    assert (torchrec.embedding_tables.engine, torchrec.parallelism.sparse_sharding, torchrec.parallelism.mesh) == ("torchrec", "none", "1x2")


def test_rung_6_runs_a_2d_mesh_where_the_ranks_allow_and_says_1d_where_not():
    from gemref.waterfall.rows import row_title

    fsdp = {rung.key: rung for rung in LADDER}["fsdp_2d"]
    cpu = torch.device("cpu")
    meshes = {n: fsdp.configure(TINY.train, Context(TINY, cpu, n)).parallelism.mesh for n in (2, 3, 4, 6, 8)}
    assert meshes == {2: "1x2", 3: "1x3", 4: "2x2", 6: "2x3", 8: "2x4"}
    assert row_title(fsdp, {"mesh": "2x2"}) == "6 + FSDP/2D sparse, 2x2"
    assert row_title(fsdp, {"mesh": "1x2"}) == "6 + FSDP/sharded tables, 1x2 (1D: 2D needs 4+ ranks)"


def test_with_window_sets_a_quarter_of_max_len_on_every_rung():
    assert TINY.model.window is None
    assert preset_with(TINY, ("window",)).model.window == TINY.model.max_len // 4 == 16
    assert preset_with(TINY, ("local",)) is TINY


def test_with_compressed_ac_rung_4_trains_with_compressed_saved_activations(data_root, tmp_path):
    """Rung 4 takes the largest batch that fits the previous rung's activation bytes with every
    block compressed, and its AutoAC stores blocks compressed at that batch: a larger batch with
    no recompute (bytes are storage counts, not timings: deterministic)."""
    by_key = {rung.key: rung for rung in LADDER}
    rec = run_waterfall(TINY, device="cpu", windows=3, steps_per_window=1, warmup=1, max_retries=0, profile_steps=0,
                        measure_memory=False, ladder=[by_key["jagged"], by_key["autoac"]], options=("compressed_ac",),
                        out_dir=tmp_path, log=lambda s: None)
    jagged, autoac = rec["rungs"]
    assert rec["with"] == {"compressed_ac": WITH_OPTIONS["compressed_ac"]}
    assert autoac["config"]["train"]["activation_checkpoint"]["mode"] == "auto"
    assert autoac["config"]["train"]["activation_checkpoint"]["compress"] == "mxfp8"
    assert autoac["batch_size"] > jagged["batch_size"] and jagged["config"]["train"]["activation_checkpoint"]["compress"] == "none"
    plan = autoac["ac_plan"]
    assert plan["counts"].get("compressed", 0) > 0 and plan["counts"].get("full", 0) == 0 and jagged["ac_plan"] is None
    assert "C" in autoac["config"]["train"]["activation_checkpoint"]["plan"]      # the plan the parent solved, handed to the rank as is
    assert notes(rec)[0] == f"with compressed_ac: {WITH_OPTIONS['compressed_ac']}"
    assert json.loads((tmp_path / "rung1_autoac.json").read_text())["row"]["config"]["train"]["activation_checkpoint"]["compress"] == "mxfp8"


def test_the_compile_rung_compiles_the_plans_regions_or_says_why_none(monkeypatch):
    """Rung 3 runs the region plan once (at the per-rank batch, one thread per rank as a rank
    has) and hands the ranks its kinds; with no winner the rung does not apply and says how
    each kind did."""
    from gemref.compile.plan import RegionPlan
    from gemref.waterfall import rungs

    seen = {}

    def fake_plan(model, batch, rows):
        def plan(m, b):
            seen.update(rows=len(b.lengths), threads=torch.get_num_threads())
            return RegionPlan(tuple(r["region"] for r in rows if r["kept"]), rows, 0.03)
        return plan

    compile_rung = {rung.key: rung for rung in LADDER}["compile"]
    start = override(TINY.train, jagged=True, kernel="auto", batch_size=8)
    rows = [{"region": "sequence.mix", "speedup": 1.2, "kept": True}, {"region": "loss", "speedup": 0.5, "kept": False}]
    monkeypatch.setattr(rungs, "plan_gemref_regions", fake_plan(None, None, rows))
    threads = torch.get_num_threads()
    out = compile_rung.configure(start, Context(TINY, torch.device("cpu"), 2))
    assert out.compilation.enabled and out.compilation.regions == "sequence.mix"
    assert seen == {"rows": 4, "threads": 1} and torch.get_num_threads() == threads
    lost = [{**r, "kept": False} for r in rows]
    monkeypatch.setattr(rungs, "plan_gemref_regions", fake_plan(None, None, lost))
    why = compile_rung.configure(start, Context(TINY, torch.device("cpu"), 2))
    assert why.startswith("n/a here: no compiled region beats eager") and "sequence.mix 1.20x, loss 0.50x" in why


def test_the_best_rung_profile_script_accounts_for_the_best_rungs_step(record, tmp_path, capsys):
    from scripts.best_rung_profile import main as profile_main

    rows, out = record
    assert profile_main([str(out / "waterfall.json"), "--json", str(tmp_path / "p.json")]) == 0
    prof = json.loads((tmp_path / "p.json").read_text())
    measured = [r for r in rows["rungs"] if r.get("mfu") is not None]
    # a machine so busy that every window was contended has no MFU to rank by: the last rung that ran
    best = max(measured, key=lambda r: r["mfu"]) if measured else \
        [r for r in rows["rungs"] if r["status"] == "ran"][-1]
    assert prof["title"] == best["rung"] and prof["rung"] == best["key"] and "what 'other' is" in capsys.readouterr().out
    other = next(c for c in prof["classes"] if c["class"] == "other")
    assert sum(o["ms_per_step"] for o in prof["other_ops"]) == pytest.approx(other["ms_per_step"], rel=1e-6)
    (tmp_path / "bad.json").write_text("{}")
    assert profile_main([str(tmp_path / "bad.json"), "--json", str(tmp_path / "q.json")]) == 2
    assert not (tmp_path / "q.json").exists()


def test_the_autoac_rung_builds_on_a_compile_rung_that_compiled_only_some_regions():
    """Rung 4 measures an eager twin of rung 3's config: the twin must drop the region plan
    along with compile (a plan without compile is refused as an ignored option)."""
    by_key = {rung.key: rung for rung in LADDER}
    start = override(TINY.train, jagged=True, kernel="auto", compile=True, compile_regions="interaction",
                     batch_size=16)
    out = by_key["autoac"].configure(start, Context(TINY, torch.device("cpu"), 2))
    assert isinstance(out, str) or (out.compilation.enabled and out.compilation.regions == "interaction"
                                    and out.activation_checkpoint.mode == "auto")


def test_rung_changes_are_the_switches_each_rung_sets():
    """The ladder as code (chapter 10): each row's recorded TrainConfig against the row before."""
    from gemref.train.record import RECORD_VERSION, train_as_record
    from gemref.waterfall.rows import rung_changes

    base = get_preset("tiny").train
    jagged = override(base, jagged=True)
    fused = override(jagged, kernel="auto", batch_size=16)
    rows = [{"rung": "0 baseline", "status": "ran", "vs_previous": 1.0, "config": {"train": train_as_record(base)}},
            {"rung": "1 + jagged", "status": "ran", "vs_previous": 1.5, "config": {"train": train_as_record(jagged)}},
            {"rung": "2 + skipped", "status": "n/a here: no GPU", "vs_previous": None},
            {"rung": "3 + fused", "status": "ran", "vs_previous": 2.0, "config": {"train": train_as_record(fused)}}]
    out = rung_changes(rows, RECORD_VERSION)
    assert [r["changes"] for r in out] == [
        "(the baseline)", "jagged: False -> True", "(n/a here: no GPU: no config recorded)",
        f"batch_size: {base.batch_size} -> 16; kernel: {base.attention.kernel!r} -> 'auto'"]
    assert out[1]["vs_previous"] == "1.50x" and out[2]["vs_previous"].startswith("N/A")


def test_rungs_that_did_not_run_here_show_the_stored_row_labelled():
    from gemref.walkthrough.headline import with_stored_rows

    rows = [{"key": "baseline", "status": "ran", "mfu": 0.1}, {"key": "compile", "status": "skipped here: SKIP"},
            {"key": "fsdp_2d", "status": "n/a here: one rank"}]
    ref = {"record": {"rungs": [{"key": "baseline", "status": "ran", "mfu": 0.2},
                                {"key": "compile", "status": "ran", "mfu": 0.3}]},
           "measured_on": {"date_utc": "2026-12-06 00:41", "device": "AMD EPYC"}}
    out = with_stored_rows(rows, ref)
    assert [(r["mfu"] if "mfu" in r else None, r["source"]) for r in out] == [
        (0.1, "measured here"), (0.3, "stored: 2026-12-06 00:41, AMD EPYC"), (None, "n/a here: one rank")]
    assert [r["source"] for r in with_stored_rows(rows, None)] == ["measured here", "skipped here: SKIP",
                                                                   "n/a here: one rank"]
