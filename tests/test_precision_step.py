"""gemref/measure/precision_step.py and `gemref bench precision_step`: interleaved training
steps per precision. Structure and arithmetic only: no test bounds a time or a speed-up."""
from __future__ import annotations

import json

import pytest

from gemref.cli import main
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.errors import UsageError
from gemref.mfu import timing
from gemref.measure import precision_step
from gemref.measure.precision_step import compare_step_precisions, speedup, speedup_text


def test_speedup_pairs_steps_by_hand():
    """Ratios 2, 1, 4, 3, 2.5 (t_ref / t per pair): median 2.5; p10 and p90 by nearest rank on
    the sorted ratios 1, 2, 2.5, 3, 4 (ranks round(0.4) = 0 and round(3.6) = 4): 1 and 4."""
    ref, var = [2.0, 1.0, 4.0, 3.0, 5.0], [1.0, 1.0, 1.0, 1.0, 2.0]
    median, p10, p90 = speedup(ref, var)
    assert (median, p10, p90) == (2.5, 1.0, 4.0)
    assert speedup_text({"speedup": 2.5, "speedup_p10": 1.4, "speedup_p90": 3.6}) == "2.50x (1.40..3.60)"
    with pytest.raises(ValueError, match="paired steps"):
        speedup([1.0, 2.0], [1.0])


@pytest.mark.parametrize("kwargs, says", [
    ({"precisions": ("fp32",)}, "at least two different precisions"),
    ({"precisions": ("bf16", "bf16")}, "at least two different precisions"),
    ({"seeds": [0]}, "at least two different seeds"),
    ({"seeds": [1, 1]}, "at least two different seeds"),
    ({"steps": 0}, "need steps >= 1"),
])
def test_bad_arguments_are_refused_before_any_work(kwargs, says, monkeypatch):
    monkeypatch.setattr(precision_step, "setup", lambda *a, **k: pytest.fail("built a run"))
    args = {"precisions": ("fp32", "bf16"), "seeds": [0, 1], "steps": 1, "warmup": 0, "eval_batches": 1}
    args.update(kwargs)
    preset = get_preset("tiny")
    with pytest.raises(UsageError, match=says):
        compare_step_precisions(preset, preset.train, args.pop("precisions"), **args)


def test_a_comparison_steps_both_precisions_on_the_same_batches(monkeypatch):
    """Two seeds x (1 warm-up + 2 timed) steps of tiny in fp32 and bf16: every timed step is
    recorded, each round runs both precisions on one batch (the batch ids agree), the
    reference's row has speed-up 1, and the losses are one eval per seed and precision."""
    seen: list[tuple[str, int]] = []
    real = timing.interleaved

    def spy(fns, rounds, **kw):
        wrapped = {name: (lambda k, name=name, fn=fn: (seen.append((name, k)), fn(k))[1]) for name, fn in fns.items()}
        return real(wrapped, rounds, **kw)

    monkeypatch.setattr(precision_step, "interleaved", spy)
    preset = get_preset("tiny")
    train = override(preset.train, jagged=True, kernel="auto", ac="none", eval_every=0)
    result = compare_step_precisions(preset, train, ("fp32", "bf16"), seeds=[0, 1], steps=2, warmup=1,
                                     eval_batches=1)
    assert [r["precision"] for r in result.rows] == ["fp32", "bf16"]
    assert all(len(v) == 4 for v in result.steps_s.values()) and all(len(v) == 2 for v in result.eval_loss.values())
    assert result.rows[0]["speedup"] == 1.0 and result.rows[1]["speedup"] > 0
    assert result.rows[1]["within_band"] in (True, False) and result.rows[0]["within_band"] is None
    # rounds 0, 1, 2 per seed; each round both precisions, the order reversed every other round
    per_seed = [("fp32", 0), ("bf16", 0), ("bf16", 1), ("fp32", 1), ("fp32", 2), ("bf16", 2)]
    assert seen == per_seed * 2


def test_bench_precision_step_cli(tmp_path, capsys):
    path = tmp_path / "steps.json"
    rc = main(["bench", "precision_step", "--preset", "tiny", "--seeds", "2", "--steps-per-seed", "1", "--warmup", "0",
               "--eval-batches", "1", "--ac", "none", "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "bf16 over fp32:" in out and "seed band" in out
    record = json.loads(path.read_text())
    assert record["bench"] == "precision_step" and len(record["widths"]) == 1
    width = record["widths"][0]
    assert width["d_model"] == 32 and width["head_dim"] == 16 and width["reference"] == "fp32"
    assert [r["precision"] for r in width["rows"]] == ["fp32", "bf16"]


def test_bench_precision_step_runs_each_width(tmp_path, capsys):
    """--d-model: the preset at each width, heads kept (tiny: 2 heads), one table each."""
    path = tmp_path / "steps.json"
    rc = main(["bench", "precision_step", "--preset", "tiny", "--d-model", "16", "48", "--seeds", "2",
               "--steps-per-seed", "1", "--warmup", "0", "--eval-batches", "1", "--ac", "none", "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "(d_model 16, head dim 8)" in out and "(d_model 48, head dim 24)" in out
    assert [(w["d_model"], w["head_dim"]) for w in json.loads(path.read_text())["widths"]] == [(16, 8), (48, 24)]


def test_bench_precision_step_refuses_a_width_its_heads_do_not_divide(tmp_path, capsys):
    """Checked for every width before any run: a bad second width fails at once, one line."""
    assert main(["bench", "precision_step", "--preset", "tiny", "--d-model", "32", "33"]) == 2
    err = capsys.readouterr().err
    assert "d_model=33 is not divisible by n_heads=2" in err and "Traceback" not in err


def test_bench_precision_step_refuses_one_seed(capsys):
    assert main(["bench", "precision_step", "--seeds", "1"]) == 2
    assert "--seeds" in capsys.readouterr().err
