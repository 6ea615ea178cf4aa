"""`gemref bench quality` and `gemref waterfall --dataset`: the variants train on the dataset folder
(named in the records), the seed bands are those of gemref/report/seed_band.py's definition
(recomputed here with the statistics module), and bad options are one line, exit 2."""
import math
import statistics

import pytest

from gemref.measure.quality import METRICS, band_rows, variant_quality, variant_run
from gemref.cli import main
from gemref.train.presets import get_preset, dataset_preset
from gemref.train.override import override
from gemref.data.shards import generate_dataset
from gemref.waterfall import LADDER, run_waterfall

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality") / "ds"
    generate_dataset(TINY.model, override(TINY.data, n_train=512, n_eval=300, shard_rows=512), out)
    return out


def test_the_bands_are_k_standard_errors_of_the_difference_of_means():
    runs = [{"variant": v, "seed": s, **{m: x + 0.01 * i for i, m in enumerate(METRICS)}}
            for v, xs in (("fast", [0.80, 0.82, 0.84]), ("window", [0.85, 0.86, 0.90])) for s, x in enumerate(xs)]
    rows = {r["variant"]: r for r in band_rows(runs, k=3.0)}
    fast, window = [0.80, 0.82, 0.84], [0.85, 0.86, 0.90]
    sd = statistics.stdev(fast)
    tolerance = 3.0 * sd * math.sqrt(1 / 3 + 1 / 3)
    assert rows["fast"]["ne_click"] == pytest.approx(0.82) and rows["fast"]["ne_click_sd"] == pytest.approx(sd)
    assert rows["window"]["ne_click_diff"] == pytest.approx(statistics.mean(window) - 0.82)
    assert rows["window"]["ne_click_tol"] == pytest.approx(tolerance)
    assert rows["window"]["ne_click_within"] == (abs(statistics.mean(window) - 0.82) <= tolerance)
    assert rows["fast"]["ne_click_diff"] is None


def test_each_variant_changes_what_it_names(folder):
    preset = dataset_preset("tiny", folder)
    assert variant_run(preset, "baseline")[1] == {"jagged": False, "kernel": "reference"}
    assert variant_run(preset, "mxfp8")[1]["precision"] == "mxfp8"
    assert variant_run(preset, "compressed")[1]["ac_compress"] == "mxfp8"
    windowed, changes = variant_run(preset, "window")
    assert windowed.model.window == preset.model.max_len // 8 and changes["jagged"]
    assert variant_run(preset, "fast") == (preset, {"jagged": True, "kernel": "auto"})


def test_quality_runs_every_variant_on_the_whole_eval_split_of_the_folder(folder):
    result = variant_quality(dataset_preset("tiny", folder), ("fast", "window"), seeds=2, steps=2, log=lambda s: None)
    assert [(r["variant"], r["seed"]) for r in result["runs"]] == [("fast", 0), ("window", 0), ("fast", 1), ("window", 1)]
    assert all(r["eval_samples"] == 300 for r in result["runs"])
    assert result["data"]["folder"] == str(folder.resolve()) and result["labels"] == {"click": "click",
                                                                                      "conversion": "conversion"}
    names = [b["variant"] for b in result["baselines"]]
    assert names == ["train base rate", "candidate rate", "logistic u+i"]
    assert result["baselines"][0]["auc_click"] == 0.5 and 0 < result["baselines"][2]["ne_click"] < 2
    assert result["measured_on"]["device"] and result["measured_on"]["date_utc"]


@pytest.mark.parametrize("args, message", [
    (["--variants", "fast,turbo"], "unknown ['turbo']"),
    (["--variants", "window"], "fast included"),
    (["--seeds", "1"], "expected an integer >= 2"),
])
def test_bad_quality_options_are_one_line(folder, capsys, args, message):
    code = main(["bench", "quality", "--dataset", str(folder), "--preset", "tiny", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_quality_needs_a_dataset(capsys):
    assert main(["bench", "quality"]) == 2
    assert "--dataset DIR is required" in capsys.readouterr().err


def test_the_waterfall_trains_on_the_dataset_and_names_it(folder, tmp_path):
    by_key = {rung.key: rung for rung in LADDER}
    preset = dataset_preset("tiny", folder)
    record = run_waterfall(preset, device="cpu", windows=3, steps_per_window=1, warmup=1, max_retries=0,
                           profile_steps=0, measure_memory=False, ladder=[by_key["baseline"], by_key["jagged"]],
                           log=lambda s: None)
    assert record["data"]["folder"] == str(folder.resolve())
    assert record["data"]["manifest_sha256"] == preset.data.manifest_sha256
    assert [r["status"] for r in record["rungs"]] == ["ran", "ran"]
    assert record["rungs"][0]["config"]["model"]["item_vocab"] == preset.data.item_vocab
