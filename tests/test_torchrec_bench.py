"""`gemref bench embeddings` and gemref/measure/table_engines.py: how rows are summarised, and one short
run on 2 gloo ranks that writes a record naming the plan and bytes for every rank."""
from __future__ import annotations

import json

import pytest

from gemref.measure.table_engines import summarize
from gemref.cli import main


def test_summary_takes_the_slowest_rank_per_window_and_pairs_windows():
    def rank(native, trec, nbytes):
        entry = {"table_bytes": nbytes, "table_optimizer_bytes": 2 * nbytes, "comm_bytes_per_step": 10.0}
        return {"step_s": {"native": native, "torchrec": trec}, "native": entry, "torchrec": entry}

    rows = summarize([rank([0.010, 0.030, 0.020], [0.020, 0.030, 0.010], 4),
                      rank([0.020, 0.010, 0.010], [0.010, 0.060, 0.030], 6)])
    native, trec = rows
    assert native["step_ms"] == pytest.approx(20.0) and native["vs_native"] == 1.0   # slowest: 20, 30, 20 ms
    assert trec["step_ms"] == pytest.approx(30.0)                                    # slowest: 20, 60, 30 ms
    assert trec["vs_native"] == pytest.approx(1.5)                                   # ratios 1, 2, 1.5
    assert trec["table_bytes_per_rank"] == [4, 6] and trec["table_opt_bytes_per_rank"] == [8, 12]


@pytest.mark.multiproc
def test_bench_embeddings_runs_on_two_ranks_and_records_the_plan(tmp_path, capsys):
    pytest.importorskip("torchrec", reason="TorchRec is not installed (requirements-nodeps.txt)")
    out = tmp_path / "bench.json"
    assert main(["bench", "embeddings", "--windows", "1", "--steps-per-window", "1", "--per-rank-batch", "8",
                 "--sharding", "row_wise", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["variant"] for r in record["rows"]] == ["native", "torchrec"]
    for row in record["rows"]:
        assert row["step_ms"] > 0 and len(row["table_bytes_per_rank"]) == 2 and min(row["comm_bytes_per_rank"]) > 0
    assert {v["sharding"] for v in record["plan"].values()} == {"row_wise"}
    native, trec = record["rows"]
    assert sum(trec["table_bytes_per_rank"]) == native["table_bytes_per_rank"][0]   # row-wise: each row once
    assert "TorchRec plan (row_wise)" in capsys.readouterr().out


def test_bench_embeddings_refuses_an_unknown_sharding_in_one_line(capsys):
    assert main(["bench", "embeddings", "--sharding", "diagonal"]) == 2
    assert "--sharding 'diagonal'" in capsys.readouterr().err


def test_summary_pairs_each_variant_with_its_own_baseline():
    def rank(times):
        entry = {"table_bytes": 1, "table_optimizer_bytes": 1, "comm_bytes_per_step": 0.0}
        return {"step_s": times, **{label: entry for label in times}}

    rows = summarize([rank({"a": [0.010, 0.020], "b": [0.020, 0.010], "t": [0.005, 0.030]}),
                      rank({"a": [0.030, 0.010], "b": [0.010, 0.040], "t": [0.010, 0.010]})],
                     ["a", "b", "t"], {"a": "a", "b": "b", "t": "b"})
    a, b, t = rows                                   # slowest ranks: a 30, 20 ms; b 20, 40 ms; t 10, 30 ms
    assert (a["step_ms_min"], a["step_ms_max"]) == pytest.approx((20.0, 30.0)) and a["vs_native"] == 1.0
    assert t["step_ms"] == pytest.approx(20.0)        # median of 10 and 30
    assert (t["vs_min"], t["vs_max"]) == pytest.approx((0.5, 0.75))     # 10/20 and 30/40, against b, not a
    assert t["vs_native"] == pytest.approx(0.625)


# the tiny preset's tables (rows, dim): what the hand counts below are made of
TINY_TABLES = {"item": (2000, 32), "action": (4, 32), "time_gap": (16, 32), "position": (64, 32),
               "sparse_0": (50, 32), "sparse_1": (200, 32), "sparse_2": (1000, 32), "sparse_3": (100, 32)}


@pytest.mark.multiproc
def test_compare_sharded_weighs_both_engines_by_hand_counts():
    pytest.importorskip("torchrec", reason="TorchRec is not installed (requirements-nodeps.txt)")
    from gemref.measure.table_engines import compare_sharded
    from gemref.train.presets import get_preset
    from gemref.parallel.volume import table_shapes

    assert table_shapes(get_preset("tiny").model) == TINY_TABLES
    result = compare_sharded("tiny", 2, per_rank_batch=4, windows=1)
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == ["native row", "TorchRec row_wise", "native table", "TorchRec table_wise", "TorchRec planner"]
    # row-wise over 2 ranks: ceil(V/2) rows of each table per rank,
    # 1000 + 2 + 8 + 32 + 25 + 100 + 500 + 50 = 1717 rows x 32 x 4 B
    for variant in ("native row", "TorchRec row_wise"):
        assert rows[variant]["table_bytes_per_rank"] == [219_776, 219_776], variant
    # every row of every table once over the ranks: 3434 rows x 128 B, whoever places them
    for r in rows.values():
        assert sum(r["table_bytes_per_rank"]) == 439_552, r["variant"]
    # gemref's table-wise plan: item (2000 rows) on rank 0, the other seven (1434 rows) on rank 1
    assert rows["native table"]["table_bytes_per_rank"] == [256_000, 183_552]
    for r in rows.values():      # AdamW: 2 fp32 moments per weight; TorchRec's exact Adagrad: 1 sum
        factor = 2 if r["engine"] == "native" else 1
        assert r["table_opt_bytes_per_rank"] == [factor * b for b in r["table_bytes_per_rank"]], r["variant"]
        assert r["step_ms"] > 0 and r["windows"] == 1 and r["baseline"].startswith("native")
    assert sorted(result["plan"]) == sorted(f"{'ec' if n in ('item', 'action', 'time_gap', 'position') else 'ebc'}.{n}"
                                            for n in TINY_TABLES)
    assert "CUDA" in result["dmp_collection_cpu"]


def test_compare_sharded_refuses_one_rank_before_starting_any():
    from gemref.measure.table_engines import compare_sharded
    from gemref.errors import UsageError

    with pytest.raises(UsageError, match="ranks >= 2"):
        compare_sharded("tiny", 1)
