"""`gemref bench embeddings` (gemref/bench/embeddings.py): how rows are summarised, and one short
run on 2 gloo ranks that writes a record naming the plan and bytes for every rank."""
from __future__ import annotations

import json

import pytest

from gemref.bench.embeddings import summarize
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
