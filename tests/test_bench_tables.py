"""`gemref bench tables`: its variants, a tiny run end to end against hand arithmetic, its errors."""
from __future__ import annotations

import json

import pytest

from gemref.cli import main
from gemref.train.presets import get_preset
from gemref.errors import UsageError
from gemref.measure.table_sync import reference, variants
from gemref.parallel.volume import table_shapes


def test_every_table_optimizer_is_a_variant_at_every_interval():
    runs = variants((1, 10))
    assert runs == [("adamw (summed)", "adamw", 1), ("rowwise_adagrad every 1", "rowwise_adagrad", 1),
                    ("rowwise_adagrad every 10", "rowwise_adagrad", 10), ("rowwise_adam every 1", "rowwise_adam", 1),
                    ("rowwise_adam every 10", "rowwise_adam", 10)]
    assert reference(runs) == "rowwise_adagrad every 1"
    only_adam = variants((5,), ("rowwise_adam",))
    assert only_adam == [("rowwise_adam every 5", "rowwise_adam", 5)] and reference(only_adam) == "rowwise_adam every 5"
    assert reference(variants((1,), ("adamw",))) == "adamw (summed)"
    for bad in ((), ("adagrad",)):
        with pytest.raises(UsageError, match="pick one or more of adamw, rowwise_adagrad, rowwise_adam"):
            variants((1,), bad)


def test_bench_tables_tiny_run_syncs_each_optimizers_row_state(tmp_path, capsys, data_root):
    """Per sync the replicas all-reduce their held rows' weights and state: (d + 1) values per row for
    row-wise Adagrad, (2d + 1) for row-wise Adam; AdamW tables their gradient rows (d) every step."""
    path = tmp_path / "tables.json"
    assert main(["bench", "tables", "--mesh", "2x1", "--intervals", "1", "--seeds", "2", "--steps-per-run", "2",
                  "--window", "2", "--eval-batches", "1", "--table-lr", "0.05", "--jagged", "--kernel", "cpu_jagged",
                  "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "table_lr 0.05, attention jagged/cpu_jagged; seed band vs rowwise_adagrad every 1" in captured.out
    assert "run 1/6: adamw (summed), seed 0: eval loss" in captured.err     # rank 0's progress, one line a run
    assert "run 6/6: rowwise_adam every 1, seed 1: eval loss" in captured.err
    record = json.loads(path.read_text())
    rows = {r["variant"]: r for r in record["rows"]}
    assert list(rows) == ["adamw (summed)", "rowwise_adagrad every 1", "rowwise_adam every 1"]
    assert {(r["label"], r["seed"]) for r in record["runs"]} == {(v, s) for v in rows for s in (0, 1)}
    assert {(r["jagged"], r["kernel"]) for r in record["runs"]} == {(True, "cpu_jagged")}    # what the ranks ran
    cfg = get_preset("tiny").model
    d, held_rows = cfg.d_model, sum(n for n, _ in table_shapes(cfg).values())   # S = 1: every row of every table
    assert rows["rowwise_adagrad every 1"]["table_sync_bytes"] == held_rows * (d + 1) * 4
    assert rows["rowwise_adam every 1"]["table_sync_bytes"] == held_rows * (2 * d + 1) * 4
    assert rows["adamw (summed)"]["table_sync_bytes"] == held_rows * d * 4
    assert all(r["eval_loss"] > 0 for r in rows.values())


@pytest.mark.parametrize("argv, message", [
    (["--optimizers", "adamw,sgd"], "table optimizers ['adamw', 'sgd']: pick one or more of"),
    (["--table-lr", "0"], "--table-lr: expected a number > 0"),
    (["--mesh", "1x2"], "the replica sync needs R >= 2"),
    (["--intervals", "3"], "must be multiples of every interval [3]"),
    (["--kernel", "cpu_fused"], "kernel='cpu_fused' runs on the jagged layout: add jagged (--jagged)"),
])
def test_bench_tables_user_errors_exit_2(argv, message, capsys):
    assert main(["bench", "tables", "--intervals", "1", "--steps-per-run", "10", "--window", "10", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2
