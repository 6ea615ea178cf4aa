"""The waterfall's records are internally consistent; n/a rungs are kept, with their reason."""
import pytest

from gemref.config import get_preset
from gemref.waterfall import LADDER, Rung, run_waterfall

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def rows(tmp_path_factory, data_root):
    by_key = {rung.key: rung for rung in LADDER}
    ladder = [by_key["baseline"], by_key["jagged"],
              Rung("never", "x + nothing", lambda t, c: "n/a here: a test rung that never applies"),
              by_key["fused_attention"], by_key["autoac"]]
    out = tmp_path_factory.mktemp("wf")
    return run_waterfall(TINY, device="cpu", repeats=3, steps=2, warmup=1, ladder=ladder, out_dir=out,
                         log=lambda s: None), out


def test_rungs_do_the_same_model_work(rows):
    ran = [r for r in rows[0] if r["status"] == "ran"]
    assert [r["key"] for r in ran] == ["baseline", "jagged", "fused_attention", "autoac"]
    flops = {round(r["model_flops_per_sample"]) for r in ran[:3]}
    assert len(flops) == 1, flops
    # AutoAC spends the freed memory on a larger batch: more FLOPs per step, not per sample.
    assert ran[3]["batch_size"] > ran[2]["batch_size"]
    assert ran[3]["model_flops_per_sample"] == pytest.approx(ran[2]["model_flops_per_sample"], rel=0.2)


def test_mfu_is_flops_over_time_over_peak(rows):
    import json
    for r in rows[0]:
        if r["status"] != "ran":
            continue
        record = json.loads((rows[1] / f"rung{rows[0].index(r)}_{r['key']}.json").read_text())
        assert record["mfu"] == pytest.approx(record["model_tflops_per_s"] * 1e12 / record["peak_flops"])
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]


def test_na_rung_is_kept_with_its_reason_and_skipped(rows):
    na = rows[0][2]
    assert na["status"] == "n/a here: a test rung that never applies"
    assert rows[0][3]["switches"]["jagged"] is True          # the next rung builds on rung 1
    assert rows[0][1]["vs_baseline"] == pytest.approx(rows[0][1]["tokens_per_s"] / rows[0][0]["tokens_per_s"])
    assert (rows[1] / "waterfall.json").exists()


def test_waterfall_json_says_where_and_when_it_was_measured(rows):
    import json
    on = json.loads((rows[1] / "waterfall.json").read_text())["measured_on"]
    assert on["date_utc"][:2] == "20" and on["device"] and on["cpu_count"] >= 1 and on["ranks"] == 1
    assert on["torch"].startswith("2.") and on["gemref"]



def test_low_precision_rung_is_na_on_cpu():
    import torch
    from gemref.waterfall import Context, _low_precision
    why = _low_precision(TINY.train, Context(TINY, torch.device("cpu"), 1))
    assert isinstance(why, str) and why.startswith("n/a here") and "SM89" in why


def test_bad_settings():
    with pytest.raises(ValueError, match="repeats must be >= 3"):
        run_waterfall(TINY, repeats=2)
    with pytest.raises(ValueError, match="need steps >= 1"):
        run_waterfall(TINY, steps=0)
