"""`gemref bench window`: a tiny run end to end, its record against hand arithmetic, its errors."""
from __future__ import annotations

import json

import pytest

from gemref.cli import main


def causal_window_pairs(L, W):
    """By hand: row i of a causal window W sees min(i + 1, W) keys."""
    return sum(min(i + 1, W) for i in range(L))


def test_bench_window_tiny_run_writes_its_record(tmp_path, capsys):
    path = tmp_path / "window.json"
    assert main(["bench", "window", "--lengths", "24", "48", "--window", "8", "--batch", "2", "--heads", "2",
                  "--head-dim", "4", "--reps", "2", "--warmup", "0", "--threads", "1", "--quality-seeds", "0",
                  "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "full vs window 8" in out and "cpu_over_wall" in out
    record = json.loads(path.read_text())
    assert record["bench"] == "window" and record["threads"] == 1 and record["quality"] is None
    rows = {(r["history_len"], r["variant"]): r for r in record["attention"]}
    assert set(rows) == {(24, "full"), (24, "window"), (48, "full"), (48, "window")}
    H, D, B = 2, 4, 2
    for L in (24, 48):
        full, win = rows[(L, "full")], rows[(L, "window")]
        # forward + backward = 3 x (QK^T and PV: 2 matmuls x 2*H*D FLOPs per allowed pair)
        assert full["model_flops"] == 3 * 4 * H * D * B * L * (L + 1) // 2
        assert win["model_flops"] == 3 * 4 * H * D * B * causal_window_pairs(L, 8)
        assert win["flops_vs_full"] == pytest.approx(causal_window_pairs(L, 8) / (L * (L + 1) / 2))
        # the kernel skips out-of-window tiles once the history spans several of them
        assert win["executed_flops"] < full["executed_flops"] if L == 48 else win["executed_flops"] <= full["executed_flops"]
        for r in (full, win):
            assert r["executed_flops"] >= r["model_flops"]
            assert r["wall_ms"] > 0 and r["cpu_ms"] >= 0 and r["peak_mib"] > 0 and r["speedup"] > 0
        assert full["speedup"] == 1.0


def test_bench_window_quality_with_one_seed_says_there_is_no_band(tmp_path, capsys, data_root):
    path = tmp_path / "window.json"
    assert main(["bench", "window", "--lengths", "16", "--window", "4", "--head-dim", "4", "--reps", "1",
                  "--warmup", "0", "--threads", "1", "--quality-seeds", "1", "--quality-steps", "2",
                  "--quality-window", "4", "--json", str(path)]) == 0
    assert "one seed per variant: no seed band" in capsys.readouterr().out
    quality = json.loads(path.read_text())["quality"]
    assert {(r["seed"], r["variant"]) for r in quality["runs"]} == {(0, "full"), (0, "window")}
    runs = {r["variant"]: r for r in quality["runs"]}
    for s in quality["summary"]:
        assert s["full_seed_band"] is None and s["within_band"] is None
        assert s["mean_difference"] == pytest.approx(runs["window"][s["metric"]] - runs["full"][s["metric"]])
    assert all(0 <= runs[v]["auc_click"] <= 1 and runs[v]["ne_click"] > 0 for v in runs)


@pytest.mark.parametrize("argv, message", [
    (["--window", "0"], "--window: expected an integer >= 1"),
    (["--lengths", "0"], "--lengths: expected an integer >= 1"),
    (["--kernel", "nope"], "--kernel 'nope': valid:"),
    (["--quality-window", "64"], "--quality-window 64 >= the tiny preset's max_len 64"),
    (["--quality-seeds", "-1"], "--quality-seeds: expected an integer >= 0"),
])
def test_bench_window_user_errors_exit_2(argv, message, capsys):
    assert main(["bench", "window", "--lengths", "16", "--reps", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2


def test_bench_window_json_path_is_checked_before_any_work(tmp_path, capsys):
    assert main(["bench", "window", "--lengths", "16", "--json", str(tmp_path)]) == 2
    assert "window" not in capsys.readouterr().out


def _row(L, variant, flops, executed, wall, speedup, window=16):
    return {"history_len": L, "variant": variant, "window": None if variant == "full" else window,
            "model_flops": flops, "executed_flops": executed, "flops_vs_full": None, "wall_ms": wall,
            "cpu_over_wall": 0.9, "peak_mib": 2.0, "speedup": speedup}


def test_takeaway_reads_the_numbers_it_is_given():
    from gemref.mfu.attention_cost import window_takeaway

    rows = [_row(16, "full", 100, 120, 1.0, 1.0), _row(16, "window", 100, 120, 1.0, 1.0),
            _row(64, "full", 1600, 2000, 8.0, 1.0), _row(64, "window", 400, 500, 2.0, 4.0)]
    rows[3]["flops_vs_full"] = 0.25
    quality = {"window": 8, "seeds": 3, "summary": [
        {"metric": "ne_click", "full_mean": 0.9, "window_mean": 0.95, "mean_difference": 0.05,
         "full_seed_band": 0.01, "within_band": False},
        {"metric": "auc_click", "full_mean": 0.7, "window_mean": 0.7, "mean_difference": 0.0,
         "full_seed_band": None, "within_band": None}]}
    text = "\n".join(window_takeaway(rows, quality))
    assert "computes 25.0% of full" in text and "executes 25.0% of its" in text and "4.00x faster" in text
    assert "FLOPs grew 16.0x, the window's 4.0x" in text and "(here L = 16)" in text
    assert "(+0.0500), outside the full runs' seed band 0.0100 over 3 seeds" in text
    assert "auc_click: 0.7000 full vs 0.7000" in text and "no seed band" in text
    assert "executed MORE" not in text
    rows[1]["executed_flops"] = 130          # a history a few windows long: the band tiles cost more
    assert "At L = 16 the windowed kernel executed MORE FLOPs" in "\n".join(window_takeaway(rows))


def test_window_figure_has_one_line_per_variant_in_each_panel():
    from gemref.report.figures import window_figure

    rows = [{"history_len": L, "variant": v, "model_gflop": g, "wall_ms": 1.0 + g, "peak_mib": 2.0}
            for L, g in ((64, 1.0), (128, 4.0)) for v in ("full", "window")]
    fig = window_figure(rows)
    assert len(fig.data) == 6 and {t.name for t in fig.data} == {"full", "window"}
    full_flops = next(t for t in fig.data if t.name == "full" and t.xaxis == "x")
    assert list(full_flops.x) == [64, 128] and list(full_flops.y) == [1.0, 4.0]
    assert sum(t.showlegend for t in fig.data) == 2 and fig.layout.xaxis.type == "log"
